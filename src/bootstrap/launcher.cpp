// launch_local_ranks: starts `size` copies of a program with the local
// group's environment, waits for them with a deadline, stops the survivors
// `grace` seconds after the first failure, forwards SIGINT and SIGTERM, and
// removes the private rendezvous directory. It knows nothing of what the
// ranks' exit codes mean beyond LaunchOptions::echo_exit_codes.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/text.h"
#include "connection.h"
#include "eplb/bootstrap.h"
#include "run_dirs.h"

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
  return fmt::format("signal {}{}", signal_number, name ? fmt::format(" (SIG{})", name) : std::string());
}

std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  for (std::string_view dir : text::split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string candidate = fmt::format("{}/{}", dir.empty() ? "." : dir, name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

bool is_launch_variable(std::string_view entry) {
  for (const char* name : {"EPLB_RANK=", "EPLB_SIZE=", "EPLB_BOOTSTRAP_DIR=", "EPLB_RUN_SECRET=", "EPLB_LAUNCHER_PID="})
    if (entry.starts_with(name)) return true;
  return false;
}

// Every rank's environment: ours without the local group's variables, plus
// them; UCX's posix files go to the run's scratch directory unless the user
// chose UCX_POSIX_DIR.
std::vector<std::string> rank_environment(int size, const bootstrap::RunDirs& dirs, const std::string& secret) {
  std::vector<std::string> env;
  bool user_posix_dir = false;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    if (is_launch_variable(text)) continue;
    user_posix_dir = user_posix_dir || text.starts_with("UCX_POSIX_DIR=");
    env.emplace_back(text);
  }
  env.push_back(fmt::format("EPLB_SIZE={}", size));
  env.push_back("EPLB_BOOTSTRAP_DIR=" + dirs.rendezvous());
  env.push_back("EPLB_RUN_SECRET=" + secret);
  env.push_back(fmt::format("EPLB_LAUNCHER_PID={}", ::getpid()));
  if (!user_posix_dir && !dirs.shared_memory().empty()) env.push_back("UCX_POSIX_DIR=" + dirs.shared_memory());
  return env;
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

// The ranks of one launch and what became of them.
class Launch {
 public:
  Launch(const LaunchOptions& options, std::string program, std::vector<std::string> env)
      : options_(options), program_(std::move(program)), env_(std::move(env)), parent_(::getpid()) {
    for (const auto& arg : options_.argv) argv_.push_back(const_cast<char*>(arg.c_str()));
    argv_.push_back(nullptr);
    pids_.assign(size_t(options_.size), -1);
    statuses_.assign(size_t(options_.size), 0);
    result_.exit_codes.assign(size_t(options_.size), -1);
    result_.pids.assign(size_t(options_.size), -1);
  }
  // Starts every rank; on a failure kills the ranks started so far.
  Status start_all();
  // Waits for the ranks: the deadline, the grace period, forwarded signals.
  void supervise();
  LaunchResult finish();

 private:
  Status start(int rank);
  std::vector<int> reap_exited();
  void note_failures(const std::vector<int>& newly_failed);
  int cause_priority(int rank) const;
  void kill_all(int signal_number);
  void reap_all_bounded();
  std::string survivors_text() const;

  const LaunchOptions& options_;
  std::string program_;
  std::vector<std::string> env_;
  std::vector<char*> argv_;
  const pid_t parent_;
  std::vector<pid_t> pids_;
  std::vector<int> statuses_;
  LaunchResult result_;
  Stopwatch elapsed_;
  int live_ = 0;
  int first_failed_ = -1;
  double first_failed_at_ = 0;
  bool killed_survivors_ = false, timed_out_ = false;
  int forwarded_signal_ = 0;
  std::vector<int> killed_ranks_;
  Clock::time_point kill_at_ = Clock::time_point::max();
};

Status Launch::start(int rank) {
  std::vector<std::string> env = env_;
  env.push_back(fmt::format("EPLB_RANK={}", rank));
  std::vector<char*> child_env;
  for (auto& entry : env) child_env.push_back(entry.data());
  child_env.push_back(nullptr);
  int exec_errors[2];
  if (::pipe2(exec_errors, O_CLOEXEC) != 0)
    return error(Code::IoError, fmt::format("launch: pipe: {}", std::strerror(errno)));
  pid_t pid = ::fork();
  if (pid < 0) {
    int saved = errno;
    ::close(exec_errors[0]);
    ::close(exec_errors[1]);
    return error(Code::IoError, fmt::format("launch: fork of rank {}: {}", rank, std::strerror(saved)));
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
    if (::getppid() != parent_) ::_exit(127);
    ::execve(program_.c_str(), argv_.data(), child_env.data());
    int saved = errno;
    ssize_t ignored = ::write(exec_errors[1], &saved, sizeof saved);
    (void)ignored;
    ::_exit(127);
  }
  pids_[rank] = pid;
  result_.pids[rank] = pid;
  ++live_;
  ::close(exec_errors[1]);
  int child_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_errors[0], &child_errno, sizeof child_errno);
  } while (got < 0 && errno == EINTR);
  ::close(exec_errors[0]);
  if (got != static_cast<ssize_t>(sizeof child_errno)) return Status::ok();
  return error(child_errno == ENOENT ? Code::NotFound : Code::IoError,
               fmt::format("launch: cannot execute '{}' for rank {}: {}", program_, rank, std::strerror(child_errno)));
}

Status Launch::start_all() {
  for (int r = 0; r < options_.size; ++r) {
    Status started = start(r);
    if (started.is_ok()) continue;
    kill_all(SIGKILL);
    reap_all_bounded();
    return started;
  }
  return Status::ok();
}

void Launch::kill_all(int signal_number) {
  for (pid_t pid : pids_)
    if (pid > 0) ::kill(pid, signal_number);
}

void Launch::reap_all_bounded() {
  Deadline bound = Deadline::after_seconds(5);
  for (int r = 0; r < options_.size; ++r) {
    while (pids_[r] > 0) {
      int status = 0;
      pid_t got = ::waitpid(pids_[r], &status, WNOHANG);
      if (got == pids_[r] || (got < 0 && errno == ECHILD)) {
        result_.exit_codes[r] = exit_code_of(status);
        pids_[r] = -1;
        --live_;
      } else if (bound.expired()) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
}

std::vector<int> Launch::reap_exited() {
  std::vector<int> newly_failed;
  for (int r = 0; r < options_.size; ++r) {
    if (pids_[r] <= 0) continue;
    int status = 0;
    if (::waitpid(pids_[r], &status, WNOHANG) != pids_[r]) continue;
    statuses_[r] = status;
    pids_[r] = -1;
    --live_;
    result_.exit_codes[r] = exit_code_of(status);
    if (result_.exit_codes[r] != 0) newly_failed.push_back(r);
  }
  return newly_failed;
}

// The likely cause first: a signal, then an error of its own, then an echo
// of another rank's failure.
int Launch::cause_priority(int rank) const {
  if (WIFSIGNALED(statuses_[rank])) return 0;
  const auto& echoes = options_.echo_exit_codes;
  auto echo = std::find(echoes.begin(), echoes.end(), result_.exit_codes[rank]);
  return echo == echoes.end() ? 1 : 2 + int(echo - echoes.begin());
}

// Ranks reaped within kCauseWindowSeconds of the first failure compete: a
// dying rank can close its sockets, and the peers that notice can exit,
// before it is reapable.
void Launch::note_failures(const std::vector<int>& newly_failed) {
  if (newly_failed.empty() || killed_survivors_ || forwarded_signal_ != 0) return;
  int best = *std::min_element(newly_failed.begin(), newly_failed.end(), [&](int a, int b) {
    return std::make_pair(cause_priority(a), a) < std::make_pair(cause_priority(b), b);
  });
  if (first_failed_ < 0) {
    first_failed_ = best;
    first_failed_at_ = elapsed_.seconds();
    kill_at_ = std::min(options_.deadline.at(),
                        Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(options_.grace_seconds * 1e9)));
  } else if (elapsed_.seconds() - first_failed_at_ <= kCauseWindowSeconds &&
             cause_priority(best) < cause_priority(first_failed_)) {
    first_failed_ = best;
  }
}

void Launch::supervise() {
  const auto grace = std::chrono::nanoseconds(static_cast<int64_t>(options_.grace_seconds * 1e9));
  while (live_ > 0) {
    std::vector<int> newly_failed = reap_exited();
    note_failures(newly_failed);
    if (live_ == 0) break;
    if (int signal_number = g_received_signal.exchange(0); signal_number != 0) {
      forwarded_signal_ = signal_number;
      kill_all(signal_number);
      kill_at_ = std::min(kill_at_, Clock::now() + grace);
    }
    bool past_deadline = options_.deadline.expired();
    if (Clock::now() >= kill_at_ || past_deadline) {
      timed_out_ = past_deadline && first_failed_ < 0 && forwarded_signal_ == 0;
      for (int r = 0; r < options_.size; ++r)
        if (pids_[r] > 0) killed_ranks_.push_back(r);
      kill_all(SIGKILL);
      killed_survivors_ = true;
      reap_all_bounded();
      return;
    }
    if (newly_failed.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string Launch::survivors_text() const {
  if (killed_ranks_.empty()) return "";
  return fmt::format("; ranks {} were still running and were killed", bootstrap::rank_list(killed_ranks_));
}

LaunchResult Launch::finish() {
  for (int r = 0; r < options_.size; ++r)
    if (pids_[r] > 0) {
      result_.status = error(Code::Internal, fmt::format("launch: rank {} (pid {}) did not exit 5 s after SIGKILL",
                                                         r, pids_[r]));
      return result_;
    }
  const std::string codes = fmt::format("exit codes by rank: {}", fmt::join(result_.exit_codes, " "));
  if (forwarded_signal_ != 0) {
    result_.forwarded_signal = forwarded_signal_;
    result_.status = error(Code::Canceled, fmt::format("launch interrupted by {}, forwarded to the ranks{} ({})",
                                                       signal_text(forwarded_signal_), survivors_text(), codes));
  } else if (timed_out_) {
    result_.status = error(Code::Timeout, fmt::format("launch: ranks still running after {} (the deadline){} ({})",
                                                      format_seconds(elapsed_.seconds()), survivors_text(), codes));
  } else if (first_failed_ >= 0) {
    const int code = result_.exit_codes[first_failed_];
    result_.failed_rank = first_failed_;
    result_.failed_rank_signalled = WIFSIGNALED(statuses_[first_failed_]);
    std::string how = result_.failed_rank_signalled ? "was killed by " + signal_text(code - 128)
                                                    : fmt::format("failed with exit code {}", code);
    result_.status = error(Code::Aborted, fmt::format("rank {} {} after {}{}{} ({})", first_failed_, how,
                                                      format_seconds(first_failed_at_), survivors_text(),
                                                      killed_ranks_.empty() ? "" : fmt::format(
                                                          " after the {} grace period",
                                                          format_seconds(options_.grace_seconds)),
                                                      codes));
  }
  return result_;
}

}  // namespace

// A fresh 256-bit secret as 64 hex digits (getrandom); eplb/bootstrap.h.
Result<std::string> make_run_secret() {
  uint8_t random[bootstrap::kRunSecretBytes];
  size_t filled = 0;
  while (filled < sizeof random) {
    ssize_t got = ::getrandom(random + filled, sizeof random - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return error(Code::IoError, fmt::format("run secret: getrandom: {}", std::strerror(errno)));
    filled += size_t(got);
  }
  std::string hex;
  for (uint8_t byte : random) hex += fmt::format("{:02x}", byte);
  return hex;
}

LaunchResult launch_local_ranks(const LaunchOptions& options) {
  LaunchResult refused;
  if (options.size < 1 || options.size > 4096) {
    refused.status = error(Code::InvalidArgument, fmt::format("cannot launch {} ranks (1..4096)", options.size));
    return refused;
  }
  if (options.argv.empty() || options.argv[0].empty()) {
    refused.status = error(Code::InvalidArgument, "launch: no program given");
    return refused;
  }
  LaunchOptions checked = options;
  if (!(checked.grace_seconds >= 0)) checked.grace_seconds = 0;
  // What a SIGKILLed launcher left behind goes first.
  bootstrap::sweep_stale_run_dirs({bootstrap::rendezvous_base(), "/dev/shm"});
  auto dirs = bootstrap::RunDirs::create();
  auto secret = make_run_secret();
  if (!dirs || !secret) {
    refused.status = !dirs ? dirs.status() : secret.status();
    return refused;
  }
  SignalForwarding forwarding;
  Launch launch(checked, find_executable(checked.argv[0]), rank_environment(checked.size, **dirs, *secret));
  if (Status started = launch.start_all(); !started.is_ok()) {
    LaunchResult result = launch.finish();
    result.status = started;
    return result;
  }
  launch.supervise();
  return launch.finish();
}

}  // namespace eplb
