// python/src/python_plane.h - a data plane (eplb/data_plane.h) implemented
// by a Python object (eplb's torch, staged and nixl planes), and the Status
// of a Python exception.
//
// Contract: every call takes the GIL (the protocol may run on the async
// round's progress thread) and turns a Python exception into a Status: its
// `code` attribute (an eplb.Error's code name, else "backend error"), its
// message, its `peer` attribute (a rank) when it has one. The object's
// methods (eplb/planes.py documents them): describe() -> bytes,
// connect(blobs, me), digest(rows) -> [int], copy(copies), commit(copies),
// post(layer, receives, sends, timeout), wait(timeout), abandon(), and the
// attributes name, digest_kind, one_sided, broken. A row is (layer, local
// slot, buffer) with buffer 0 primary, 1 spare, 2 staging.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "eplb/data_plane.h"
#include "eplb/status.h"

namespace eplb::python {

namespace py = pybind11;

// The Status of the Python exception being handled (call inside a catch).
Status status_of(py::error_already_set& failure, Code fallback = Code::Backend);

std::unique_ptr<DataPlane> make_python_plane(py::object plane);

}  // namespace eplb::python
