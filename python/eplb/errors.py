"""Exceptions of the eplb package.

Contract: every bad input and every failure inside eplb raises an
`eplb.Error`, a `ValueError`, whose message is the C++ library's message
(what was wrong, where: layer, slot, expert, value) and whose `code` is the
library's status code name ("invalid argument", "mismatch", "I/O error",
"parse error", "unsupported", ...). Later areas (migration) add subclasses
of Error here, so `except eplb.Error` keeps catching everything.
"""

__all__ = ["Error"]


class Error(ValueError):
    """An eplb failure: a bad input or a failed operation.

    Attributes:
        code: the library's status code name, e.g. "invalid argument".
    """

    def __init__(self, message: str, code: str = "invalid argument"):
        super().__init__(message)
        self.code = code


def _from_status(code: str, message: str) -> Error:
    """The exception for a failed C++ Status (called by eplb._eplb)."""
    return Error(message, code)
