// The transfer agent's own calls for eplb.nixl (register, metadata,
// descriptor lists, requests, notifications): thin, checked wrappers over xfer::Agent on
// DRAM. Handles are the library's ids; a failure raises eplb.Error with the
// library's Status (code and message). wait() releases the GIL.
#include <pybind11/stl.h>

#include <xxhash.h>

#include "bindings.h"
#include "convert.h"
#include "group.h"

namespace eplb::python {
namespace {

using DescriptorTuple = std::tuple<uint64_t, uint64_t, uint32_t>;  // (address, length, device)

std::vector<xfer::Descriptor> descriptors_of(const std::vector<DescriptorTuple>& tuples) {
  std::vector<xfer::Descriptor> descriptors;
  descriptors.reserve(tuples.size());
  for (const auto& [address, length, device] : tuples) descriptors.push_back({address, length, device});
  return descriptors;
}

xfer::Operation operation_of(const std::string& name) {
  if (name == "READ") return xfer::Operation::Read;
  if (name == "WRITE") return xfer::Operation::Write;
  throw_invalid("operation must be \"READ\" or \"WRITE\", got \"" + name + "\"");
}

py::tuple request_status(AgentHandle& handle, xfer::RequestId request) {
  xfer::RequestStatus status = handle.agent().status(request);
  const char* state = status.state == xfer::RequestState::Done         ? "DONE"
                      : status.state == xfer::RequestState::InProgress ? "PROC"
                                                                       : "ERR";
  return py::make_tuple(state, std::string(code_name(status.failure.code())), status.failure.message());
}

void wait_for(AgentHandle& handle, const std::vector<xfer::RequestId>& requests, double timeout_seconds) {
  Status waited;
  {
    py::gil_scoped_release release;
    waited = handle.agent().wait(requests, Deadline::after_seconds(timeout_seconds));
  }
  throw_if_error(waited);
}

// XXH3-64 of a contiguous buffer (the checksum every eplb wire format uses).
uint64_t checksum(uintptr_t address, size_t length) {
  return XXH3_64bits(reinterpret_cast<const void*>(address), length);
}

}  // namespace

void bind_xfer(py::module_& module) {
  auto agent = py::reinterpret_borrow<py::class_<AgentHandle, std::shared_ptr<AgentHandle>>>(module.attr("Agent"));
  agent
      .def("register_memory",
           [](AgentHandle& handle, uintptr_t address, size_t length, uint32_t device) {
             return value_or_throw(handle.agent().register_memory(
                 {reinterpret_cast<void*>(address), length, xfer::MemoryKind::Host, device}));
           })
      .def("deregister_memory",
           [](AgentHandle& handle, xfer::RegionId region) { throw_if_error(handle.agent().deregister_memory(region)); })
      .def("export_metadata",
           [](AgentHandle& handle) {
             auto bytes = value_or_throw(handle.agent().export_metadata());
             return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
           })
      .def("load_metadata",
           [](AgentHandle& handle, const std::string& metadata) {
             std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(metadata.data()), metadata.size());
             return value_or_throw(handle.agent().load_metadata(bytes));
           })
      .def("invalidate_peer",
           [](AgentHandle& handle, const std::string& peer) { throw_if_error(handle.agent().invalidate_peer(peer)); })
      .def("prepare",
           [](AgentHandle& handle, const std::string& peer, const std::vector<DescriptorTuple>& tuples) {
             auto descriptors = descriptors_of(tuples);
             if (peer.empty()) return value_or_throw(handle.agent().prepare_local(descriptors));
             return value_or_throw(handle.agent().prepare_remote(peer, descriptors));
           })
      .def("release_list",
           [](AgentHandle& handle, xfer::DescriptorListId list) {
             throw_if_error(handle.agent().release_descriptor_list(list));
           })
      .def("make_request",
           [](AgentHandle& handle, const std::string& op, xfer::DescriptorListId local, std::vector<int> local_indices,
              xfer::DescriptorListId remote, std::vector<int> remote_indices, const std::string& notification) {
             return value_or_throw(handle.agent().make_request(operation_of(op), local, local_indices, remote,
                                                               remote_indices, notification));
           })
      .def("post", [](AgentHandle& handle, xfer::RequestId request) { throw_if_error(handle.agent().post(request)); })
      .def("status", &request_status)
      .def("release",
           [](AgentHandle& handle, xfer::RequestId request) { throw_if_error(handle.agent().release(request)); })
      .def("wait", &wait_for, py::arg("requests"), py::arg("timeout"))
      .def("progress", [](AgentHandle& handle) { handle.agent().progress(); })
      .def("send_notification",
           [](AgentHandle& handle, const std::string& peer, const py::bytes& message) {
             throw_if_error(handle.agent().send_notification(peer, std::string(message)));
           })
      .def("take_notifications", [](AgentHandle& handle) {
        py::list arrived;  // (peer, message bytes), in arrival order
        for (auto& notification : handle.agent().take_notifications())
          arrived.append(py::make_tuple(notification.peer, py::bytes(notification.message)));
        return arrived;
      });
  module.def("checksum", &checksum, py::arg("address"), py::arg("nbytes"));
}

}  // namespace eplb::python
