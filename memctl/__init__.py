"""memctl: hierarchical parametric memories for a frozen small language model."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Memories", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: `import memctl` stays cheap for the CLI
    if name == "Memories":
        from .serve.api import Memories

        return Memories
    raise AttributeError(f"module 'memctl' has no attribute {name!r}")
