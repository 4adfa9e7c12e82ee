"""The frozen anchor and the memories attached to it: loading the anchor (GGUF, offline), the
FFN-memory math of a block, prefix caching, and greedy generation with fetched blocks.

Owns: torch and transformers code that knows no bank.
May import: memctl.core.
"""
