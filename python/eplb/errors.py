"""Exceptions of the eplb package.

Contract: every bad input and every failure inside eplb raises an
`eplb.Error`, a `ValueError`, whose message is the C++ library's message
(what was wrong, where: layer, slot, expert, value) and whose `code` is the
library's status code name ("invalid argument", "mismatch", "I/O error",
"parse error", "unsupported", ...). Later areas (migration) add subclasses
of Error here, so `except eplb.Error` keeps catching everything: LayoutError
(the ranks' tensors differ), MigrationError and its subclasses TimeoutError
and PeerLostError (a migration round stopped).
"""

__all__ = ["Error"]


class Error(ValueError):
    """An eplb failure: a bad input or a failed operation.

    Attributes:
        code: the library's status code name, e.g. "invalid argument".
        peer: the rank of the process group the failure is about (lost, silent, voted no), or None.
    """

    def __init__(self, message: str, code: str = "invalid argument", *, peer=None):
        super().__init__(message)
        self.code = code
        self.peer = peer


def _from_status(code: str, message: str, peer=None) -> Error:
    """The exception for a failed C++ Status (called by eplb._eplb)."""
    return Error(message, code, peer=peer)


class LayoutError(Error):
    """The ranks' expert tensors do not have the same layout (or one rank's cannot be migrated).

    Raised on every rank by eplb.Migrator before anything moves; the message names the rank,
    layer, tensor and both sizes.
    """

    def __init__(self, message: str, code: str = "mismatch", *, peer=None):
        super().__init__(message, code, peer=peer)


class MigrationError(Error):
    """A migration round stopped. Every layer is wholly old or wholly new on every rank.

    Attributes (None when unknown):
        layer: the layer the round stopped at.
        rank: this rank.
        peer: the rank the failure names (the one that timed out, was lost or voted no).
        operation: what the engine was doing ("publishing checksums", "voting on attempt 3", ...).
        state: in words, which layers are on the old and the new placement.
        elapsed_s: seconds from the start of the round to the failure.
        committed_layers: layers on the new placement after this round (on every rank).
    """

    def __init__(self, message: str, code: str = "aborted", *, layer=None, rank=None, peer=None, operation=None,
                 state=None, elapsed_s=None, committed_layers=()):
        super().__init__(message, code, peer=peer)
        self.layer = layer
        self.rank = rank
        self.operation = operation
        self.state = state
        self.elapsed_s = elapsed_s
        self.committed_layers = list(committed_layers)


class TimeoutError(MigrationError):  # noqa: A001  (eplb.TimeoutError, as the issue names it)
    """A deadline passed: a transfer, or a collective a rank did not answer in time."""


class PeerLostError(MigrationError):
    """A rank vanished (its process died or its connections closed) during the round."""


__all__ += ["LayoutError", "MigrationError", "TimeoutError", "PeerLostError"]
