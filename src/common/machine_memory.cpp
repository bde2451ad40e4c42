// machine_memory.cpp - what this machine can give (MemAvailable, /dev/shm's
// free space) and the one admission rule for a process's allocation
// (include/eplb/common.h).
#include <fmt/format.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "text.h"
#include "eplb/common.h"

namespace eplb {
namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when the kernel does not say.
uint64_t meminfo_available() {
  std::ifstream file("/proc/meminfo");
  std::string key, unit;
  uint64_t kibibytes = 0;
  while (file >> key >> kibibytes) {
    std::getline(file, unit);
    if (key == "MemAvailable:") return kibibytes * 1024;
  }
  return 0;
}

// A test hook's byte size (EPLB_TEST_MEMAVAILABLE, EPLB_TEST_SHM_FREE), or
// nullopt when unset.
Result<std::optional<uint64_t>> test_override(const char* variable) {
  const char* text = std::getenv(variable);
  if (!text) return std::optional<uint64_t>();
  auto bytes = parse_byte_size(text);
  if (!bytes) return bytes.status().with_context(variable);
  return std::optional<uint64_t>(*bytes);
}

}  // namespace

Result<MachineMemory> read_machine_memory(const std::string& shm_dir) {
  MachineMemory machine;
  machine.available_bytes = meminfo_available();
  struct statvfs shm;
  if (::statvfs(shm_dir.c_str(), &shm) == 0) machine.shm_free_bytes = uint64_t(shm.f_bavail) * shm.f_frsize;
  EPLB_ASSIGN_OR_RETURN(auto fake_available, test_override("EPLB_TEST_MEMAVAILABLE"));
  EPLB_ASSIGN_OR_RETURN(auto fake_shm_free, test_override("EPLB_TEST_SHM_FREE"));
  if (fake_available) machine.available_bytes = *fake_available;
  if (fake_shm_free) machine.shm_free_bytes = *fake_shm_free;
  machine.source = fake_available || fake_shm_free ? "EPLB_TEST_MEMAVAILABLE/EPLB_TEST_SHM_FREE" : "/proc/meminfo, " + shm_dir;
  return machine;
}

Status admit_bytes(uint64_t bytes, bool shared_memory, std::string_view what, const MachineMemory& machine) {
  const uint64_t ram_limit = machine.available_bytes / 10 * kAdmissionPercent;
  if (machine.available_bytes > 0 && bytes > ram_limit)
    return error(Code::InvalidArgument,
                 fmt::format("memory admission: {} of {} is more than {}% of MemAvailable {} ({}); nothing was "
                             "allocated",
                             what, format_bytes(bytes), kAdmissionPercent * 10, format_bytes(machine.available_bytes),
                             machine.source));
  const uint64_t shm_limit = machine.shm_free_bytes / 10 * kAdmissionPercent;
  if (shared_memory && machine.shm_free_bytes > 0 && bytes > shm_limit)
    return error(Code::InvalidArgument,
                 fmt::format("memory admission: {} of {} (shared memory) is more than {}% of the {} free in "
                             "/dev/shm ({}); nothing was allocated",
                             what, format_bytes(bytes), kAdmissionPercent * 10, format_bytes(machine.shm_free_bytes),
                             machine.source));
  return Status::ok();
}

Status admit_allocation(uint64_t bytes, bool shared_memory, std::string_view what) {
  EPLB_ASSIGN_OR_RETURN(MachineMemory machine, read_machine_memory());
  return admit_bytes(bytes, shared_memory, what, machine);
}

}  // namespace eplb
