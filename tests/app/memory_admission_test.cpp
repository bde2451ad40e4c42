// Memory admission of `eplb run`: the arithmetic of what a rank allocates
// and the refusal against a (fake) machine, and the CLI refusing a 64 GiB
// expert fast through the EPLB_TEST_MEMAVAILABLE hook.
#include <gtest/gtest.h>

#include <string>

#include "../support/cli_support.h"
#include "eplb/app.h"

namespace eplb {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(MemoryAdmission, ArenaAndStagingArePageAlignedPerTensorBlock) {
  // 2 layers x 3 slots x [1000 B, 10 B]: blocks of 3000 and 30 B, each page aligned.
  StoreLayout layout = StoreLayout::uniform(2, 3, {{"w", 1000}, {"s", 10}});
  RankMemory memory = rank_memory(layout);
  EXPECT_EQ(memory.arena_bytes, 4u * 4096);
  EXPECT_EQ(memory.staging_bytes, 4096u);
  StoreLayout big = StoreLayout::uniform(8, 18, {{"w", 64 * kGiB}});
  EXPECT_EQ(rank_memory(big).arena_bytes, 8 * 18 * 64 * kGiB);
  EXPECT_EQ(rank_memory(big).staging_bytes, 18 * 64 * kGiB);
}

TEST(MemoryAdmission, RefusesMoreThanNinetyPercentOfMemAvailableNamingTheSizes) {
  RankMemory per_rank{1 * kGiB, 256 * kMiB};
  MachineMemory machine{8 * kGiB, 100 * kGiB, "test"};
  EXPECT_TRUE(admit_memory(per_rank, 4, true, machine).is_ok());  // 4 x 1.3 GiB = 5.25 GiB <= 7.2 GiB
  Status refused = admit_memory(per_rank, 6, true, machine);      // 7.875 GiB > 7.2 GiB
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.code(), Code::InvalidArgument);
  const std::string text = refused.to_string();
  EXPECT_NE(text.find("6 rank(s) x (1 GiB arena + 256 MiB staging + 64 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("MemAvailable 8 GiB"), std::string::npos) << text;
}

TEST(MemoryAdmission, RefusesArenasBeyondTheFreeSharedMemoryOnlyOverUcx) {
  RankMemory per_rank{3 * kGiB, 16 * kMiB};
  MachineMemory machine{64 * kGiB, 10 * kGiB, "test"};
  Status refused = admit_memory(per_rank, 4, true, machine);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.to_string().find("12 GiB = 4 rank(s) x 3 GiB arena in shared memory"), std::string::npos)
      << refused.to_string();
  EXPECT_NE(refused.to_string().find("10 GiB free in /dev/shm"), std::string::npos);
  EXPECT_TRUE(admit_memory(per_rank, 4, false, machine).is_ok());  // threads: private memory
}

// --commit swap doubles the arena (a spare buffer per layer): counted in
// memory and in /dev/shm, and named in the refusal.
TEST(MemoryAdmission, SwapSpareBuffersAreCounted) {
  StoreLayout layout = StoreLayout::uniform(2, 3, {{"w", 1000}, {"s", 10}});
  EXPECT_EQ(rank_memory(layout).spare_bytes, 0u);
  EXPECT_EQ(rank_memory(layout, true).spare_bytes, 4u * 4096);
  RankMemory per_rank{1 * kGiB, 256 * kMiB, 1 * kGiB};
  MachineMemory machine{8 * kGiB, 100 * kGiB, "test"};
  EXPECT_TRUE(admit_memory(per_rank, 3, true, machine).is_ok());  // 3 x 2.3 GiB = 6.9 GiB <= 7.2 GiB
  Status refused = admit_memory(per_rank, 4, true, machine);      // 9.25 GiB: refused (copy would fit)
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.to_string().find("1 GiB arena + 1 GiB spare buffers (--commit swap)"), std::string::npos)
      << refused.to_string();
  MachineMemory small_shm{64 * kGiB, 7 * kGiB, "test"};
  Status shm = admit_memory(per_rank, 4, true, small_shm);  // 4 x 2 GiB of arena with spares > 7 GiB
  ASSERT_FALSE(shm.is_ok());
  EXPECT_NE(shm.to_string().find("8 GiB = 4 rank(s) x 2 GiB arena with spares"), std::string::npos) << shm.to_string();
}

TEST(MemoryAdmission, UnknownMemoryIsNotARefusal) {
  EXPECT_TRUE(admit_memory({kGiB, kGiB}, 4, true, MachineMemory{}).is_ok());
}

TEST(MemoryAdmission, ReadsThisMachineAndTheTestHooks) {
  auto real = read_machine_memory();
  ASSERT_TRUE(real.is_ok());
  EXPECT_GT(real->available_bytes, 0u);
  EXPECT_GT(real->shm_free_bytes, 0u);
  ::setenv("EPLB_TEST_MEMAVAILABLE", "3GiB", 1);
  auto fake = read_machine_memory();
  ::unsetenv("EPLB_TEST_MEMAVAILABLE");
  ASSERT_TRUE(fake.is_ok());
  EXPECT_EQ(fake->available_bytes, 3 * kGiB);
  ::setenv("EPLB_TEST_SHM_FREE", "lots", 1);
  auto bad = read_machine_memory();
  ::unsetenv("EPLB_TEST_SHM_FREE");
  EXPECT_FALSE(bad.is_ok());
}

TEST(MemoryAdmissionCli, SixtyFourGibibyteExpertsAreRefusedWithinASecond) {
  auto outcome = testing_support::run_bounded(std::string(EPLB_BINARY_DIR) + "/eplb run --bytes-per-expert 64GiB",
                                              "EPLB_TEST_MEMAVAILABLE=24GiB", 30);
  EXPECT_EQ(outcome.exit_code, 2) << outcome.output;
  EXPECT_LT(outcome.seconds, 1.0) << outcome.output;
  EXPECT_NE(outcome.output.find("memory admission"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("MemAvailable 24 GiB"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("9 TiB arena"), std::string::npos) << outcome.output;
  EXPECT_EQ(outcome.output.find("rank 0"), std::string::npos) << "no rank may start: " << outcome.output;
  // The same over UCX without the hook: this machine refuses it too.
  auto real = testing_support::run_bounded(std::string(EPLB_BINARY_DIR) + "/eplb run --bytes-per-expert 64GiB", "", 30);
  EXPECT_EQ(real.exit_code, 2) << real.output;
  EXPECT_LT(real.seconds, 1.0) << real.output;
  // Loopback threads are admitted the same way.
  auto threads = testing_support::run_bounded(
      std::string(EPLB_BINARY_DIR) + "/eplb run --transport loopback --bytes-per-expert 64MiB",
      "EPLB_TEST_MEMAVAILABLE=1GiB", 30);
  EXPECT_EQ(threads.exit_code, 2) << threads.output;
  EXPECT_NE(threads.output.find("4 rank(s) x (9"), std::string::npos) << threads.output;
  // --commit swap: the same experts need the spare buffers too.
  auto swap = testing_support::run_bounded(
      std::string(EPLB_BINARY_DIR) + "/eplb run --async --commit swap --bytes-per-expert 1GiB",
      "EPLB_TEST_MEMAVAILABLE=1TiB", 30);  // copy would fit: 4 x 162 GiB
  EXPECT_EQ(swap.exit_code, 2) << swap.output;
  EXPECT_NE(swap.output.find("spare buffers (--commit swap)"), std::string::npos) << swap.output;
}

}  // namespace
}  // namespace eplb
