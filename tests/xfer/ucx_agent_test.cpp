// xfer-core's in-process Agent suites (agent_fixture.h), run again over the
// UCX backend. Two agents of one process talk through UCX shared memory:
// UCX_TLS defaults to posix,sysv,cma,self here unless the environment sets
// it (the ucx_process and ucx_backend tests cover TCP explicitly).
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent_fixture.h"
#include "common/bytes.h"

namespace eplb::xfer::testing {
namespace {

const bool kDefaultTransport = [] {
  setenv("UCX_TLS", "posix,sysv,cma,self", /*overwrite=*/0);
  return true;
}();

INSTANTIATE_TEST_SUITE_P(Ucx, TransferTest, ::testing::Values("ucx"), backend_test_name);

}  // namespace
}  // namespace eplb::xfer::testing

namespace eplb::xfer::testing {
namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// An "owner" agent and a "reader" agent made with `reader_config` (its name
// is set here), both UCX, in this process.
struct OwnerAndReader {
  std::unique_ptr<Agent> owner, reader;
  explicit OwnerAndReader(AgentConfig reader_config) {
    AgentConfig config;
    config.name = "owner";
    if (auto made = Agent::create(config)) owner = std::move(made).value();
    reader_config.name = "reader";
    if (auto made = Agent::create(reader_config)) reader = std::move(made).value();
  }
  bool ok() const { return owner && reader; }
};

// Memory allocated by the UCX backend is registered like any region and
// reachable by a peer, whether the reader maps its peers' memory eagerly or
// on first use; loopback cannot allocate. *faults: the page faults taken
// while the READ ran.
void allocated_regions_transfer_and_free(bool map_eagerly, long* faults) {
  AgentConfig config;
  config.map_peer_memory_eagerly = map_eagerly;
  OwnerAndReader agents(config);
  ASSERT_TRUE(agents.ok());
  auto& owner = agents.owner;
  auto& reader = agents.reader;
  constexpr size_t kBytes = (1 << 20) + 123;
  auto source = owner->allocate_memory(kBytes);
  ASSERT_TRUE(source) << source.status().to_string();
  ASSERT_NE(source->address, nullptr);
  EXPECT_EQ(source->length, kBytes);
  fill_pattern(static_cast<uint8_t*>(source->address), kBytes, 42);
  auto destination = reader->allocate_memory(kBytes);
  ASSERT_TRUE(destination) << destination.status().to_string();
  std::memset(destination->address, 0, kBytes);

  auto metadata = owner->export_metadata();
  ASSERT_TRUE(metadata);
  ASSERT_TRUE(reader->load_metadata(*metadata));
  auto metadata_back = reader->export_metadata();
  ASSERT_TRUE(metadata_back);
  ASSERT_TRUE(owner->load_metadata(*metadata_back));
  Descriptor local = descriptor_of(destination->address, kBytes);
  Descriptor remote = descriptor_of(source->address, kBytes);
  auto local_list = reader->prepare_local({&local, 1});
  auto remote_list = reader->prepare_remote("owner", {&remote, 1});
  ASSERT_TRUE(local_list && remote_list);
  auto request = reader->make_request(Operation::Read, *local_list, {}, *remote_list, {});
  ASSERT_TRUE(request);
  const long faults_before = minor_faults();
  ASSERT_TRUE(reader->post(*request));
  const RequestId id = *request;
  Status done = wait_driving(*reader, *owner, {&id, 1}, Deadline::after_seconds(10));
  *faults = minor_faults() - faults_before;
  ASSERT_TRUE(done) << done.to_string();
  EXPECT_EQ(std::memcmp(destination->address, source->address, kBytes), 0);

  ASSERT_TRUE(reader->release(*request));
  ASSERT_TRUE(reader->release_descriptor_list(*local_list));
  ASSERT_TRUE(reader->release_descriptor_list(*remote_list));
  EXPECT_TRUE(reader->deregister_memory(destination->id));
  EXPECT_EQ(reader->deregister_memory(destination->id).code(), Code::NotFound);
  EXPECT_TRUE(owner->deregister_memory(source->id));
  EXPECT_EQ(owner->allocate_memory(0).status().code(), Code::InvalidArgument);

  config.name = "reader";
  config.backend = "loopback";
  auto loopback = Agent::create(config);
  ASSERT_TRUE(loopback);
  EXPECT_EQ((*loopback)->allocate_memory(4096).status().code(), Code::Unsupported);
}

// READ then WRITE of 1 MiB + 5 (scattered over 3 descriptors) between
// memory the owner allocated (mapped into the reader by UCX), either copied
// directly in post() or through ucp_get_nbx/ucp_put_nbx. *inline_done: the
// READ was Done at its first status() with no progress of the owner.
// Both are made with checksum_landed: a READ copied directly reports each
// segment's checksum (computed while copying), one through UCX none, a
// WRITE never.
void mapped_memory_round_trip(bool copy_mapped, bool* inline_done) {
  AgentConfig config;
  config.copy_mapped_memory = copy_mapped;
  OwnerAndReader agents(config);
  ASSERT_TRUE(agents.ok());
  auto& owner = agents.owner;
  auto& reader = agents.reader;
  constexpr size_t kBytes = (1 << 20) + 5;
  auto source = owner->allocate_memory(kBytes);
  auto buffer = reader->allocate_memory(kBytes);
  ASSERT_TRUE(source && buffer);
  auto* remote = static_cast<uint8_t*>(source->address);
  auto* local = static_cast<uint8_t*>(buffer->address);
  fill_pattern(remote, kBytes, 7);
  std::memset(local, 0, kBytes);
  ASSERT_TRUE(reader->load_metadata(*owner->export_metadata()));
  ASSERT_TRUE(owner->load_metadata(*reader->export_metadata()));
  const size_t cuts[] = {0, 4093, 700001, kBytes};
  std::vector<Descriptor> locals, remotes;
  for (int i = 0; i < 3; ++i) {
    locals.push_back(descriptor_of(local + cuts[i], cuts[i + 1] - cuts[i]));
    remotes.push_back(descriptor_of(remote + cuts[i], cuts[i + 1] - cuts[i]));
  }
  auto local_list = reader->prepare_local(locals);
  auto remote_list = reader->prepare_remote("owner", remotes);
  ASSERT_TRUE(local_list && remote_list);
  for (Operation op : {Operation::Read, Operation::Write}) {
    if (op == Operation::Write) fill_pattern(local, kBytes, 9);
    auto request = reader->make_request(op, *local_list, {}, *remote_list, {}, {}, /*checksum_landed=*/true);
    ASSERT_TRUE(request);
    EXPECT_EQ(reader->landed_checksums(*request).status().code(), Code::NotAllowed);  // not posted yet
    ASSERT_TRUE(reader->post(*request));
    if (op == Operation::Read) *inline_done = reader->status(*request).state == RequestState::Done;
    const RequestId id = *request;
    ASSERT_TRUE(wait_driving(*reader, *owner, {&id, 1}, Deadline::after_seconds(10)));
    EXPECT_EQ(std::memcmp(local, remote, kBytes), 0) << operation_name(op) << " copy_mapped " << copy_mapped;
    auto landed = reader->landed_checksums(id);
    ASSERT_TRUE(landed) << landed.status().to_string();
    ASSERT_EQ(landed->size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const bool computed = op == Operation::Read && copy_mapped && *inline_done;
      ASSERT_EQ((*landed)[i].has_value(), computed) << operation_name(op) << " segment " << i;
      if (computed) {
        EXPECT_EQ(*(*landed)[i], bytes::checksum(std::span<const uint8_t>(local + cuts[i], cuts[i + 1] - cuts[i])));
      }
    }
    ASSERT_TRUE(reader->release(*request));
  }
  ASSERT_TRUE(reader->release_descriptor_list(*local_list));
  ASSERT_TRUE(reader->release_descriptor_list(*remote_list));
}

TEST(UcxMappedMemory, CopiedDirectlyOrThroughUcxTheBytesAreTheSame) {
  bool direct_inline = false, through_ucx_inline = false;
  mapped_memory_round_trip(true, &direct_inline);
  mapped_memory_round_trip(false, &through_ucx_inline);
  if (std::getenv("UCX_TLS") && std::string(std::getenv("UCX_TLS")).find("posix") != std::string::npos) {
    EXPECT_TRUE(direct_inline);  // one memcpy inside post()
  }
}

// The owner frees a region and allocates another (the kernel often hands
// back the same addresses); after loading its metadata again, a READ gets
// the new memory's bytes, never the freed segment's that the older key maps.
TEST(UcxMappedMemory, ReadAfterThePeerReallocatedGetsTheNewBytes) {
  OwnerAndReader agents{AgentConfig{}};
  ASSERT_TRUE(agents.ok());
  auto& owner = agents.owner;
  auto& reader = agents.reader;
  constexpr size_t kBytes = 1 << 20;
  auto first = owner->allocate_memory(kBytes);
  auto local = reader->allocate_memory(kBytes);
  ASSERT_TRUE(first && local);
  fill_pattern(static_cast<uint8_t*>(first->address), kBytes, 1);
  ASSERT_TRUE(reader->load_metadata(*owner->export_metadata()));
  ASSERT_TRUE(owner->load_metadata(*reader->export_metadata()));
  ASSERT_TRUE(owner->deregister_memory(first->id));
  auto second = owner->allocate_memory(kBytes);
  ASSERT_TRUE(second);
  auto* remote = static_cast<uint8_t*>(second->address);
  fill_pattern(remote, kBytes, 2);
  ASSERT_TRUE(reader->load_metadata(*owner->export_metadata()));
  std::printf("[ info     ] reallocated at the same address: %s\n", second->address == first->address ? "yes" : "no");
  Descriptor to = descriptor_of(local->address, kBytes), from = descriptor_of(remote, kBytes);
  auto local_list = reader->prepare_local({&to, 1});
  auto remote_list = reader->prepare_remote("owner", {&from, 1});
  ASSERT_TRUE(local_list && remote_list);
  auto request = reader->make_request(Operation::Read, *local_list, {}, *remote_list, {});
  ASSERT_TRUE(request && reader->post(*request));
  const RequestId id = *request;
  ASSERT_TRUE(wait_driving(*reader, *owner, {&id, 1}, Deadline::after_seconds(10)));
  EXPECT_EQ(std::memcmp(local->address, remote, kBytes), 0);
  ASSERT_TRUE(reader->release(*request));
}

TEST(UcxAllocateMemory, AllocatedRegionsTransferAndFree) {
  long lazy = -1, eager = -1;
  allocated_regions_transfer_and_free(false, &lazy);
  allocated_regions_transfer_and_free(true, &eager);
  std::printf("page faults during a 1 MiB READ: %ld mapping on first use, %ld mapping eagerly\n", lazy, eager);
  if (std::getenv("UCX_TLS") && std::string(std::getenv("UCX_TLS")).find("posix") != std::string::npos) {
    // The 256 source pages fault in during the READ unless mapped up front.
    EXPECT_GE(lazy, 200);
    EXPECT_LT(eager, 64);
  }
}

}  // namespace
}  // namespace eplb::xfer::testing
