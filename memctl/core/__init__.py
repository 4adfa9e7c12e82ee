"""Shared foundations every stage reads: errors, configuration, device placement, the cluster tree's
numeric code, the relevance gate's arithmetic, and how probe answers are scored.

Owns: pure code and plain data; no SQL, no files of a bank, no model.
May import: nothing else in memctl.
"""
