// `eplb run` leaves nothing behind and lets nobody else in: UCX's posix
// files live in the run's private /dev/shm directory (0700, files 0600) and
// vanish when a rank is SIGKILLed mid-run; the System V segments of the
// ranks are 0600; a SIGKILLed launcher's directories are swept by the next
// launch; a forged hello during start-up is dropped and the run succeeds.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/cli_support.h"
#include "eplb/common.h"

namespace {

using eplb::Deadline;
namespace fs = std::filesystem;
using eplb::testing_support::kSmallRun;
// The small shape without its --rounds, for runs that set their own.
const std::string kShapeWithoutRounds = kSmallRun.substr(0, kSmallRun.find(" --rounds"));

// One `eplb run` started in the background: its pid is the launcher's.
class BackgroundRun {
 public:
  BackgroundRun(const std::string& arguments, const std::vector<std::string>& environment, const std::string& log) {
    pid_ = ::fork();
    if (pid_ != 0) return;
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& entry : environment) ::putenv(const_cast<char*>(entry.c_str()));
    const std::string command = "exec " EPLB_BINARY_DIR "/eplb run " + arguments;
    ::execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    ::_exit(127);
  }
  ~BackgroundRun() {
    if (pid_ > 0 && exit_code_ < 0) {
      ::kill(pid_, SIGKILL);
      wait(5);
    }
  }
  pid_t pid() const { return pid_; }
  // The exit code (128 + signal), or -1 when still running after `seconds`.
  int wait(double seconds) {
    Deadline deadline = Deadline::after_seconds(seconds);
    while (exit_code_ < 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_)
        exit_code_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      else if (deadline.expired())
        break;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

// The eplb-* directory under `base` whose owner file names `pid`, or "".
std::string owned_dir(const std::string& base, pid_t pid) {
  for (const auto& entry : fs::directory_iterator(base)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("eplb-")) continue;
    std::ifstream owner(entry.path() / "owner");
    pid_t owner_pid = 0;
    if (owner >> owner_pid && owner_pid == pid) return entry.path().string();
  }
  return "";
}

// Polls `condition` every 2 ms for up to `seconds`.
template <typename Condition>
bool eventually(Condition condition, double seconds) {
  Deadline deadline = Deadline::after_seconds(seconds);
  while (!condition()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  for (pid_t child; file >> child;) children.push_back(child);
  return children;
}

class RunCleanup : public eplb::testing_support::TempDirTest {};

TEST_F(RunCleanup, KilledRankLeavesNoPosixFilesAndTheyWerePrivate) {
  BackgroundRun run("--ranks 4 --nodes 2 --timeout 3 --rounds 2 --experts 16 --replicas 24 --groups 4 --layers 4 "
                    "--bytes-per-expert 4MiB",
                    {"UCX_TLS=posix,cma,self", "EPLB_TEST_KILL_RANK_AT_LAYER=1:2"}, file("log"));
  std::string shm_dir;
  ASSERT_TRUE(eventually([&] { return !(shm_dir = owned_dir("/dev/shm", run.pid())).empty(); }, 20));
  // UCX's posix files are created in the private directory (the ranks map
  // them from there; UCX unlinks a file soon after creating it, so look at
  // the ranks' mappings), 0600 when caught in the listing, in a 0700 directory.
  bool private_modes = true;
  bool mapped_from_private_dir = false;
  eventually([&] {
    std::error_code missing;
    for (const auto& entry : fs::directory_iterator(shm_dir, missing)) {
      struct stat info;
      if (entry.path().filename() != "owner" && ::stat(entry.path().c_str(), &info) == 0 && (info.st_mode & 077) != 0)
        private_modes = false;
    }
    for (pid_t rank : children_of(run.pid())) {
      std::ifstream maps("/proc/" + std::to_string(rank) + "/maps");
      std::string line;
      while (std::getline(maps, line))
        if (line.find(shm_dir + "/ucx_shm_posix") != std::string::npos) mapped_from_private_dir = true;
    }
    return mapped_from_private_dir || missing;
  }, 30);
  struct stat dir_info;
  if (::stat(shm_dir.c_str(), &dir_info) == 0) {
    EXPECT_EQ(dir_info.st_mode & 0777, 0700u);
  }
  EXPECT_TRUE(mapped_from_private_dir) << "no rank maps a UCX posix file of " << shm_dir;
  EXPECT_TRUE(private_modes);
  const int code = run.wait(60);
  EXPECT_NE(code, 0) << eplb::testing_support::slurp(file("log"));
  EXPECT_NE(code, -1);
  EXPECT_FALSE(fs::exists(shm_dir)) << shm_dir << " left behind";
  EXPECT_EQ(owned_dir("/tmp", run.pid()), "");
  EXPECT_NE(eplb::testing_support::slurp(file("log")).find("rank 1"), std::string::npos);
}

TEST_F(RunCleanup, SysvSegmentsOfTheRanksAreOwnerOnly) {
  BackgroundRun run("--ranks 2 --nodes 1 --rounds 3" + kShapeWithoutRounds,
                    {"UCX_TLS=sysv,cma,self", "EPLB_TEST_SIGNAL=0:2:STOP"}, file("log"));
  // Rank 0 stops itself at layer 2: the segments are live while we look.
  std::vector<pid_t> ranks;
  ASSERT_TRUE(eventually([&] { return (ranks = children_of(run.pid())).size() == 2; }, 20));
  std::ifstream stat_file("/proc/" + std::to_string(ranks[0]) + "/stat");
  ASSERT_TRUE(eventually([&] {
    std::ifstream status("/proc/" + std::to_string(ranks[0]) + "/stat");
    std::string line;
    std::getline(status, line);
    return line.find(") T ") != std::string::npos;
  }, 30));
  std::ifstream table("/proc/sysvipc/shm");
  std::string line;
  std::getline(table, line);
  int of_ranks = 0;
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    long key, shmid, size, creator;
    unsigned mode;
    fields >> key >> shmid >> std::oct >> mode >> std::dec >> size >> creator;
    if (std::find(ranks.begin(), ranks.end(), pid_t(creator)) == ranks.end()) continue;
    ++of_ranks;
    EXPECT_EQ(mode & 0777, 0600u) << line;
  }
  EXPECT_GT(of_ranks, 0);
  ::kill(run.pid(), SIGTERM);
  for (pid_t rank : ranks) ::kill(rank, SIGCONT);
  EXPECT_NE(run.wait(30), -1);
}

TEST_F(RunCleanup, KilledLauncherLeavesDirectoriesTheNextLaunchSweeps) {
  const std::string tmp = "TMPDIR=" + dir_;
  BackgroundRun first("--ranks 2 --nodes 1 --rounds 50" + kShapeWithoutRounds, {tmp},
                      file("log1"));
  std::string rendezvous, scratch;
  ASSERT_TRUE(eventually([&] { return !(rendezvous = owned_dir(dir_, first.pid())).empty(); }, 20));
  ASSERT_TRUE(eventually([&] { return !(scratch = owned_dir("/dev/shm", first.pid())).empty(); }, 20));
  std::vector<pid_t> ranks = children_of(first.pid());
  ::kill(first.pid(), SIGKILL);
  EXPECT_EQ(first.wait(10), 128 + SIGKILL);
  // The ranks die with their launcher (PR_SET_PDEATHSIG); the directories stay until the next launch.
  EXPECT_TRUE(eventually([&] {
    for (pid_t rank : ranks)
      if (::kill(rank, 0) == 0) return false;
    return true;
  }, 10));
  EXPECT_TRUE(fs::exists(rendezvous));
  BackgroundRun second("--ranks 2 --nodes 1 --transport shm" + kSmallRun, {tmp}, file("log2"));
  EXPECT_EQ(second.wait(90), 0) << eplb::testing_support::slurp(file("log2"));
  EXPECT_FALSE(fs::exists(rendezvous)) << rendezvous;
  EXPECT_FALSE(fs::exists(scratch)) << scratch;
  EXPECT_EQ(owned_dir(dir_, second.pid()), "");
  EXPECT_EQ(owned_dir("/dev/shm", second.pid()), "");
}

// Sends a hello claiming rank 1, as a process of the same user that the
// launcher did not start; returns true when the hub closed the connection.
bool forge_hello(const std::string& socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof address.sun_path - 1);
  // The socket file appears at bind(), before listen(): until then connect()
  // is refused, so retry for a while (a loaded machine can sit in between).
  int fd = -1;
  const bool connected = eventually([&] {
    if (fd >= 0) ::close(fd);
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }, 10);
  if (!connected) {
    ::close(fd);
    return false;
  }
  // Version 2 header, kind hello, sender 1, then size 4, a pid and a made-up secret.
  std::string message("EPBS\x02\x00\x01\x00", 8);
  message += std::string(8, '\0') + std::string("\x01\x00\x00\x00", 4) + std::string(4, '\0');
  message += std::string("\x28\x00\x00\x00\x00\x00\x00\x00", 8);
  message += std::string("\x04\x00\x00\x00\x39\x30\x00\x00", 8) + std::string(32, 'F');
  (void)::send(fd, message.data(), message.size(), MSG_NOSIGNAL);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  char byte;
  // EOF, or a reset when the hub closed before reading what we sent.
  const ssize_t got = ::recv(fd, &byte, 1, 0);
  const bool closed = got == 0 || (got < 0 && errno == ECONNRESET);
  ::close(fd);
  return closed;
}

TEST_F(RunCleanup, ForgedHelloDuringStartUpIsDroppedAndTheRunSucceeds) {
  BackgroundRun run("--ranks 4 --nodes 2 --json " + file("report.json") + kSmallRun,
                    {"TMPDIR=" + dir_, "EPLB_TEST_JOIN_DELAY=1:1500"}, file("log"));
  std::string rendezvous;
  ASSERT_TRUE(eventually([&] { return !(rendezvous = owned_dir(dir_, run.pid())).empty(); }, 20));
  ASSERT_TRUE(eventually([&] { return fs::exists(rendezvous + "/hub.sock"); }, 20));
  EXPECT_TRUE(forge_hello(rendezvous + "/hub.sock"));
  EXPECT_EQ(run.wait(90), 0) << eplb::testing_support::slurp(file("log"));
  const std::string log = eplb::testing_support::slurp(file("log"));
  EXPECT_NE(log.find("local bootstrap: dropped a connection from pid " + std::to_string(::getpid()) +
                     ", which the launcher"), std::string::npos) << log;
  EXPECT_NE(log.find("verified byte for byte"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(rendezvous));
}

}  // namespace
