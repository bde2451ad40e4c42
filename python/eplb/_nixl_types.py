"""The types of NIXL's Python API (nixl 1.5.1's names), as eplb.nixl returns and raises them.

Contract: nixlRegDList / nixlXferDList are descriptor lists of one memory type (NIXL's methods
descCount, getType, isEmpty, index, addDesc, remDesc, clear; a list of (address, length, device)
tuples underneath); nixl_prepped_dlist_handle and nixl_xfer_handle are handles with NIXL's
`release()` (idempotent; also attempted when the handle is garbage-collected); the nixl*Error
classes carry NIXL's names and are eplb.Error subclasses (so ValueError too), each with eplb's
message naming what failed. `error_for(failure)` maps an eplb.Error to the NIXL-named class of its
code. Nothing here talks to the transfer agent except through the handle's owner.
"""
from __future__ import annotations

import time
from enum import Enum

from eplb.errors import Error

DEFAULT_COMM_PORT = 8888  # nixl 1.5.1's nixlBind.DEFAULT_COMM_PORT


class nixl_mem_t(Enum):  # noqa: N801  (NIXL's name)
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


class nixl_thread_sync_t(Enum):  # noqa: N801
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class _DList(list):
    """(address, length, device) tuples of one memory type."""

    def __init__(self, mem_type: nixl_mem_t = nixl_mem_t.DRAM_SEG, descs=()):
        super().__init__(tuple(int(x) for x in d[:3]) for d in descs)
        self.mem_type = mem_type

    def descCount(self) -> int:  # noqa: N802
        return len(self)

    def getType(self) -> nixl_mem_t:  # noqa: N802
        return self.mem_type

    def isEmpty(self) -> bool:  # noqa: N802
        return not self

    def addDesc(self, desc) -> None:  # noqa: N802
        self.append(tuple(int(x) for x in desc[:3]))

    def remDesc(self, index: int) -> None:  # noqa: N802
        del self[index]


class nixlRegDList(_DList):  # noqa: N801
    """A registration descriptor list (register_memory, deregister_memory)."""


class nixlXferDList(_DList):  # noqa: N801
    """A transfer descriptor list (prep_xfer_dlist)."""


class nixl_prepped_dlist_handle:  # noqa: N801
    """A prepared descriptor list: `_handle` is the transfer agent's list id."""

    __slots__ = ("_handle", "_agent", "_released", "peer", "descs")

    def __init__(self, agent, value: int, peer: str, descs: list):
        self._handle, self._agent, self._released = int(value), agent, False
        self.peer, self.descs = peer, descs

    def __repr__(self) -> str:
        return f"nixl_prepped_dlist_handle(0x{self._handle:x}, released={self._released})"

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._agent._release_list(self._handle)

    def __del__(self):
        try:
            self.release()
        except Exception:  # best effort, as NIXL's: the agent may be gone
            pass


class nixl_xfer_handle:  # noqa: N801
    """A transfer request: its id, what it moves, its deadline, its state and failure."""

    __slots__ = ("_handle", "_agent", "_released", "args", "op", "peer", "count", "nbytes", "deadline",
                 "posted_at", "state", "failure", "notif")

    def __init__(self, agent, value: int, args: tuple, peer: str, count: int, nbytes: int, deadline, notif: bytes):
        self._handle, self._agent, self._released = int(value), agent, False
        self.args, self.op, self.peer = args, args[0], peer
        self.count, self.nbytes, self.deadline, self.notif = count, nbytes, deadline, notif
        self.posted_at, self.state, self.failure = None, "INIT", ""

    def __repr__(self) -> str:
        return f"nixl_xfer_handle(0x{self._handle:x}, released={self._released})"

    def elapsed(self) -> float:
        return time.monotonic() - self.posted_at if self.posted_at is not None else 0.0

    def describe(self) -> str:
        direction = "from" if self.op == "READ" else "to"
        return f"{self.op} of {self.count} descriptor(s) ({self.nbytes} B) {direction} agent {self.peer}"

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.state = "RELEASED"
            self._agent._release_request(self)

    def __del__(self):
        try:
            self.release()
        except Exception:  # best effort, as NIXL's
            pass


class nixlInvalidParamError(Error):  # noqa: N801,N818  (NIXL's names)
    pass


class nixlNotFoundError(Error):  # noqa: N801,N818
    pass


class nixlNotPostedError(Error):  # noqa: N801,N818
    pass


class nixlNotAllowedError(Error):  # noqa: N801,N818
    pass


class nixlMismatchError(Error):  # noqa: N801,N818
    pass


class nixlBackendError(Error):  # noqa: N801,N818
    pass


class nixlRemoteDisconnectError(Error):  # noqa: N801,N818
    pass


class nixlCancelledError(Error):  # noqa: N801,N818
    pass


class nixlNotSupportedError(Error):  # noqa: N801,N818
    pass


class nixlUnknownError(Error):  # noqa: N801,N818
    pass


_BY_CODE = {"invalid argument": nixlInvalidParamError, "not found": nixlNotFoundError,
            "mismatch": nixlMismatchError, "not allowed": nixlNotAllowedError, "backend error": nixlBackendError,
            "remote disconnect": nixlRemoteDisconnectError, "canceled": nixlCancelledError,
            "unsupported": nixlNotSupportedError}


def error_for(failure: Error) -> Error:
    """The NIXL-named eplb.Error for an eplb.Error, same message and code."""
    if type(failure) is not Error:
        return failure
    return _BY_CODE.get(failure.code, nixlUnknownError)(str(failure), failure.code)
