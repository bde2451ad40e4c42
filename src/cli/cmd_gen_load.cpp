// eplb gen-load: writes a synthetic load matrix or a drifting load trace.
#include <fmt/format.h>
#include <cstdio>
#include <string>

#include "command.h"
#include "options.h"
#include "eplb/placement.h"
#include "eplb/placement_io.h"
#include "eplb/sim.h"

namespace eplb::cli {
namespace {

struct GenLoadArgs {
  std::string preset = "deepseek-v3";
  int layers = 0;
  int experts = 0;
  std::string distribution = "zipf";
  double skew = 1.0;
  int steps = 1;
  double drift = -1;
  double tokens = 0;
  uint64_t seed = 0;
  std::string out;
};

std::string number_text(double value) { return fmt::format("{:g}", value); }

Status run_gen_load(const GenLoadArgs& args) {
  EPLB_ASSIGN_OR_RETURN(Topology topology, topology_preset(args.preset));
  LoadGenOptions options;
  options.num_layers = args.layers > 0 ? args.layers : topology.num_layers;
  options.num_experts = args.experts > 0 ? args.experts : topology.num_experts;
  if (args.layers < 0 || args.experts < 0)
    return error(Code::InvalidArgument, "gen-load: --layers and --experts must be > 0");
  options.distribution = args.distribution == "lognormal" ? LoadDistribution::Lognormal : LoadDistribution::Zipf;
  options.skew = args.skew;
  options.num_steps = args.steps;
  options.drift = args.drift;
  options.tokens_per_step = args.tokens;
  options.seed = args.seed;
  if (args.drift < 0 && args.drift != -1)
    return error(Code::InvalidArgument, "gen-load: --drift must be in [0, 1]");
  if (args.tokens < 0) return error(Code::InvalidArgument, "gen-load: --tokens must be > 0");
  EPLB_ASSIGN_OR_RETURN(LoadTrace trace, generate_load_trace(options));
  if (trace.num_steps == 1) {
    EPLB_TRY(write_load_file(args.out, trace.sum(0, 1)));
  } else {
    EPLB_TRY(write_load_trace(args.out, trace));
  }
  double total = 0;
  for (double value : trace.values) total += value;
  double drift = args.drift < 0 ? default_drift() : args.drift;
  std::printf("gen-load: wrote %s: %s%d layers x %d experts, %s skew %s%s, seed %llu, %.0f tokens in total\n",
              args.out.c_str(), trace.num_steps > 1 ? (fmt::format("{} steps x ", trace.num_steps)).c_str() : "",
              trace.num_layers, trace.num_experts, args.distribution.c_str(), number_text(args.skew).c_str(),
              trace.num_steps > 1 ? (", drift " + number_text(drift)).c_str() : "",
              static_cast<unsigned long long>(args.seed), total);
  return Status::ok();
}

void add_gen_load(CLI::App& app) {
  auto args = std::make_shared<GenLoadArgs>();
  CLI::App* command = app.add_subcommand(
      "gen-load",
      "Write a synthetic expert load: a [L][E] matrix of token counts, or with --steps W > 1 a\n"
      "[W][L][E] trace whose expert popularity drifts between steps. Same arguments, same file.");
  command->add_option("--preset", args->preset,
                      "Model shape giving layers and experts: deepseek-v3 (58 x 256), qwen3-235b (94 x 128),\n"
                      "mixtral-8x7b (32 x 8), tiny (2 x 12)")
      ->check(CLI::IsMember({"deepseek-v3", "qwen3-235b", "mixtral-8x7b", "tiny"}))
      ->capture_default_str();
  command->add_option("--layers", args->layers, "Number of MoE layers L (overrides the preset)")
      ->check(integer_in(1, 1 << 20));
  command->add_option("--experts", args->experts, "Number of logical experts E per layer (overrides the preset)")
      ->check(integer_in(1, 1 << 20));
  command->add_option("--dist", args->distribution,
                      "Expert popularity: zipf (k-th most popular expert weighs 1/k^skew) or lognormal\n"
                      "(weights exp(skew * z), z standard normal)")
      ->check(CLI::IsMember({"zipf", "lognormal"}))
      ->capture_default_str();
  command->add_option("--skew", args->skew, "Zipf exponent, or lognormal sigma; 0 gives uniform popularity")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  command->add_option("--steps", args->steps,
                      "Number of steps W; W > 1 writes a [W][L][E] trace (.npy or .json only)")
      ->check(integer_in(1, 1000000))
      ->capture_default_str();
  command->add_option("--drift", args->drift,
                      "Per-step drift in [0, 1] of which experts are hot (mean-reverting scores; 0: static,\n"
                      "1: independent steps); default " + number_text(default_drift()))
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--tokens", args->tokens,
                      "Tokens routed per layer per step, counting every top-k choice; default 32768\n"
                      "(4096 tokens x top-8)")
      ->check(CLI::Range(1.0, 1e15));
  command->add_option("--seed", args->seed, "Random seed; the same seed gives the same file")->capture_default_str();
  command->add_option("--out", args->out, "Output file: .npy (float64), .csv (2-D only) or .json")->required();
  command->callback([args] { set_command_result(run_gen_load(*args)); });
}

}  // namespace

EPLB_REGISTER_COMMAND(20, add_gen_load);

}  // namespace eplb::cli
