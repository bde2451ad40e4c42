// A DataPlane whose every call goes to a Python object (python_plane.h).
#include "python_plane.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "group.h"

namespace eplb::python {

Status status_of(py::error_already_set& failure, Code fallback) {
  Code code = fallback;
  if (py::hasattr(failure.value(), "code"))
    code = code_from_name(py::str(failure.value().attr("code")).cast<std::string>());
  Status status = error(code, py::str(failure.value()).cast<std::string>());
  if (py::hasattr(failure.value(), "peer") && !failure.value().attr("peer").is_none())
    status = status.with_peer(failure.value().attr("peer").cast<int>());
  return status;
}

namespace {

py::tuple row_tuple(const RowRef& row) { return py::make_tuple(row.layer, row.local_slot, int(row.buffer)); }

py::list copy_list(std::span<const RowCopy> copies) {
  py::list out;
  for (const RowCopy& copy : copies) out.append(py::make_tuple(row_tuple(copy.from), row_tuple(copy.to)));
  return out;
}

class PythonPlane final : public DataPlane {
 public:
  explicit PythonPlane(py::object plane) : plane_(std::move(plane)) {
    name_ = py::str(plane_.attr("name")).cast<std::string>();
    kind_ = py::str(plane_.attr("digest_kind")).cast<std::string>();
    one_sided_ = plane_.attr("one_sided").cast<bool>();
  }
  ~PythonPlane() override {
    py::gil_scoped_acquire gil;
    plane_ = py::object();
  }
  std::string name() const override { return name_; }
  std::string digest_kind() const override { return kind_; }
  bool one_sided() const override { return one_sided_; }

  Result<std::string> describe() override {
    return call<std::string>([&] { return py::bytes(plane_.attr("describe")()).cast<std::string>(); });
  }
  Status connect(const std::vector<std::string>& blobs, int me) override {
    return run([&] {
      py::list items;
      for (const auto& blob : blobs) items.append(py::bytes(blob));
      plane_.attr("connect")(items, me);
    });
  }
  Result<std::vector<uint64_t>> digest(std::span<const RowRef> rows) override {
    return call<std::vector<uint64_t>>([&] {
      py::list items;
      for (const RowRef& row : rows) items.append(row_tuple(row));
      return plane_.attr("digest")(items).cast<std::vector<uint64_t>>();
    });
  }
  Status copy(std::span<const RowCopy> copies) override {
    if (copies.empty()) return Status::ok();
    return run([&] { plane_.attr("copy")(copy_list(copies)); });
  }
  Status commit(std::span<const RowCopy> copies) override {
    return run([&] { plane_.attr("commit")(copy_list(copies)); });
  }
  Status post(const LayerTransfers& transfers, Deadline deadline) override;
  Status wait(Deadline deadline) override {
    return run([&] { plane_.attr("wait")(std::max(0.0, deadline.remaining_seconds())); });
  }
  void abandon() override {
    (void)run([&] { plane_.attr("abandon")(); });
  }
  std::string broken() const override {
    py::gil_scoped_acquire gil;
    py::object reason = plane_.attr("broken");
    return reason.is_none() ? std::string() : py::str(reason).cast<std::string>();
  }

 private:
  template <typename Body>
  Status run(Body&& body) {
    py::gil_scoped_acquire gil;
    try {
      body();
      return Status::ok();
    } catch (py::error_already_set& failure) {
      return status_of(failure);
    }
  }
  template <typename T, typename Body>
  Result<T> call(Body&& body) {
    py::gil_scoped_acquire gil;
    try {
      return body();
    } catch (py::error_already_set& failure) {
      return status_of(failure);
    } catch (const py::cast_error& failure) {
      return error(Code::Internal, name_ + " plane returned the wrong type: " + failure.what());
    }
  }
  py::object plane_;
  std::string name_, kind_;
  bool one_sided_ = false;
};

Status PythonPlane::post(const LayerTransfers& transfers, Deadline deadline) {
  return run([&] {
    py::list receives, sends;
    for (const RowReceive& r : transfers.receives)
      receives.append(py::make_tuple(r.source_rank, r.source_slot, int(r.source_buffer), row_tuple(r.to), r.expert));
    for (const RowSend& s : transfers.sends)
      sends.append(py::make_tuple(s.destination_rank, row_tuple(s.from), s.destination_slot, s.expert));
    plane_.attr("post")(transfers.layer, receives, sends, std::max(0.0, deadline.remaining_seconds()));
  });
}

}  // namespace

std::unique_ptr<DataPlane> make_python_plane(py::object plane) { return std::make_unique<PythonPlane>(std::move(plane)); }

}  // namespace eplb::python
