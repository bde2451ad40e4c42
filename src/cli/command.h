// command.h - how eplb subcommands plug into the `eplb` executable.
//
// Each cmd_<name>.cpp defines `void add_<name>(CLI::App& app)` that creates
// its subcommand with app.add_subcommand(), binds options, and sets a
// callback that calls set_command_result(status). Register it with
// EPLB_REGISTER_COMMAND(order, add_<name>); order sorts `eplb --help`.
// A failing Status becomes one line on stderr and a non-zero exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "eplb/bootstrap.h"
#include "eplb/status.h"

namespace eplb::cli {

using CommandAdder = void (*)(CLI::App&);

struct CommandRegistrar {
  CommandRegistrar(int order, CommandAdder adder);
};

// Records the outcome of the subcommand that ran.
void set_command_result(Status status);
// The same with an exit code chosen by the command (128 + a signal number
// for a run interrupted by that signal, as shells report).
void set_command_result(Status status, int exit_code);

// Exit codes: 0 ok, 2 invalid argument, 3 bad input file, 4 timeout,
// 5 peer lost, 1 anything else.
inline constexpr int kExitTimeout = 4;
inline constexpr int kExitPeerLost = 5;
int exit_code_for(const Status& status);
// The inverse, for a rank process that exited with `exit_code` (or was
// killed by a signal: the peer is lost).
Code code_for_exit(int exit_code, bool signalled);
// A launch's outcome as this command's result: a forwarded SIGINT/SIGTERM
// exits 128 + the signal, anything else as launch_status says.
void set_launch_result(const LaunchResult& launched);
// A launch's outcome as this command's Status: a failed rank's exit code is
// mapped back to its code, so the launcher exits as the failing rank did.
Status launch_status(const LaunchResult& launched);
// The launched rank's local group options from the environment, with
// dropped joiners (a forged hello, a foreign process) logged on stderr.
Result<LocalGroupOptions> launched_group_options();

}  // namespace eplb::cli

#define EPLB_REGISTER_COMMAND(order, adder) \
  static ::eplb::cli::CommandRegistrar EPLB_CONCAT_(eplb_command_registrar_, __LINE__)(order, adder)
