// AgentConfig::transports and net_devices reach UCX through its
// configuration API (no environment is changed), a UCX_TLS set in the
// environment wins over them, and the agent reports what it was given and
// what its connections use.
#include <gmock/gmock.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "agent_fixture.h"
#include "ucx_test_util.h"

namespace eplb::xfer::testing {
namespace {

using test::ScopedVariable;

using ::testing::Contains;
using ::testing::Not;

// Sets (or unsets) an environment variable for one test, then restores it.

struct Pair {
  std::unique_ptr<Agent> a, b;
};

Pair connected_pair(AgentConfig config, const std::string& prefix) {
  Pair pair;
  config.name = prefix + "-a";
  pair.a = std::move(Agent::create(config)).value();
  config.name = prefix + "-b";
  pair.b = std::move(Agent::create(config)).value();
  EXPECT_TRUE(pair.a->load_metadata(*pair.b->export_metadata()));
  EXPECT_TRUE(pair.b->load_metadata(*pair.a->export_metadata()));
  return pair;
}

// A READ of 64 KiB from b into a lands byte for byte.
void expect_read_works(Pair& pair) {
  std::vector<uint8_t> source(64 << 10), destination(64 << 10, 0);
  fill_pattern(source.data(), source.size(), 3);
  ASSERT_TRUE(pair.b->register_memory({source.data(), source.size()}));
  ASSERT_TRUE(pair.a->register_memory({destination.data(), destination.size()}));
  ASSERT_TRUE(pair.a->load_metadata(*pair.b->export_metadata()));
  Descriptor local = descriptor_of(destination.data(), destination.size());
  Descriptor remote = descriptor_of(source.data(), source.size());
  auto request = pair.a->make_request(Operation::Read, *pair.a->prepare_local({&local, 1}), {},
                                      *pair.a->prepare_remote(pair.b->name(), {&remote, 1}), {});
  ASSERT_TRUE(request) << request.status().to_string();
  ASSERT_TRUE(pair.a->post(*request));
  const RequestId id = *request;
  Status done = wait_driving(*pair.a, *pair.b, {&id, 1}, Deadline::after_seconds(10));
  ASSERT_TRUE(done) << done.to_string();
  EXPECT_EQ(destination, source);
}

TEST(UcxTransports, AgentConfigChoosesThemAndTheAgentSaysSo) {
  ScopedVariable tls("UCX_TLS", std::nullopt), devices("UCX_NET_DEVICES", std::nullopt);
  AgentConfig config;
  config.transports = "tcp,self";
  config.net_devices = "lo";
  Pair pair = connected_pair(config, "tls-config");
  EXPECT_EQ(pair.a->transports(), "ucx: UCX_TLS=tcp,self (AgentConfig), UCX_NET_DEVICES=lo (AgentConfig)");
  auto used = pair.a->peer_transports(pair.b->name());
  ASSERT_TRUE(used) << used.status().to_string();
  EXPECT_THAT(*used, Contains("tcp"));
  EXPECT_THAT(*used, Not(Contains("posix")));
  expect_read_works(pair);
  EXPECT_EQ(std::getenv("UCX_TLS"), nullptr);  // nothing was written to the environment
  EXPECT_EQ(pair.a->peer_transports("nobody").status().code(), Code::NotFound);
}

TEST(UcxTransports, TheEnvironmentWins) {
  ScopedVariable tls("UCX_TLS", "posix,sysv,cma,self"), devices("UCX_NET_DEVICES", std::nullopt);
  AgentConfig config;
  config.transports = "tcp,self";
  Pair pair = connected_pair(config, "tls-environment");
  EXPECT_EQ(pair.a->transports(), "ucx: UCX_TLS=posix,sysv,cma,self (environment)");
  auto used = pair.a->peer_transports(pair.b->name());
  ASSERT_TRUE(used) << used.status().to_string();
  EXPECT_THAT(*used, Not(Contains("tcp")));
  expect_read_works(pair);
}

TEST(UcxTransports, UnsetMeansUcxsOwnChoiceAndLoopbackSaysWhatItIs) {
  ScopedVariable tls("UCX_TLS", std::nullopt), devices("UCX_NET_DEVICES", std::nullopt);
  AgentConfig config;
  config.name = "tls-default";
  auto agent = Agent::create(config);
  ASSERT_TRUE(agent) << agent.status().to_string();
  EXPECT_EQ((*agent)->transports(), "ucx: UCX_TLS unset (UCX's default)");
  config.backend = "loopback";
  config.transports = "tcp,self";  // ignored by other backends
  Pair pair = connected_pair(config, "tls-loopback");
  EXPECT_EQ(pair.a->transports(), "loopback: in-process copies");
  EXPECT_EQ(*pair.a->peer_transports(pair.b->name()), std::vector<std::string>{"loopback"});
}

}  // namespace
}  // namespace eplb::xfer::testing
