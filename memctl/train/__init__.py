"""Training memory blocks (`memctl train`, `memctl merge`): prompts about each window and their
open-book teacher (cloze, anchor-written questions, self-study), batches and losses, the unit
loop with its optimizer, checkpoints and early stopping, coverage, and distributed training.

Owns: everything that writes a block's weights.
May import: memctl.core, memctl.registry, memctl.model, memctl.build.
"""
