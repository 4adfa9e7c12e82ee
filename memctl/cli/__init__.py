"""memctl command line: parse, call one library function, render with rich.

Library errors become one line on stderr and a non-zero exit, never a traceback
(set MEMCTL_DEBUG=1 to see one for an unexpected error). One module per group of commands.
"""

from __future__ import annotations

import sys

from . import answer, browse, build, describe, doctor, evaluate, privacy, reprompt, scale  # noqa: F401  (importing registers the commands)
from .common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
