"""Issue 29 item 7: crafted agent metadata given to `eplb.nixl` `add_remote_agent` (no job secret,
so nothing is sealed): well framed, a valid checksum, and garbage in the connection blob (the UCX
worker address) is an `eplb.Error` naming the peer and what is wrong, not a crash inside UCX; the
real metadata still loads afterwards. The checks themselves: src/xfer/ucx_address.cpp, tested with
random mutations fed to UCX in tests/xfer/worker_address_test.cpp.
"""
import struct

import numpy as np
import pytest

import eplb
from eplb import _eplb
from eplb.nixl import nixl_agent, nixl_agent_config


CMA_TRAILER = 4 + 4 + 4 + 8 + 36  # src/xfer/cma_backend.cpp


def frame(metadata: bytes) -> dict:
    """Offsets of the fields of eplb's metadata format (src/xfer/metadata.h)."""
    at = 12  # magic, version, flags, total length
    name_length = struct.unpack_from("<H", metadata, at)[0]
    name_at = at + 2
    at = name_at + name_length
    at += 2 + struct.unpack_from("<H", metadata, at)[0]  # backend name
    info_length = struct.unpack_from("<I", metadata, at)[0]
    return {"name": (name_at, name_length), "info": (at + 4, info_length)}


def reseal(body: bytearray) -> bytes:
    """The body with its XXH3-64 checksum (the last 8 bytes) recomputed over every byte before it."""
    data = np.frombuffer(bytes(body[:-8]), dtype=np.uint8)
    struct.pack_into("<Q", body, len(body) - 8, _eplb.checksum(data.ctypes.data, data.nbytes))
    return bytes(body)


@pytest.fixture
def agents(monkeypatch):
    monkeypatch.delenv("EPLB_RUN_SECRET", raising=False)
    config = nixl_agent_config(backends=["UCX"])
    return nixl_agent("target", config), nixl_agent("reader", config)


@pytest.mark.parametrize("craft, says", [
    (lambda info: bytes([0xa5]) * len(info), "worker address of peer target"),
    (lambda info: bytes([(info[0] & 0xf0) | 7]) + info[1:], "unknown address format 8"),
    (lambda info: info[: len(info) // 2] + bytes(len(info) - len(info) // 2), "worker address of peer target"),
])
def test_a_crafted_worker_address_is_refused_before_ucx(agents, craft, says):
    target, reader = agents
    metadata = target.get_agent_metadata()
    info_at, info_length = frame(metadata)["info"]
    # eplb.nixl agents use CMA: its trailer (magic "EPCM", 56 bytes) follows the UCX worker address.
    trailer = CMA_TRAILER if metadata[info_at + info_length - CMA_TRAILER:].startswith(b"EPCM") else 0
    address_length = info_length - trailer
    assert address_length > 16
    crafted = bytearray(metadata)
    crafted[info_at:info_at + address_length] = craft(metadata[info_at:info_at + address_length])
    with pytest.raises(eplb.Error, match=says) as refused:
        reader.add_remote_agent(reseal(crafted))
    assert refused.value.code == "mismatch"
    assert reader.add_remote_agent(metadata) == b"target"  # the real metadata still loads
