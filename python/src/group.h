// python/src/group.h - what the migration bindings share: the transfer agent
// a Python process holds (with the memory it allocated for eplb.empty
// tensors) and Status codes by name.
//
// Contract: an AgentHandle is shared by the Python Agent object, by every
// buffer it allocated (a numpy array's capsule) and by every migration using
// it, so the agent outlives all of them. The agent is used by one thread at
// a time: a migration marks it busy, and a buffer dropped meanwhile is freed
// when the migration ends (never concurrently with it).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "eplb/status.h"
#include "eplb/xfer.h"

namespace eplb::python {

namespace py = pybind11;

// The Code whose code_name() is `name`; Backend for an unknown name.
Code code_from_name(const std::string& name);

class AgentHandle {
 public:
  explicit AgentHandle(std::unique_ptr<xfer::Agent> agent) : agent_(std::move(agent)) {}
  xfer::Agent& agent() { return *agent_; }
  // `length` bytes allocated and registered by the agent.
  Result<xfer::AllocatedRegion> allocate(size_t length);
  // Frees an allocation now, or when the running migration ends.
  void release(void* address);
  // True when [address, address + length) lies inside one allocation.
  bool owns(const void* address, size_t length);
  // A migration starts / ends using the agent.
  void begin_use();
  void end_use();

 private:
  std::unique_ptr<xfer::Agent> agent_;
  std::mutex mutex_;
  std::map<uintptr_t, xfer::AllocatedRegion> allocations_;
  std::vector<xfer::RegionId> to_free_;
  bool busy_ = false;
};

}  // namespace eplb::python
