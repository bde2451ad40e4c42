"""eplb's data planes in Python: how rows move when they do not move through eplb's own UCX agent.

The migration protocol (plan, stage, transfer, verify, vote, commit or abort, retries, deadlines,
the async step gate) lives once, in the C++ library; it calls a plane for every byte it moves,
copies or digests (include/eplb/data_plane.h). The ucx plane is C++. These are Python objects the
library calls through the same interface (python/src/python_plane.h), with the GIL taken:

  name, digest_kind, one_sided, broken      attributes ("torch", "eplb-dev64", False, None or why)
  describe() -> bytes; connect(blobs, me)   collective set-up through the library's exchange
  digest(rows) -> [int]                     rows: [(layer, slot, buffer)], one layer; [row * tensors + t]
  copy(copies); commit(copies)              copies: [((layer, slot, buffer), (layer, slot, buffer))]
  post(layer, receives, sends, timeout)     receives: [(source rank, source slot, source buffer,
                                            (layer, slot, buffer), expert)]; sends: [(destination rank,
                                            (layer, slot, buffer), destination slot, expert)]
  wait(timeout); abandon()                  failures raise eplb.Error with `code` and `peer`

Buffers: 0 primary (the engine's tensors), 1 spare, 2 staging; slots are this rank's local slots,
source slots global. Planes: TorchPlane ("torch", the engine's data group: NCCL or gloo),
StagedPlane ("staged", device rows through pinned host buffers over a gloo group), NixlPlane
("nixl", READs through a real NIXL agent). Their rows are RowSpace's (eplb/planes/rows.py);
FaultSpec (eplb/planes/faults.py) injects faults for tests.
"""
from eplb.planes.faults import FaultSpec
from eplb.planes.nixl_plane import NixlPlane
from eplb.planes.rows import RowSpace
from eplb.planes.staged import StagedPlane
from eplb.planes.torch_plane import TorchPlane

__all__ = ["FaultSpec", "NixlPlane", "RowSpace", "StagedPlane", "TorchPlane"]
