// run_args.h - the options of `eplb run` and their translation into the
// app's RunOptions (cmd_run.cpp runs them).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "eplb/app.h"

namespace eplb::cli {

struct RunArgs {
  int ranks = 4;
  int nodes = 2;
  std::string preset;
  int layers = 8;
  int experts = 64;
  int replicas = 72;
  int groups = 8;
  std::string bytes_per_expert = "1MiB";
  std::string tensors;
  int rounds = 3;
  std::string policy = "deepseek";
  std::string trace;
  std::string dist = "zipf";
  double skew = 1.0;
  double drift = -1;
  uint64_t seed = 0;
  int window = 20;
  std::string transport = "shm";
  std::string bootstrap = "local";
  std::string net_devices;
  double timeout = 0;
  int retries = 2;
  std::string inject;
  std::string json;
  std::string metrics;
  int threads = 1;
  std::string max_input_bytes;
  bool async = false;
  std::string commit = "copy";
  double step_ms = 5;
  double serve_share = 0.25;
  std::string transfer_schedule = "off";  // [issue 31] off | ranks | hosts | ranks-fenced | hosts-fenced
  // Which options the user gave (they override a preset / the group size).
  CLI::Option* ranks_option = nullptr;
  CLI::Option* nodes_option = nullptr;
  CLI::Option* layers_option = nullptr;
  CLI::Option* experts_option = nullptr;
  CLI::Option* replicas_option = nullptr;
  CLI::Option* groups_option = nullptr;
  CLI::Option* commit_option = nullptr;
  CLI::Option* step_ms_option = nullptr;
  CLI::Option* serve_share_option = nullptr;
  CLI::Option* json_option = nullptr;
  CLI::Option* metrics_option = nullptr;
  CLI::Option* trace_option = nullptr;
};

void add_run_options(CLI::App& run, RunArgs& args);
// `group_size` > 0: the number of rank processes actually started.
Result<RunOptions> build_run_options(const RunArgs& args, int group_size);
// --json, --metrics and --trace: none given empty, and no two naming the
// same file (real paths: symbolic links followed, also dangling ones);
// InvalidArgument naming both options otherwise.
Status check_file_options(const RunArgs& args);
RunLabels run_labels(const RunArgs& args, bool mpi);

}  // namespace eplb::cli
