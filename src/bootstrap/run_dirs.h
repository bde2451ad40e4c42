// run_dirs.h (internal) - the private directories of one launch and the
// sweep of those a dead launcher left behind.
//
// A launch owns two directories, both mode 0700 and named eplb-XXXXXX: the
// rendezvous directory under $TMPDIR (or /tmp) for the bootstrap sockets,
// and a scratch directory under /dev/shm for UCX's posix shared-memory files
// (UCX_POSIX_DIR in the ranks' environment). Each holds a file `owner`
// with "<launcher pid> <its start time in clock ticks> <its pid namespace>". RunDirs removes
// both when destroyed; sweep_stale_run_dirs removes the eplb-* directories
// of this user whose owner process is gone (SIGKILL of a launcher).
#pragma once

#include <string>
#include <sys/types.h>

#include <memory>
#include <vector>

#include "eplb/status.h"

namespace eplb::bootstrap {

class RunDirs {
 public:
  RunDirs() = default;
  RunDirs(const RunDirs&) = delete;
  RunDirs& operator=(const RunDirs&) = delete;
  ~RunDirs();
  // The rendezvous directory (required) and the shared-memory scratch
  // directory (empty when /dev/shm is not usable).
  static Result<std::unique_ptr<RunDirs>> create();
  const std::string& rendezvous() const { return rendezvous_; }
  const std::string& shared_memory() const { return shared_memory_; }

 private:
  std::string rendezvous_;
  std::string shared_memory_;
};

// The base directory of rendezvous directories: $TMPDIR when set and short, else /tmp.
std::string rendezvous_base();
// The fields of /proc/<pid>/stat from the state on (index 0 = state,
// 1 = parent pid, 19 = start time); empty when the process is gone.
std::vector<std::string> process_stat_fields(pid_t pid);
// "<pid> <start time>" of a live process, "" when it is gone.
std::string process_identity(pid_t pid);
// This process's pid namespace ("pid:[4026531836]"); a directory owned by
// a launcher of another namespace is never swept (its pid means nothing here).
std::string pid_namespace();
// The owner file's line for this process: "<pid> <start time> <pid namespace>".
std::string owner_line();
// Removes the eplb-* directories of this user under `bases` whose owner file
// names a process that is gone; returns how many were removed. Directories
// without an owner file are left alone (being created, or another release's).
int sweep_stale_run_dirs(const std::vector<std::string>& bases);

}  // namespace eplb::bootstrap
