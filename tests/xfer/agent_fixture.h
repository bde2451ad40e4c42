// Shared fixture for the xfer tests: two agents of one backend in one
// process. The suites built on it are parameterized over the backend name;
// agent_*_test.cpp instantiate them with "loopback", a backend's own test
// file can instantiate them again (e.g. "ucx").
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "eplb/xfer.h"

namespace eplb::xfer::testing {

// Deterministic, position- and seed-dependent bytes.
inline void fill_pattern(uint8_t* data, size_t length, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= length; i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(data + i, &state, 8);
  }
  for (; i < length; ++i) data[i] = static_cast<uint8_t>(state >> (8 * (i % 8)) ^ i);
}

inline Descriptor descriptor_of(const void* address, size_t length, uint32_t device = 0) {
  return Descriptor{reinterpret_cast<uintptr_t>(address), length, device};
}

// Waits on `initiator` while also progressing `peer` (some transports need
// the target to progress). Returns what the initiator's wait() returns.
inline Status wait_driving(Agent& initiator, Agent& peer, std::span<const RequestId> requests, Deadline deadline) {
  for (;;) {
    peer.progress();
    Status waited = initiator.wait(requests, Deadline::after(std::chrono::microseconds(200)));
    if (waited.code() != Code::Timeout || deadline.expired()) return waited;
  }
}

// Waits for notifications on `receiver` while also progressing `sender`.
inline Result<std::vector<Notification>> wait_notifications_driving(Agent& receiver, Agent& sender,
                                                                     Deadline deadline) {
  for (;;) {
    sender.progress();
    auto arrived = receiver.wait_notifications(Deadline::after(std::chrono::microseconds(200)));
    if (arrived || arrived.status().code() != Code::Timeout || deadline.expired()) return arrived;
  }
}

inline std::string backend_test_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

class AgentPairTest : public ::testing::TestWithParam<std::string> {
 public:
  std::unique_ptr<Agent> make_agent(const std::string& name, const std::string& fault_spec = {}) {
    AgentConfig config;
    config.name = name;
    config.backend = GetParam();
    config.fault_spec = fault_spec;
    auto agent = Agent::create(config);
    EXPECT_TRUE(agent.is_ok()) << agent.status().to_string();
    return agent ? std::move(agent).value() : nullptr;
  }

  // initiator (optionally faulty) and target, each with one buffer of
  // `bytes` registered, metadata exchanged both ways.
  void make_pair(size_t bytes, const std::string& initiator_faults = {}) {
    initiator = make_agent("initiator", initiator_faults);
    target = make_agent("target");
    ASSERT_TRUE(initiator && target);
    local_buffer.assign(bytes, 0);
    remote_buffer.assign(bytes, 0);
    auto local = initiator->register_memory({local_buffer.data(), bytes});
    ASSERT_TRUE(local) << local.status().to_string();
    local_region = *local;
    auto remote = target->register_memory({remote_buffer.data(), bytes});
    ASSERT_TRUE(remote) << remote.status().to_string();
    remote_region = *remote;
    exchange();
  }

  void exchange() {
    auto target_metadata = target->export_metadata();
    ASSERT_TRUE(target_metadata) << target_metadata.status().to_string();
    auto loaded = initiator->load_metadata(*target_metadata);
    ASSERT_TRUE(loaded) << loaded.status().to_string();
    EXPECT_EQ(*loaded, "target");
    auto initiator_metadata = initiator->export_metadata();
    ASSERT_TRUE(initiator_metadata) << initiator_metadata.status().to_string();
    ASSERT_TRUE(target->load_metadata(*initiator_metadata));
  }

  // Prepares one local and one remote descriptor covering [offset, offset+length).
  void prepare_whole(size_t offset, size_t length, DescriptorListId* local, DescriptorListId* remote) {
    Descriptor l = descriptor_of(local_buffer.data() + offset, length);
    Descriptor r = descriptor_of(remote_buffer.data() + offset, length);
    auto local_list = initiator->prepare_local({&l, 1});
    ASSERT_TRUE(local_list) << local_list.status().to_string();
    auto remote_list = initiator->prepare_remote("target", {&r, 1});
    ASSERT_TRUE(remote_list) << remote_list.status().to_string();
    *local = *local_list;
    *remote = *remote_list;
  }

  Status run(RequestId request, double seconds = 20) {
    Status posted = initiator->post(request);
    if (!posted) return posted;
    return wait_driving(*initiator, *target, {&request, 1}, Deadline::after_seconds(seconds));
  }

  // Buffers first: agents (destroyed first) may still refer to them.
  std::vector<uint8_t> local_buffer, remote_buffer;
  std::unique_ptr<Agent> initiator, target;
  RegionId local_region = 0, remote_region = 0;
};

// The parameterized suites (instantiate them per backend).
class TransferTest : public AgentPairTest {};
class AgentErrorTest : public AgentPairTest {};
class FaultyTest : public AgentPairTest {};

}  // namespace eplb::xfer::testing
