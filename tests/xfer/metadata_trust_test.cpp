// Crafted agent metadata (issue 29 items 7, 8): well framed (a valid XXH3
// checksum) but with garbage where UCX would read it, or from a peer without
// the job's secret, is Mismatch before UCX sees it, never a crash; metadata
// sealed with the job's secret (HMAC-SHA256) loads, a wrong or missing seal
// does not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>

#include "../../src/xfer/metadata.h"
#include "agent_fixture.h"

namespace eplb::xfer {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Agent> ucx_agent(const std::string& name, const std::string& secret = "") {
  AgentConfig config;
  config.name = name;
  config.backend = "ucx";
  config.transports = "posix,cma,self";
  config.secret = secret;
  auto agent = Agent::create(config);
  EXPECT_TRUE(agent) << agent.status().to_string();
  return agent ? std::move(agent).value() : nullptr;
}

// The target's metadata (one 4 KiB region) decoded, for crafting.
AgentMetadata exported(Agent& target, std::vector<uint8_t>& buffer) {
  EXPECT_TRUE(target.register_memory({buffer.data(), buffer.size()}));
  auto bytes = target.export_metadata();
  EXPECT_TRUE(bytes);
  auto decoded = decode_metadata(*bytes);
  EXPECT_TRUE(decoded) << decoded.status().to_string();
  return *decoded;
}

void expect_refused(Agent& reader, const AgentMetadata& crafted, const std::string& piece) {
  auto bytes = encode_metadata(crafted);
  ASSERT_TRUE(bytes);
  auto loaded = reader.load_metadata(*bytes);
  ASSERT_FALSE(loaded) << "accepted crafted metadata (" << piece << ")";
  EXPECT_EQ(loaded.status().code(), Code::Mismatch) << loaded.status().to_string();
  EXPECT_THAT(loaded.status().message(), HasSubstr(piece));
  EXPECT_FALSE(reader.knows_peer(crafted.agent_name));
}

TEST(MetadataTrust, GarbageInThePackedKeyIsRefusedBeforeUcx) {
  std::vector<uint8_t> buffer(4096);
  auto target = ucx_agent("target");
  auto reader = ucx_agent("reader");
  ASSERT_TRUE(target && reader);
  const AgentMetadata good = exported(*target, buffer);
  ASSERT_EQ(good.regions.size(), 1u);
  AgentMetadata crafted = good;
  crafted.regions[0].packed_key[8] = 0xee;  // memory type
  expect_refused(*reader, crafted, "unknown memory type 238");
  crafted = good;
  crafted.regions[0].packed_key.resize(9);  // md map, type, no md sizes
  expect_refused(*reader, crafted, "no size for md");
  crafted = good;
  crafted.regions[0].packed_key[9] = 0xff;  // the first md's size runs past the key
  expect_refused(*reader, crafted, "run past the key");
  crafted = good;
  std::memset(crafted.regions[0].packed_key.data(), 0, 8);
  expect_refused(*reader, crafted, "empty md map");
  crafted = good;
  crafted.regions[0].packed_key = {1, 2, 3};
  expect_refused(*reader, crafted, "too short");
  // The real key still loads.
  auto bytes = encode_metadata(good);
  auto loaded = reader->load_metadata(*bytes);
  ASSERT_TRUE(loaded) << loaded.status().to_string();
}

TEST(MetadataTrust, OnlyMetadataSealedWithTheJobsSecretIsLoaded) {
  std::vector<uint8_t> buffer(4096);
  auto target = ucx_agent("target", "job-secret-1");
  auto reader = ucx_agent("reader", "job-secret-1");
  auto stranger = ucx_agent("stranger", "another-secret");
  auto open = ucx_agent("open");
  ASSERT_TRUE(target && reader && stranger && open);
  ASSERT_TRUE(target->register_memory({buffer.data(), buffer.size()}));
  auto sealed = target->export_metadata();
  ASSERT_TRUE(sealed);
  EXPECT_TRUE(decode_metadata(*sealed, "job-secret-1"));
  // A peer with another secret, or none, is refused before anything is read.
  auto wrong = stranger->load_metadata(*sealed);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.status().code(), Code::Mismatch);
  EXPECT_THAT(wrong.status().message(), HasSubstr("does not match this job's secret"));
  auto unsealed = open->export_metadata();
  ASSERT_TRUE(unsealed);
  auto refused = reader->load_metadata(*unsealed);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.status().message(), HasSubstr("not sealed with this job's secret"));
  // Garbage in the connection blob of a crafted, unsealed message never reaches UCX.
  AgentMetadata crafted = *decode_metadata(*sealed);
  crafted.agent_name = "forger";
  crafted.connection_info.assign(200, 0xa5);
  auto forged = reader->load_metadata(*encode_metadata(crafted));
  ASSERT_FALSE(forged);
  EXPECT_THAT(forged.status().message(), HasSubstr("not sealed"));
  // A sealed message with one byte changed is refused (the seal is checked before the checksum).
  std::vector<uint8_t> tampered = *sealed;
  tampered[20] ^= 1;
  auto changed = reader->load_metadata(tampered);
  ASSERT_FALSE(changed);
  EXPECT_EQ(changed.status().code(), Code::Mismatch);
  // The same secret loads.
  auto loaded = reader->load_metadata(*sealed);
  ASSERT_TRUE(loaded) << loaded.status().to_string();
}

// Item 8: a reader's bounds check trusts the region length in the metadata;
// a forged length (to READ past the 4 KiB the target registered) needs the
// job's secret, so a peer without it cannot get one past the seal.
TEST(MetadataTrust, AForgedRegionLengthNeedsTheSecret) {
  std::vector<uint8_t> buffer(4096);
  auto target = ucx_agent("target", "job-secret-2");
  auto reader = ucx_agent("reader", "job-secret-2");
  ASSERT_TRUE(target && reader);
  ASSERT_TRUE(target->register_memory({buffer.data(), buffer.size()}));
  AgentMetadata forged = *decode_metadata(*target->export_metadata());
  forged.regions[0].length = 1 << 20;
  for (const std::string secret : {"", "guessed"}) {
    auto loaded = reader->load_metadata(*encode_metadata(forged, secret));
    ASSERT_FALSE(loaded) << secret;
    EXPECT_EQ(loaded.status().code(), Code::Mismatch);
  }
  EXPECT_FALSE(reader->knows_peer("target"));
}

TEST(MetadataTrust, TheJobsSecretComesFromTheEnvironment) {
  const std::string launchers(64, 'c');  // 64 lowercase hex digits, as `eplb run` gives its ranks
  ::setenv("EPLB_RUN_SECRET", launchers.c_str(), 1);
  auto target = ucx_agent("target");
  auto reader = ucx_agent("reader");
  ::unsetenv("EPLB_RUN_SECRET");
  auto open = ucx_agent("open");
  ASSERT_TRUE(target && reader && open);
  auto sealed = target->export_metadata();
  ASSERT_TRUE(sealed);
  EXPECT_TRUE(decode_metadata(*sealed, launchers));
  EXPECT_FALSE(decode_metadata(*sealed, "something-else"));
  EXPECT_TRUE(reader->load_metadata(*sealed));
  EXPECT_FALSE(reader->load_metadata(*open->export_metadata()));
}


// The one reader of EPLB_RUN_SECRET (common/text.h) refuses a malformed one:
// an agent is not made with a secret the launcher could not have given.
TEST(MetadataTrust, AMalformedSecretInTheEnvironmentIsRefused) {
  ::setenv("EPLB_RUN_SECRET", "from-the-launcher", 1);
  AgentConfig config;
  config.name = "target";
  config.backend = "ucx";
  config.transports = "posix,cma,self";
  auto agent = Agent::create(config);
  ::unsetenv("EPLB_RUN_SECRET");
  ASSERT_FALSE(agent);
  EXPECT_EQ(agent.status().code(), Code::InvalidArgument);
  EXPECT_THAT(agent.status().message(), HasSubstr("EPLB_RUN_SECRET is not 64 lowercase hex digits (17 characters)"));
  EXPECT_THAT(agent.status().message(), HasSubstr("agent target"));
}

}  // namespace
}  // namespace eplb::xfer
