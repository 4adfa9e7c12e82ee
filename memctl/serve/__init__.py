"""Answering with memories (`memctl ask`, `memctl chat`, the Python API `memctl.Memories`): route a
context, fetch only its path's blocks from the block store, attach them, generate; retrieval.

Owns: the block store, bank sessions, the public API, chat, RAG.
May import: memctl.core, memctl.registry, memctl.model, memctl.build.
"""
