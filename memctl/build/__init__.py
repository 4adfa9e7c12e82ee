"""Building a bank (`memctl ingest`): read documents, cut them into windows, embed them, cluster
them into the tree, register them, and route contexts to paths of the tree.

Owns: corpus readers, windowing, embedders, ingest (batch and streamed), routing, node labels.
May import: memctl.core, memctl.registry, memctl.model.
"""
