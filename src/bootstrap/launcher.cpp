// launch_local_ranks: starts `size` copies of a program with the local
// bootstrap environment, waits for them with a deadline, stops the
// survivors `grace` seconds after the first failure, forwards SIGINT and
// SIGTERM, and removes the private rendezvous directory.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "connection.h"
#include "eplb/bootstrap.h"

extern char** environ;

namespace eplb {
namespace {

std::atomic<int> g_received_signal{0};
constexpr double kCauseWindowSeconds = 0.5;

extern "C" void remember_signal(int signal_number) { g_received_signal.store(signal_number); }

// Installs the forwarding handlers for the duration of a launch.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_received_signal.store(0);
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_handler = remember_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_;
  struct sigaction old_term_;
};

std::string signal_text(int signal_number) {
  const char* name = sigabbrev_np(signal_number);
  return "signal " + std::to_string(signal_number) + (name ? std::string(" (SIG") + name + ")" : std::string());
}

std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;
}

Result<std::string> make_rendezvous_dir() {
  std::string base = "/tmp";
  if (const char* tmp = std::getenv("TMPDIR"); tmp && *tmp && std::strlen(tmp) < 60) base = tmp;
  std::string pattern = base + "/eplb-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data()))
    return error(Code::IoError, "cannot create a rendezvous directory " + pattern + ": " + std::strerror(errno));
  return std::string(buffer.data());
}

// Child exit status -> the eplb CLI convention (see src/cli/command.h).
Code code_for_exit(int exit_code, bool signalled) {
  if (signalled) return Code::RemoteDisconnect;
  switch (exit_code) {
    case 2: return Code::InvalidArgument;
    case 3: return Code::ParseError;
    case 4: return Code::Timeout;
    case 5: return Code::RemoteDisconnect;
    default: return Code::Aborted;
  }
}

}  // namespace

Result<LaunchResult> launch_local_ranks(int size, const std::vector<std::string>& argv, Deadline deadline,
                                        double grace_seconds, LaunchResult* outcome) {
  if (size < 1 || size > 4096)
    return error(Code::InvalidArgument, "cannot launch " + std::to_string(size) + " ranks (1..4096)");
  if (argv.empty() || argv[0].empty()) return error(Code::InvalidArgument, "launch: no program given");
  if (!(grace_seconds >= 0)) grace_seconds = 0;
  EPLB_ASSIGN_OR_RETURN(std::string dir, make_rendezvous_dir());
  struct DirGuard {
    std::string path;
    ~DirGuard() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } dir_guard{dir};

  const std::string program = find_executable(argv[0]);
  std::vector<char*> child_argv;
  for (const auto& arg : argv) child_argv.push_back(const_cast<char*>(arg.c_str()));
  child_argv.push_back(nullptr);
  // Environment of every rank: ours minus the three variables, plus them.
  std::vector<std::string> base_env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    if (text.starts_with("EPLB_RANK=") || text.starts_with("EPLB_SIZE=") || text.starts_with("EPLB_BOOTSTRAP_DIR="))
      continue;
    base_env.emplace_back(text);
  }
  base_env.push_back("EPLB_SIZE=" + std::to_string(size));
  base_env.push_back("EPLB_BOOTSTRAP_DIR=" + dir);

  SignalForwarding forwarding;
  LaunchResult result;
  result.exit_codes.assign(static_cast<size_t>(size), -1);
  std::vector<pid_t> pids(static_cast<size_t>(size), -1);
  Stopwatch elapsed;
  const pid_t parent = ::getpid();

  auto kill_all = [&](int signal_number) {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, signal_number);
  };
  auto reap_all_bounded = [&] {
    Deadline bound = Deadline::after_seconds(5);
    for (int r = 0; r < size; ++r) {
      while (pids[r] > 0) {
        int status = 0;
        pid_t got = ::waitpid(pids[r], &status, WNOHANG);
        if (got == pids[r] || (got < 0 && errno == ECHILD)) {
          result.exit_codes[r] = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
          pids[r] = -1;
        } else if (bound.expired()) {
          break;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
    }
  };

  for (int r = 0; r < size; ++r) {
    std::vector<std::string> env = base_env;
    env.push_back("EPLB_RANK=" + std::to_string(r));
    std::vector<char*> child_env;
    for (auto& entry : env) child_env.push_back(entry.data());
    child_env.push_back(nullptr);
    int exec_errors[2];
    if (::pipe2(exec_errors, O_CLOEXEC) != 0) {
      kill_all(SIGKILL);
      reap_all_bounded();
      return error(Code::IoError, std::string("launch: pipe: ") + std::strerror(errno));
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      int saved = errno;
      ::close(exec_errors[0]);
      ::close(exec_errors[1]);
      kill_all(SIGKILL);
      reap_all_bounded();
      return error(Code::IoError, "launch: fork of rank " + std::to_string(r) + ": " + std::strerror(saved));
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      ::close(exec_errors[0]);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (::getppid() != parent) ::_exit(127);
      ::execve(program.c_str(), child_argv.data(), child_env.data());
      int saved = errno;
      ssize_t ignored = ::write(exec_errors[1], &saved, sizeof saved);
      (void)ignored;
      ::_exit(127);
    }
    pids[r] = pid;
    ::close(exec_errors[1]);
    int child_errno = 0;
    ssize_t got;
    do {
      got = ::read(exec_errors[0], &child_errno, sizeof child_errno);
    } while (got < 0 && errno == EINTR);
    ::close(exec_errors[0]);
    if (got == static_cast<ssize_t>(sizeof child_errno)) {
      kill_all(SIGKILL);
      reap_all_bounded();
      if (outcome) *outcome = result;
      return error(child_errno == ENOENT ? Code::NotFound : Code::IoError,
                   "launch: cannot execute '" + program + "' for rank " + std::to_string(r) + ": " +
                       std::strerror(child_errno));
    }
  }

  int first_failed = -1;
  double first_failed_at = 0;
  bool killed_survivors = false, timed_out = false;
  int forwarded_signal = 0;
  std::vector<int> killed_ranks;
  std::vector<int> statuses(static_cast<size_t>(size), 0);
  Clock::time_point kill_at = Clock::time_point::max();
  int live = size;
  while (live > 0) {
    bool reaped = false;
    std::vector<int> newly_failed;
    for (int r = 0; r < size; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got != pids[r]) continue;
      statuses[r] = status;
      pids[r] = -1;
      --live;
      reaped = true;
      result.exit_codes[r] = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      if (result.exit_codes[r] != 0) newly_failed.push_back(r);
    }
    if (!newly_failed.empty() && !killed_survivors && forwarded_signal == 0) {
      // The likely cause first: a signal, then an error of its own, then a timeout
      // or a lost peer (which usually report another rank). Ranks reaped within
      // kCauseWindowSeconds of the first failure compete: a dying rank can close
      // its sockets, and the peers that notice can exit, before it is reapable.
      auto cause_rank = [&](int r) {
        int code = result.exit_codes[r];
        return WIFSIGNALED(statuses[r]) ? 0 : code == 4 ? 2 : code == 5 ? 3 : 1;
      };
      int best = *std::min_element(newly_failed.begin(), newly_failed.end(), [&](int a, int b) {
        return std::make_pair(cause_rank(a), a) < std::make_pair(cause_rank(b), b);
      });
      if (first_failed < 0) {
        first_failed = best;
        first_failed_at = elapsed.seconds();
        kill_at = std::min(deadline.at(),
                           Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(grace_seconds * 1e9)));
      } else if (elapsed.seconds() - first_failed_at <= kCauseWindowSeconds &&
                 cause_rank(best) < cause_rank(first_failed)) {
        first_failed = best;
      }
    }
    if (live == 0) break;
    if (int signal_number = g_received_signal.exchange(0); signal_number != 0) {
      forwarded_signal = signal_number;
      kill_all(signal_number);
      kill_at = std::min(kill_at, Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(grace_seconds * 1e9)));
    }
    bool past_deadline = deadline.expired();
    if (!killed_survivors && (Clock::now() >= kill_at || past_deadline)) {
      timed_out = past_deadline && first_failed < 0 && forwarded_signal == 0;
      for (int r = 0; r < size; ++r)
        if (pids[r] > 0) killed_ranks.push_back(r);
      kill_all(SIGKILL);
      killed_survivors = true;
      reap_all_bounded();
      break;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < size; ++r) {
    if (pids[r] > 0) {
      if (outcome) *outcome = result;
      return error(Code::Internal, "launch: rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) +
                                       ") did not exit 5 s after SIGKILL");
    }
  }
  if (outcome) *outcome = result;

  std::string codes = "exit codes by rank:";
  for (int code : result.exit_codes) codes.append(" ").append(std::to_string(code));
  std::string killed_text;
  if (!killed_ranks.empty())
    killed_text = "; ranks " + bootstrap::rank_list(killed_ranks) + " were still running and were killed";
  if (forwarded_signal != 0)
    return error(Code::Canceled, "launch interrupted by " + signal_text(forwarded_signal) +
                                     ", forwarded to the ranks" + killed_text + " (" + codes + ")");
  if (timed_out)
    return error(Code::Timeout, "launch: ranks still running after " + format_seconds(elapsed.seconds()) +
                                    " (the deadline)" + killed_text + " (" + codes + ")");
  if (first_failed >= 0) {
    int code = result.exit_codes[first_failed];
    bool signalled = WIFSIGNALED(statuses[first_failed]);
    std::string how = signalled ? "was killed by " + signal_text(code - 128)
                                : "failed with exit code " + std::to_string(code);
    return error(code_for_exit(code, signalled),
                 "rank " + std::to_string(first_failed) + " " + how + " after " + format_seconds(first_failed_at) +
                     killed_text + (killed_ranks.empty() ? "" : " after the " + format_seconds(grace_seconds) + " grace period") +
                     " (" + codes + ")");
  }
  return result;
}

}  // namespace eplb
