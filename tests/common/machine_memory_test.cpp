// The one memory admission rule (eplb/common.h): an allocation may take at
// most 90% of MemAvailable, and 90% of /dev/shm's free space when it is
// shared memory; the limits are simulated through the test hooks, nothing
// is allocated.
#include <gtest/gtest.h>

#include <cstdlib>

#include "eplb/common.h"

namespace eplb {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(MemoryAdmission, PrivateMemoryMustFitNinetyPercentOfMemAvailable) {
  const MachineMemory machine{10 * kGiB, kGiB, "test"};
  EXPECT_TRUE(admit_bytes(9 * kGiB, false, "spares", machine).is_ok());
  Status refused = admit_bytes(9 * kGiB + 1, false, "spares", machine);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.code(), Code::InvalidArgument);
  EXPECT_NE(refused.message().find("spares of 9.0 GiB"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("90% of MemAvailable 10 GiB"), std::string::npos) << refused.message();
}

TEST(MemoryAdmission, SharedMemoryMustAlsoFitTheFreeSpaceOfDevShm) {
  const MachineMemory machine{100 * kGiB, 2 * kGiB, "test"};
  EXPECT_TRUE(admit_bytes(3 * kGiB, false, "heap", machine).is_ok());
  Status refused = admit_bytes(3 * kGiB, true, "transfer memory", machine);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.message().find("free in /dev/shm"), std::string::npos) << refused.message();
  EXPECT_TRUE(admit_bytes(1 * kGiB, true, "transfer memory", machine).is_ok());
}

TEST(MemoryAdmission, UnknownLimitsAdmit) {
  EXPECT_TRUE(admit_bytes(uint64_t{1} << 50, true, "anything", MachineMemory{}).is_ok());
}

TEST(MemoryAdmission, TheTestHooksSimulateTheMachine) {
  ::setenv("EPLB_TEST_MEMAVAILABLE", "1GiB", 1);
  ::setenv("EPLB_TEST_SHM_FREE", "512MiB", 1);
  Status one_tebibyte = admit_allocation(uint64_t{1} << 40, true, "eplb.empty");
  Status shm = admit_allocation(uint64_t{600} << 20, true, "eplb.empty");
  Status heap = admit_allocation(uint64_t{600} << 20, false, "heap");
  ::unsetenv("EPLB_TEST_MEMAVAILABLE");
  ::unsetenv("EPLB_TEST_SHM_FREE");
  EXPECT_FALSE(one_tebibyte);
  EXPECT_FALSE(shm);
  EXPECT_TRUE(heap) << heap.to_string();
  ::setenv("EPLB_TEST_MEMAVAILABLE", "lots", 1);
  Status bad = admit_allocation(1, false, "x");
  ::unsetenv("EPLB_TEST_MEMAVAILABLE");
  EXPECT_FALSE(bad);
  EXPECT_NE(bad.message().find("EPLB_TEST_MEMAVAILABLE"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace eplb
