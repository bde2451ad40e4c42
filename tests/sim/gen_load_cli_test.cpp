// eplb gen-load end to end: files, determinism, errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "../support/cli_support.h"
#include "eplb/placement_io.h"
#include "eplb/sim.h"
#include <algorithm>
#include <sys/wait.h>

namespace eplb {
namespace {

using testing_support::CliRun;
using testing_support::run_eplb;
using testing_support::slurp;

class GenLoadCli : public testing_support::TempDirTest {};

TEST_F(GenLoadCli, SameSeedSameBytesInEveryFormat) {
  for (const char* extension : {"npy", "csv", "json"}) {
    std::string a = file(std::string("a.") + extension), b = file(std::string("b.") + extension);
    CliRun first = run_eplb("gen-load --preset tiny --seed 5 --out " + a);
    CliRun second = run_eplb("gen-load --preset tiny --seed 5 --out " + b);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(first.output.find("wrote " + a), std::string::npos) << first.output;
    EXPECT_NE(first.output.find("2 layers x 12 experts"), std::string::npos) << first.output;
    EXPECT_EQ(std::count(first.output.begin(), first.output.end(), '\n'), 1) << "one line";
    EXPECT_EQ(slurp(a), slurp(b)) << extension;
    auto load = read_load_file(a, 12);
    ASSERT_TRUE(load.is_ok()) << load.status().to_string();
    EXPECT_EQ(load->num_layers, 2);
  }
  ASSERT_EQ(run_eplb("gen-load --preset tiny --seed 6 --out " + file("c.npy")).exit_code, 0);
  EXPECT_NE(slurp(file("a.npy")), slurp(file("c.npy")));
}

TEST_F(GenLoadCli, TraceWithOverridesAndLognormal) {
  std::string path = file("t.npy");
  CliRun result = run_eplb("gen-load --preset deepseek-v3 --layers 3 --experts 16 --dist lognormal --skew 0.7 --steps 20 "
                   "--drift 0.2 --tokens 1000 --seed 9 --out " + path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("20 steps x 3 layers x 16 experts"), std::string::npos) << result.output;
  auto trace = read_load_trace(path);
  ASSERT_TRUE(trace.is_ok()) << trace.status().to_string();
  EXPECT_EQ(trace->num_steps, 20);
  EXPECT_EQ(trace->num_layers, 3);
  EXPECT_EQ(trace->num_experts, 16);
  // Same as the library call with the same options.
  LoadGenOptions options;
  options.num_layers = 3;
  options.num_experts = 16;
  options.distribution = LoadDistribution::Lognormal;
  options.skew = 0.7;
  options.num_steps = 20;
  options.drift = 0.2;
  options.tokens_per_step = 1000;
  options.seed = 9;
  auto direct = generate_load_trace(options);
  ASSERT_TRUE(direct.is_ok());
  EXPECT_EQ(direct->values, trace->values);
}

TEST_F(GenLoadCli, BadArgumentsGiveOneClearLine) {
  CliRun csv_trace = run_eplb("gen-load --preset tiny --steps 4 --out " + file("t.csv"));
  EXPECT_EQ(csv_trace.exit_code, 2);
  EXPECT_NE(csv_trace.output.find("CSV load file holds one [L][E] matrix"), std::string::npos) << csv_trace.output;
  EXPECT_FALSE(std::filesystem::exists(file("t.csv")));
  CliRun preset = run_eplb("gen-load --preset gpt9 --out " + file("x.npy"));
  EXPECT_NE(preset.exit_code, 0);
  EXPECT_NE(preset.output.find("gpt9"), std::string::npos) << preset.output;
  CliRun no_out = run_eplb("gen-load --preset tiny");
  EXPECT_NE(no_out.exit_code, 0);
  EXPECT_NE(no_out.output.find("--out"), std::string::npos) << no_out.output;
  CliRun extension = run_eplb("gen-load --preset tiny --out " + file("x.parquet"));
  EXPECT_EQ(extension.exit_code, 2);
  EXPECT_NE(extension.output.find("'.parquet'"), std::string::npos) << extension.output;
  CliRun directory = run_eplb("gen-load --preset tiny --out " + file("missing/x.npy"));
  EXPECT_EQ(directory.exit_code, 3);
  EXPECT_NE(directory.output.find("missing/x.npy"), std::string::npos) << directory.output;
  CliRun drift = run_eplb("gen-load --preset tiny --drift 3 --out " + file("x.npy"));
  EXPECT_NE(drift.exit_code, 0);
  CliRun help = run_eplb("gen-load --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* option : {"--preset", "--layers", "--experts", "--dist", "--skew", "--steps", "--drift",
                             "--tokens", "--seed", "--out"})
    EXPECT_NE(help.output.find(option), std::string::npos) << option;
}

}  // namespace
}  // namespace eplb
