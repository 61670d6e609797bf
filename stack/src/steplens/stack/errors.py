"""The one error type of the stack: a message that tells the user what to do."""

from __future__ import annotations


class StackError(RuntimeError):
    """Raised with a complete, user-facing message; the CLI prints it without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
