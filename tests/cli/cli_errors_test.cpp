// The CLI's argument errors (issue 29 "Also"): every parse error exits 2 as
// documented (not CLI11's internal 105/106/109), an unknown subcommand is
// named (also with --help after it), and an integer option given a word says
// that an integer is expected.
#include <gtest/gtest.h>

#include <string>

#include "../support/cli_support.h"

namespace eplb {
namespace {

using testing_support::CliRun;
using testing_support::run_eplb;

TEST(CliErrors, ArgumentErrorsExitTwo) {
  for (const std::string arguments :
       {"rebalance --replicas abc", "rebalance --nosuchflag", "rebalance --format yaml", "run --ranks",
        "simulate --layers 0", "rebalance --threads 0", "gen-load --layers 1 --experts",
        "run --transfer-schedule nics"}) {
    CliRun run = run_eplb(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.output;
  }
  CliRun help = run_eplb("rebalance --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  CliRun version = run_eplb("--version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
}

TEST(CliErrors, UnknownSubcommandIsNamed) {
  for (const std::string arguments : {"frobnicate", "frobnicate --help", "frobnicate --layers 3"}) {
    CliRun run = run_eplb(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.output;
    EXPECT_NE(run.output.find("unknown command 'frobnicate'"), std::string::npos) << arguments << "\n" << run.output;
    EXPECT_NE(run.output.find("rebalance"), std::string::npos) << run.output;  // the commands it knows
    EXPECT_EQ(run.output.find("A subcommand is required"), std::string::npos) << run.output;
  }
  CliRun none = run_eplb("");
  EXPECT_EQ(none.exit_code, 2) << none.output;
}

TEST(CliErrors, IntegerOptionsSayAnIntegerIsExpected) {
  for (const std::string arguments : {"rebalance --replicas abc", "run --replicas abc", "simulate --replicas abc",
                                      "evaluate --trace x.npy --window abc", "rebalance --ranks 1.5"}) {
    CliRun run = run_eplb(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.output;
    EXPECT_NE(run.output.find("an integer"), std::string::npos) << arguments << "\n" << run.output;
    EXPECT_EQ(run.output.find("17976931348623157"), std::string::npos) << arguments << "\n" << run.output;
  }
}

}  // namespace
}  // namespace eplb
