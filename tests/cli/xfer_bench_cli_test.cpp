// eplb xfer-bench end to end: READ and WRITE between two processes over UCX
// shared memory and TCP with --check (bytes verified) and --json rows,
// pinning with --cpu / --target-cpu, the bounded waits of --listen / --peer,
// and the errors of bad options.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/cli_support.h"

namespace eplb {
namespace {

using testing_support::BoundedRun;
using testing_support::run_bounded;

// Runs xfer-bench bounded at 120 s; stdout and stderr together.
BoundedRun xfer_bench(const std::string& arguments) {
  return run_bounded(std::string(EPLB_BINARY_DIR) + "/eplb xfer-bench " + arguments, "EPLB_LOG=warn", 120);
}

// The JSON rows of a --json run (the output must be that array alone).
nlohmann::json rows_of(const BoundedRun& run) {
  auto parsed = nlohmann::json::parse(run.output, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << run.output;
  return parsed;
}

void expect_checked_rows(const BoundedRun& run, const std::vector<uint64_t>& blocks, int batch) {
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json rows = rows_of(run);
  ASSERT_TRUE(rows.is_array()) << run.output;
  ASSERT_EQ(rows.size(), blocks.size()) << run.output;
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(rows[i]["block_bytes"].get<uint64_t>(), blocks[i]);
    EXPECT_EQ(rows[i]["batch"].get<int>(), batch);
    EXPECT_EQ(rows[i]["check"].get<std::string>(), "ok") << rows[i].dump();
    EXPECT_GT(rows[i]["gigabytes_per_second"].get<double>(), 0.0);
    EXPECT_GE(rows[i]["completion_p99_us"].get<double>(), 0.0);
  }
}

TEST(XferBenchCli, ReadAndWriteOverSharedMemoryAreChecked) {
  for (const char* op : {"read", "write"}) {
    SCOPED_TRACE(op);
    BoundedRun run = xfer_bench(std::string("--op ") + op +
                                " --transport shm --block-sizes 4K,1M --batch 3 --iterations 20 --check --json");
    expect_checked_rows(run, {4096, 1 << 20}, 3);
  }
}

TEST(XferBenchCli, UserMemoryAndRepostedRequestsAreChecked) {
  BoundedRun user = xfer_bench("--memory user --block-sizes 64K --iterations 20 --check --json");
  expect_checked_rows(user, {64 << 10}, 1);
  BoundedRun reused = xfer_bench("--reuse-request --block-sizes 4K..16K --iterations 50 --check --json");
  expect_checked_rows(reused, {4 << 10, 8 << 10, 16 << 10}, 1);
}

TEST(XferBenchCli, ReadOverTcpOnLoopbackIsChecked) {
  BoundedRun run = xfer_bench("--transport tcp --block-sizes 256K --iterations 10 --check --json");
  expect_checked_rows(run, {256 << 10}, 1);
}

TEST(XferBenchCli, PinnedInitiatorAndTargetAreChecked) {
  BoundedRun run = xfer_bench("--cpu 0 --target-cpu 0 --block-sizes 1M --iterations 20 --check --json");
  expect_checked_rows(run, {1 << 20}, 1);
}

// The secret a --listen target and its --peer share in these tests: 32 bytes
// of 0xab (octal 253, as the raw-frame tests below write it).
std::string secret_env() {
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "ab";
  return "EPLB_LOG=warn EPLB_XFER_BENCH_SECRET=" + hex;
}
// The first frame of an initiator that knows that secret: 'A', length 32
// (u64, little-endian), 32 bytes of 0xab; for printf in bash.
std::string secret_frame() {
  std::string frame = "A\\040\\000\\000\\000\\000\\000\\000\\000";
  for (int i = 0; i < 32; ++i) frame += "\\253";
  return frame;
}

// True when nothing on this machine holds TCP `port` (probed by binding it).
bool tcp_port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return free;
}

// A TCP port for this test process and `offset`, the same on every call.
// Drawn from 20000-32767, below Linux's ephemeral range (32768-60999), so
// no outgoing connection of a concurrent test can be given it; the start
// depends on the pid so that concurrent test processes differ, and a port
// found busy is skipped.
std::string test_port(int offset) {
  static std::map<int, int> chosen;
  auto found = chosen.find(offset);
  if (found != chosen.end()) return std::to_string(found->second);
  constexpr int kFirst = 20000, kCount = 12768;
  int port = kFirst + static_cast<int>((static_cast<long>(::getpid()) * 37 + offset * 101) % kCount);
  for (int tries = 0; tries < kCount && !tcp_port_is_free(port); ++tries) port = kFirst + (port - kFirst + 1) % kCount;
  chosen[offset] = port;
  return std::to_string(port);
}

// A shell snippet that waits (at most 30 s) until something listens on TCP
// `port`, read from /proc/net/tcp: a fixed sleep before connecting lost the
// race on a loaded machine (the target was not listening yet).
std::string wait_until_listening(const std::string& port) {
  return fmt::format("n=0; while ! grep -q \":{:04X} 00000000:0000 0A\" /proc/net/tcp && [ $n -lt 300 ]; do "
                     "n=$((n+1)); sleep 0.1; done; ",
                     std::stoi(port));
}

TEST(XferBenchCli, ListenGivesUpWhenNoPeerComes) {
  BoundedRun run = xfer_bench("--listen " + test_port(1) + " --listen-timeout 1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(run.seconds, 10.0);
  EXPECT_NE(run.output.find("no --peer connected to port " + test_port(1) + " within 1.0 s"), std::string::npos)
      << run.output;
}

TEST(XferBenchCli, PeerGivesUpOnAStoppedTarget) {
  // The target listens, is stopped (SIGSTOP) before the peer connects, and
  // never sends its metadata: the peer must fail after --timeout, not hang.
  const std::string eplb = std::string(EPLB_BINARY_DIR) + "/eplb";
  const std::string port = test_port(2);
  const std::string script = eplb + " xfer-bench --listen " + port + " --block-sizes 4K & target=$!; " + wait_until_listening(port) +
                             "kill -STOP $target; " + eplb + " xfer-bench --peer 127.0.0.1:" + port +
                             " --block-sizes 4K --timeout 1; status=$?; kill -KILL $target; exit $status";
  BoundedRun run = run_bounded("sh -c '" + script + "'", secret_env(), 60);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 137) << "killed by the time limit: the peer hung";
  EXPECT_LT(run.seconds, 20.0);
  EXPECT_NE(run.output.find("the target did not send its metadata within 1.0 s"), std::string::npos) << run.output;
}

// Issue 17 row 7: what listens. The listening socket as /proc/net/tcp shows
// it while the target waits: "ADDRESS:PORT" in hex, state 0A (LISTEN).
std::string listening_line(const std::string& bind_arguments, const std::string& port) {
  const std::string eplb = std::string(EPLB_BINARY_DIR) + "/eplb";
  const std::string script = eplb + " xfer-bench --listen " + port + " --listen-timeout 2 " + bind_arguments +
                             " & t=$!; " + wait_until_listening(port) + "cat /proc/net/tcp; wait $t";
  BoundedRun run = run_bounded("sh -c '" + script + "'", "EPLB_LOG=warn", 30);
  const std::string hex_port = fmt::format(":{:04X} ", std::stoi(port));
  for (size_t at = run.output.find(hex_port); at != std::string::npos; at = run.output.find(hex_port, at + 1)) {
    const size_t line = run.output.rfind('\n', at) + 1;
    const std::string text = run.output.substr(line, run.output.find('\n', at) - line);
    if (text.find(hex_port + "00000000:0000 0A") != std::string::npos) return text;
  }
  return "no listening socket on port " + port + " in:\n" + run.output;
}

TEST(XferBenchCli, ListenBindsLoopbackUnlessBindSaysOtherwise) {
  const std::string port = test_port(3);
  EXPECT_NE(listening_line("", port).find(" 0100007F:"), std::string::npos) << listening_line("", port);
  const std::string every = listening_line("--bind 0.0.0.0", port);
  EXPECT_NE(every.find(" 00000000:"), std::string::npos) << every;
}

TEST(XferBenchCli, ListenAndPeerCompleteAcrossKeepAlives) {
  const std::string port = test_port(6), eplb = std::string(EPLB_BINARY_DIR) + "/eplb";
  const std::string script = eplb + " xfer-bench --listen " + port + " --transport tcp --block-sizes 4K,8K --check" +
                             " & t=$!; " + wait_until_listening(port) + eplb + " xfer-bench --peer 127.0.0.1:" + port +
                             " --transport tcp --block-sizes 4K,8K --check; echo initiator=$?; wait $t; echo target=$?";
  BoundedRun run = run_bounded("sh -c '" + script + "'", secret_env(), 60);
  EXPECT_NE(run.output.find("initiator=0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("target=0"), std::string::npos) << run.output;
}

// Issue 17 row 7: the control socket is guarded by a secret. A target
// without EPLB_XFER_BENCH_SECRET makes one and prints it; a --peer without
// it is refused before it connects; a wrong one gets nothing from the target.
TEST(XferBenchCli, TargetServesOnlyAPeerWithItsSecret) {
  const std::string port = test_port(7), eplb = std::string(EPLB_BINARY_DIR) + "/eplb";
  const std::string script = "unset EPLB_XFER_BENCH_SECRET; " + eplb + " xfer-bench --listen " + port +
                             " --block-sizes 4K --timeout 5 & t=$!; " + wait_until_listening(port) + eplb + " xfer-bench --peer 127.0.0.1:" +
                             port + " --block-sizes 4K; echo unset=$?; EPLB_XFER_BENCH_SECRET=" + std::string(64, '0') +
                             " " + eplb + " xfer-bench --peer 127.0.0.1:" + port +
                             " --block-sizes 4K --timeout 5; echo wrong=$?; wait $t; echo target=$?";
  BoundedRun run = run_bounded("sh -c '" + script + "'", "EPLB_LOG=warn", 60);
  EXPECT_NE(run.output.find("give it to the --peer side as"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("unset=2"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("set EPLB_XFER_BENCH_SECRET to the secret"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("wrong=0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("target=1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("does not carry EPLB_XFER_BENCH_SECRET; nothing was sent to it"), std::string::npos)
      << run.output;
  EXPECT_LT(run.seconds, 30.0);
}

TEST(XferBenchCli, MalformedMessageEndsTheTargetWithAnError) {
  const std::string port = test_port(4);
  const std::string script = std::string(EPLB_BINARY_DIR) + "/eplb xfer-bench --listen " + port +
                             " --block-sizes 4K --timeout 5 & t=$!; " + wait_until_listening(port) + "exec 3<>/dev/tcp/127.0.0.1/" + port +
                             "; printf \"" + secret_frame() +
                             "Z\\000\\000\\000\\000\\000\\000\\000\\000\" >&3; wait $t; echo exit=$?";
  BoundedRun run = run_bounded("bash -c '" + script + "'", secret_env(), 30);
  EXPECT_NE(run.output.find("exit=3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("malformed control message (type 0x5a, 0 bytes"), std::string::npos) << run.output;
  EXPECT_LT(run.seconds, 10.0);
}

TEST(XferBenchCli, SilentClientTimesOutAfterTimeout) {
  const std::string port = test_port(5);
  const std::string script = std::string(EPLB_BINARY_DIR) + "/eplb xfer-bench --listen " + port +
                             " --block-sizes 4K --timeout 1 & t=$!; " + wait_until_listening(port) + "exec 3<>/dev/tcp/127.0.0.1/" + port +
                             "; wait $t; echo exit=$?";
  BoundedRun run = run_bounded("bash -c '" + script + "'", secret_env(), 30);
  EXPECT_NE(run.output.find("exit=4"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("no message from the initiator for 1.0 s (--timeout)"), std::string::npos) << run.output;
  EXPECT_LT(run.seconds, 10.0);
}

TEST(XferBenchCli, BadOptionsAreRefusedWithTheReason) {
  struct Case {
    const char* arguments;
    const char* says;
  };
  const Case cases[] = {
      {"--cpu 4096 --block-sizes 4K", "--cpu 4096 does not exist"},
      {"--target-cpu -2 --block-sizes 4K", "--target-cpu -2 does not exist"},
      {"--target-cpu 0 --peer 127.0.0.1:9 --block-sizes 4K", "--target-cpu pins the forked target"},
      {"--op copy", "--op must be read or write"},
      {"--memory gpu", "--memory must be ucx or user"},
      {"--block-sizes 4Q", "--block-sizes: '4Q' is not a byte size"},
      {"--block-sizes 0", "--block-sizes: byte size '0' must be a whole number of bytes in [1 B, 1 TiB]"},
      {"--block-sizes 1M..4K", "--block-sizes: range '1M..4K' is empty"},
      {"--batch 0", "--batch must be 1..65536"},
      {"--peer nocolon", "--peer must be HOST:PORT"},
      {"--peer 127.0.0.1:70000", "--peer port"},
      {"--peer 127.0.0.1:0", "--peer port"},
      {"--listen 0", "--listen: an integer in [1, 65535] is expected, got '0'"},
      {"--listen 70000", "--listen: an integer in [1, 65535] is expected, got '70000'"},
      {"--listen 5000 --bind localhost", "--bind: 'localhost' is not an IPv4 address"},
      {"--target-poll-ms 0", "--target-poll-ms: an integer in [1, 1000] is expected, got '0'"},
      // Issue 17 row 8: every duration finite, > 0 and at most a day.
      {"--timeout 0", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout inf", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout nan", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout 1e10", "--timeout must be a number of seconds in (0, 86400]"},
      {"--timeout -1", "--timeout must be a number of seconds in (0, 86400]"},
      {"--listen-timeout 1e300", "--listen-timeout must be a number of seconds in (0, 86400]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arguments);
    BoundedRun run = xfer_bench(c.arguments);
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.exit_code, 137) << "killed by the time limit";
    EXPECT_NE(run.output.find(c.says), std::string::npos) << run.output;
  }
}

}  // namespace
}  // namespace eplb
