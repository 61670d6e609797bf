"""`python -m steplens.stack.cli` as before: the `steplens` command now lives in the producer
(``steplens.schema.command``), so every part has it without the stack."""

from __future__ import annotations

import sys

from steplens.schema.command import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
