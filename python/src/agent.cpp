// The transfer agent of a Python process and the memory it allocates:
// eplb.empty() tensors are numpy views of agent memory (zero-copy for UCX
// shared memory), kept alive by a capsule holding the agent.
#include <pybind11/stl.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "bindings.h"
#include "convert.h"
#include "group.h"

namespace eplb::python {

Result<xfer::AllocatedRegion> AgentHandle::allocate(size_t length) {
  std::lock_guard lock(mutex_);
  if (busy_) return error(Code::NotAllowed, "eplb.empty: the transfer agent is migrating; allocate before or after");
  for (auto region : to_free_) (void)agent_->deregister_memory(region);
  to_free_.clear();
  auto allocated = agent_->allocate_memory(length);
  if (allocated) allocations_[reinterpret_cast<uintptr_t>(allocated->address)] = *allocated;
  return allocated;
}

void AgentHandle::release(void* address) {
  std::lock_guard lock(mutex_);
  auto found = allocations_.find(reinterpret_cast<uintptr_t>(address));
  if (found == allocations_.end()) return;
  if (busy_) to_free_.push_back(found->second.id);
  else (void)agent_->deregister_memory(found->second.id);
  allocations_.erase(found);
}

bool AgentHandle::owns(const void* address, size_t length) {
  std::lock_guard lock(mutex_);
  const auto begin = reinterpret_cast<uintptr_t>(address);
  auto found = allocations_.upper_bound(begin);
  if (found == allocations_.begin()) return false;
  --found;
  return begin + length <= found->first + found->second.length;
}

void AgentHandle::begin_use() {
  std::lock_guard lock(mutex_);
  busy_ = true;
}

void AgentHandle::end_use() {
  std::lock_guard lock(mutex_);
  busy_ = false;
  for (auto region : to_free_) (void)agent_->deregister_memory(region);
  to_free_.clear();
}

namespace {

// The network devices a Python agent listens on and uses: loopback unless
// asked (the argument, else EPLB_NET_DEVICES; UCX_NET_DEVICES in the
// environment wins over both, as everywhere), like the CLI's local ranks.
std::string net_devices_for(const std::optional<std::string>& asked) {
  if (asked) return *asked;
  const char* chosen = std::getenv("EPLB_NET_DEVICES");
  return chosen && *chosen ? chosen : "lo";
}

std::shared_ptr<AgentHandle> make_agent(const std::string& name, const std::string& backend,
                                        const std::string& transports, const std::string& fault_spec, bool cma,
                                        const std::optional<std::string>& net_devices) {
  xfer::AgentConfig config;
  config.name = name;
  config.backend = backend;
  config.transports = transports;
  config.net_devices = net_devices_for(net_devices);
  config.fault_spec = fault_spec;
  config.map_peer_memory_eagerly = true;
  config.cma_local_peers = cma;
  return std::make_shared<AgentHandle>(value_or_throw(xfer::Agent::create(config)));
}

// A uint8 numpy array over `nbytes` of agent memory; the array's capsule
// keeps the agent alive and hands the memory back when the array dies.
py::array_t<uint8_t> allocate(const std::shared_ptr<AgentHandle>& agent, int64_t nbytes) {
  if (nbytes <= 0) throw_invalid("eplb.empty: " + std::to_string(nbytes) + " bytes: the size must be positive");
  xfer::AllocatedRegion region = value_or_throw(agent->allocate(size_t(nbytes)));
  struct Owner {
    std::shared_ptr<AgentHandle> agent;
    void* address;
  };
  auto* owner = new Owner{agent, region.address};
  py::capsule keep(owner, [](void* pointer) {
    auto* dying = static_cast<Owner*>(pointer);
    dying->agent->release(dying->address);
    delete dying;
  });
  return py::array_t<uint8_t>({py::ssize_t(nbytes)}, {py::ssize_t(1)}, static_cast<uint8_t*>(region.address), keep);
}

}  // namespace

void bind_agent(py::module_& module) {
  py::class_<AgentHandle, std::shared_ptr<AgentHandle>>(module, "Agent")
      .def(py::init(&make_agent), py::arg("name"), py::arg("backend") = "ucx", py::arg("transports") = "",
           py::arg("fault_spec") = "", py::arg("cma") = false, py::arg("net_devices") = std::nullopt)
      .def_property_readonly("name", [](AgentHandle& handle) { return handle.agent().name(); })
      .def_property_readonly("transports", [](AgentHandle& handle) { return handle.agent().transports(); })
      .def("allocate", &allocate, py::arg("nbytes"))
      .def(
          "owns",
          [](AgentHandle& handle, uintptr_t address, size_t length) {
            return handle.owns(reinterpret_cast<void*>(address), length);
          },
          py::arg("address"), py::arg("nbytes"));
  // The one memory admission rule (eplb/common.h) for what Python allocates
  // outside the agent (heap spare buffers of the swap commit).
  module.def(
      "admit_memory",
      [](uint64_t nbytes, bool shared_memory, const std::string& what) {
        throw_if_error(admit_allocation(nbytes, shared_memory, what));
      },
      py::arg("nbytes"), py::arg("shared_memory"), py::arg("what"));
}

}  // namespace eplb::python
