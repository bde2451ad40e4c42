// Helpers for bootstrap tests: ranks as forked processes, deterministic
// contents, and a bounded wait for children.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "eplb/bootstrap.h"

namespace eplb::testing {

// `length` bytes that depend on (rank, round): a result that holds the wrong
// rank's bytes, or truncated bytes, is caught.
inline std::string contribution(int rank, int round, size_t length) {
  std::string bytes(length, '\0');
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<char>((rank * 31 + round * 7 + i * 13) & 0xff);
  return bytes;
}

inline std::string make_temp_dir() {
  char pattern[] = "/tmp/eplb-test-XXXXXX";
  if (!::mkdtemp(pattern)) std::abort();
  return pattern;
}

// Waits for `pids` (bounded); kills whatever is left when the bound passes.
// Returns exit codes (128+signal for signalled, -1 if it had to be killed).
inline std::vector<int> wait_children(const std::vector<pid_t>& pids, double bound_seconds) {
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  Deadline bound = Deadline::after_seconds(bound_seconds);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        done[i] = true;
        --left;
      }
    }
    if (left == 0) break;
    if (bound.expired()) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids[i], SIGKILL);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes;
}

// Forks `size` ranks of a local group in a fresh rendezvous directory; each
// runs body(group) and exits with its return value (100 + code if the group
// could not be created). Returns the pids; the directory is removed by the
// caller via `dir`.
inline std::vector<pid_t> fork_local_ranks(int size, const std::string& dir,
                                           const std::function<int(ProcessGroup&)>& body) {
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int rank = 0; rank < size; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      LocalGroupOptions options;
      options.rank = rank;
      options.size = size;
      options.rendezvous_dir = dir;
      options.connect_timeout_seconds = 10;
      auto group = make_local_group(options);
      if (!group.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, group.status().to_string().c_str());
        ::_exit(100 + static_cast<int>(group.status().code()));
      }
      int code = body(**group);
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  return pids;
}

// In a child: report and return `code` when `status` does not match.
inline int expect_failure(const Status& status, Code code, const std::vector<std::string>& needles, int rank,
                          int fail_code) {
  bool ok = status.code() == code;
  for (const auto& needle : needles) ok = ok && status.message().find(needle) != std::string::npos;
  if (!ok) std::fprintf(stderr, "rank %d: unexpected status: %s\n", rank, status.to_string().c_str());
  else std::fprintf(stderr, "rank %d (expected): %s\n", rank, status.to_string().c_str());
  return ok ? 0 : fail_code;
}

}  // namespace eplb::testing
