"""memctl: hierarchical parametric memories for a frozen small language model."""

__version__ = "0.1.0"
