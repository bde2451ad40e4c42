// Who may join a local group, and what a dead launcher leaves behind:
// a forged hello (wrong secret, claiming rank 1) is dropped with a log line
// and the group still forms; the hello format carries the secret; the sweep
// removes eplb-* directories whose owner process is gone and keeps the rest
// (alive, no owner file, another pid namespace, not eplb-*).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "../../src/bootstrap/message.h"
#include "../../src/bootstrap/run_dirs.h"
#include "eplb/bootstrap.h"
#include "test_support.h"

namespace eplb {
namespace {

const std::string kSecret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

// Connects to the hub socket in `dir` (retrying for up to 10 s); -1 on failure.
int connect_to_hub(const std::string& dir) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = dir + "/hub.sock";
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  Deadline deadline = Deadline::after_seconds(10);
  while (!deadline.expired()) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

// True when the peer closed `fd` within `seconds` (what a dropped joiner sees).
bool closed_by_peer(int fd, double seconds) {
  timeval timeout{static_cast<time_t>(seconds), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  char byte;
  return ::recv(fd, &byte, 1, 0) == 0;
}

TEST(JoinAdmission, ForgedHelloClaimingRankOneIsDroppedAndTheGroupForms) {
  const std::string dir = testing::make_temp_dir();
  std::mutex lines_lock;
  std::vector<std::string> dropped;
  auto options_for = [&](int rank) {
    LocalGroupOptions options;
    options.rank = rank;
    options.size = 2;
    options.rendezvous_dir = dir;
    options.connect_timeout_seconds = 15;
    options.secret = kSecret;
    options.on_dropped = [&](const std::string& line) {
      std::lock_guard lock(lines_lock);
      dropped.push_back(line);
    };
    return options;
  };
  Result<std::vector<std::string>> hub_result = error(Code::Internal, "not run");
  std::thread hub([&] {
    auto group = make_local_group(options_for(0));
    if (!group) hub_result = group.status();
    else hub_result = (*group)->allgather("zero", Deadline::after_seconds(10));
  });
  // The forger: same user, claims rank 1, knows everything but the secret.
  int forger = connect_to_hub(dir);
  ASSERT_GE(forger, 0);
  const std::string forged = bootstrap::encode_message(bootstrap::MessageKind::Hello, 0, 1,
                                                       bootstrap::encode_hello({2, 4242, std::string(32, 'x')}));
  ASSERT_EQ(::send(forger, forged.data(), forged.size(), MSG_NOSIGNAL), ssize_t(forged.size()));
  EXPECT_TRUE(closed_by_peer(forger, 10));
  ::close(forger);
  // The real rank 1 joins afterwards and the group works.
  auto member = make_local_group(options_for(1));
  ASSERT_TRUE(member.is_ok()) << member.status().to_string();
  auto mine = (*member)->allgather("one", Deadline::after_seconds(10));
  hub.join();
  ASSERT_TRUE(mine.is_ok()) << mine.status().to_string();
  ASSERT_TRUE(hub_result.is_ok()) << hub_result.status().to_string();
  EXPECT_EQ(*mine, (std::vector<std::string>{"zero", "one"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_NE(dropped[0].find("dropped a hello claiming rank 1 from pid 4242 without the run's secret"),
            std::string::npos) << dropped[0];
  std::filesystem::remove_all(dir);
}

TEST(JoinAdmission, MalformedHelloIsDroppedNotFatal) {
  const std::string dir = testing::make_temp_dir();
  std::vector<std::string> dropped;
  LocalGroupOptions hub_options{0, 2, dir, 15, kSecret, 0, [&](const std::string& line) { dropped.push_back(line); }};
  Status hub_status = error(Code::Internal, "not run");
  std::thread hub([&] { hub_status = make_local_group(hub_options).status(); });
  int forger = connect_to_hub(dir);
  ASSERT_GE(forger, 0);
  const std::string old_format = bootstrap::encode_message(bootstrap::MessageKind::Barrier, 0, 1, "");
  ASSERT_EQ(::send(forger, old_format.data(), old_format.size(), MSG_NOSIGNAL), ssize_t(old_format.size()));
  EXPECT_TRUE(closed_by_peer(forger, 10));
  ::close(forger);
  LocalGroupOptions member_options{1, 2, dir, 15, kSecret, 0, nullptr};
  EXPECT_TRUE(make_local_group(member_options).is_ok());
  hub.join();
  EXPECT_TRUE(hub_status.is_ok()) << hub_status.to_string();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_NE(dropped[0].find("sent barrier"), std::string::npos) << dropped[0];
  std::filesystem::remove_all(dir);
}

TEST(JoinAdmission, HelloCarriesTheSecretAndIsExactlyFortyBytes) {
  const std::string secret(32, '\x5a');
  std::string payload = bootstrap::encode_hello({4, 77, secret});
  ASSERT_EQ(payload.size(), 40u);
  auto hello = bootstrap::decode_hello(payload);
  ASSERT_TRUE(hello.is_ok());
  EXPECT_EQ(hello->secret, secret);
  EXPECT_EQ(bootstrap::decode_hello(payload.substr(0, 8)).status().code(), Code::ParseError);  // version 1's hello
  EXPECT_EQ(bootstrap::decode_hello(payload + "x").status().code(), Code::ParseError);
  EXPECT_EQ(bootstrap::encode_hello({4, 77, ""}).substr(8), std::string(32, '\0'));
}

TEST(JoinAdmission, BadSecretInTheEnvironmentIsRefused) {
  ::setenv("EPLB_RANK", "0", 1);
  ::setenv("EPLB_SIZE", "1", 1);
  ::setenv("EPLB_RUN_SECRET", "not-hex", 1);
  auto options = local_group_options_from_env();
  ::setenv("EPLB_RUN_SECRET", kSecret.c_str(), 1);
  ::setenv("EPLB_LAUNCHER_PID", "123", 1);
  auto good = local_group_options_from_env();
  for (const char* name : {"EPLB_RANK", "EPLB_SIZE", "EPLB_RUN_SECRET", "EPLB_LAUNCHER_PID"}) ::unsetenv(name);
  EXPECT_EQ(options.status().code(), Code::InvalidArgument);
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_EQ(good->secret, kSecret);
  EXPECT_EQ(good->launcher_pid, 123);
}

// A pid that is certainly gone: a child that exited and was reaped.
pid_t dead_pid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

void make_run_dir(const std::string& path, const std::string& owner) {
  std::filesystem::create_directories(path + "/sub");
  std::ofstream(path + "/sub/ucx_posix_file") << "x";
  if (!owner.empty()) std::ofstream(path + "/owner") << owner << "\n";
}

TEST(StaleSweep, RemovesDirectoriesOfDeadOwnersOnly) {
  const std::string base = testing::make_temp_dir();
  const pid_t gone = dead_pid();
  const std::string ns = bootstrap::pid_namespace();
  make_run_dir(base + "/eplb-dead01", fmt::format("{} 12345 {}", gone, ns));
  make_run_dir(base + "/eplb-alive1", bootstrap::owner_line());
  make_run_dir(base + "/eplb-reused", fmt::format("{} 1 {}", ::getpid(), ns));  // our pid, another start time
  make_run_dir(base + "/eplb-noown1", "");
  make_run_dir(base + "/eplb-otherns", fmt::format("{} 12345 pid:[1]", gone));  // another pid namespace
  make_run_dir(base + "/other-dead1", fmt::format("{} 12345 {}", gone, ns));
  EXPECT_EQ(bootstrap::sweep_stale_run_dirs({base}), 2);
  EXPECT_FALSE(std::filesystem::exists(base + "/eplb-dead01"));
  EXPECT_FALSE(std::filesystem::exists(base + "/eplb-reused"));
  EXPECT_TRUE(std::filesystem::exists(base + "/eplb-alive1"));
  EXPECT_TRUE(std::filesystem::exists(base + "/eplb-noown1"));
  EXPECT_TRUE(std::filesystem::exists(base + "/eplb-otherns"));
  EXPECT_TRUE(std::filesystem::exists(base + "/other-dead1"));
  std::filesystem::remove_all(base);
}

TEST(StaleSweep, LaunchSweepsAndItsOwnDirectoriesArePrivateAndRemoved) {
  const std::string base = testing::make_temp_dir();
  ::setenv("TMPDIR", base.c_str(), 1);
  make_run_dir(base + "/eplb-stale1", fmt::format("{} 12345 {}", dead_pid(), bootstrap::pid_namespace()));
  LaunchOptions options;
  options.size = 2;
  options.argv = {"/bin/sh", "-c",
                  "stat -c '%a' \"$EPLB_BOOTSTRAP_DIR\" \"$UCX_POSIX_DIR\" > \"$EPLB_BOOTSTRAP_DIR/../modes$EPLB_RANK\";"
                  " echo \"$UCX_POSIX_DIR\" >> \"$EPLB_BOOTSTRAP_DIR/../modes$EPLB_RANK\";"
                  " test ${#EPLB_RUN_SECRET} -eq 64 && test \"$EPLB_LAUNCHER_PID\" = \"$PPID\""};
  options.deadline = Deadline::after_seconds(20);
  LaunchResult result = launch_local_ranks(options);
  ::unsetenv("TMPDIR");
  EXPECT_TRUE(result.status.is_ok()) << result.status.to_string();
  EXPECT_FALSE(std::filesystem::exists(base + "/eplb-stale1"));
  std::ifstream modes(base + "/modes0");
  std::string rendezvous_mode, shm_mode, shm_dir;
  modes >> rendezvous_mode >> shm_mode >> shm_dir;
  EXPECT_TRUE(shm_dir.starts_with("/dev/shm/eplb-")) << shm_dir;
  EXPECT_FALSE(std::filesystem::exists(shm_dir)) << shm_dir;
  EXPECT_EQ(rendezvous_mode, "700");
  EXPECT_EQ(shm_mode, "700");
  int left = 0;
  for (const auto& entry : std::filesystem::directory_iterator(base))
    left += entry.path().filename().string().starts_with("eplb-");
  EXPECT_EQ(left, 0);
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace eplb
