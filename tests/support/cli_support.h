// cli_support.h - helpers for tests that run the built `eplb` executable:
// run a command and capture its output and exit code, read a file whole,
// and a fixture with a private temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace eplb::testing_support {

// The built CLI, and the small `eplb run` shape most run tests use.
inline const std::string kBinary = EPLB_BINARY_DIR "/eplb";
inline const std::string kSmallRun =
    " --layers 3 --experts 16 --replicas 24 --groups 4 --bytes-per-expert 64KiB --rounds 2 --window 10";

inline bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A per-process path in gtest's temporary directory: <TempDir>/eplb_<tag>_<pid>_<name>.
inline std::string temp_path(const std::string& tag, const std::string& name) {
  return ::testing::TempDir() + "/eplb_" + tag + "_" + std::to_string(::getpid()) + "_" + name;
}

struct CliRun {
  int exit_code = -1;  // 128 + signal when the command was killed
  std::string output;
};

// Runs `command` through the shell and captures its standard output.
inline CliRun run_command(const std::string& command) {
  CliRun result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, got);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  return result;
}

// Runs `eplb <arguments>`; stderr is captured too unless with_stderr is false.
inline CliRun run_eplb(const std::string& arguments, bool with_stderr = true) {
  return run_command(std::string(EPLB_BINARY_DIR) + "/eplb " + arguments + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// A command bounded by `timeout -s KILL limit_seconds` under `env
// environment`, stdout and stderr captured, wall time measured.
struct BoundedRun {
  int exit_code = -1;  // 137 when the limit killed it
  std::string output;  // stdout and stderr
  double seconds = 0;
  bool killed_by_timeout() const { return exit_code == 137; }
};

inline BoundedRun run_bounded(const std::string& command, const std::string& environment, int limit_seconds) {
  const auto start = std::chrono::steady_clock::now();
  CliRun run = run_command("env " + environment + " timeout -s KILL " + std::to_string(limit_seconds) + " " +
                           command + " 2>&1");
  BoundedRun bounded;
  bounded.exit_code = run.exit_code;
  bounded.output = std::move(run.output);
  bounded.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return bounded;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A fixture owning a fresh temporary directory, removed after the test.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/eplb_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

}  // namespace eplb::testing_support
