// eplb command-line entry point: collects the registered subcommands, parses,
// runs, and maps the outcome to a one-line message and an exit code.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <vector>

#include "command.h"
#include "options.h"

namespace eplb::cli {
namespace {

std::vector<std::pair<int, CommandAdder>>& registry() {
  static std::vector<std::pair<int, CommandAdder>> commands;
  return commands;
}

std::optional<Status>& command_result() {
  static std::optional<Status> result;
  return result;
}

std::optional<int>& command_exit_code() {
  static std::optional<int> exit_code;
  return exit_code;
}

}  // namespace

CommandRegistrar::CommandRegistrar(int order, CommandAdder adder) { registry().emplace_back(order, adder); }

void set_command_result(Status status) { command_result() = std::move(status); }

void set_command_result(Status status, int exit_code) {
  command_result() = std::move(status);
  command_exit_code() = exit_code;
}

void set_launch_result(const LaunchResult& launched) {
  if (launched.forwarded_signal != 0) return set_command_result(launched.status, 128 + launched.forwarded_signal);
  set_command_result(launch_status(launched));
}

int exit_code_for(const Status& status) {
  switch (status.code()) {
    case Code::Ok: return 0;
    case Code::InvalidArgument: return 2;
    case Code::IoError:
    case Code::ParseError:
    case Code::Unsupported: return 3;
    case Code::Timeout: return kExitTimeout;
    case Code::RemoteDisconnect: return kExitPeerLost;
    default: return 1;
  }
}

Result<LocalGroupOptions> launched_group_options() {
  EPLB_ASSIGN_OR_RETURN(LocalGroupOptions options, local_group_options_from_env());
  options.on_dropped = [](const std::string& line) { std::fprintf(stderr, "eplb: %s\n", line.c_str()); };
  return options;
}

Code code_for_exit(int exit_code, bool signalled) {
  if (signalled) return Code::RemoteDisconnect;
  switch (exit_code) {
    case 2: return Code::InvalidArgument;
    case 3: return Code::ParseError;
    case kExitTimeout: return Code::Timeout;
    case kExitPeerLost: return Code::RemoteDisconnect;
    default: return Code::Aborted;
  }
}

Status launch_status(const LaunchResult& launched) {
  if (launched.status.is_ok() || launched.failed_rank < 0) return launched.status;
  const int exit_code = launched.exit_codes[size_t(launched.failed_rank)];
  return Status(code_for_exit(exit_code, launched.failed_rank_signalled), launched.status.message());
}

// A first argument that is neither an option nor a command: named, with the
// commands there are (CLI11 would say "A subcommand is required", and with
// --help after it print the main help and exit 0). Returns true if refused.
bool refuse_unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::string names;
  for (const CLI::App* command : app.get_subcommands({})) {
    if (command->get_name().empty()) continue;  // an option group
    if (command->check_name(argv[1])) return false;
    names += (names.empty() ? "" : ", ") + command->get_name();
  }
  std::fprintf(stderr, "eplb: unknown command '%s'; the commands are %s (eplb --help)\n", argv[1], names.c_str());
  return true;
}

// A parse error: help and version exit 0 as CLI11 prints them; every other
// error is one line and exit 2, the documented code of a bad argument
// (CLI11's own codes, 105, 106, 109..., are not).
int parse_error_exit(CLI::App& app, const CLI::ParseError& parse_error) {
  if (parse_error.get_exit_code() == 0) return app.exit(parse_error);
  std::fprintf(stderr, "eplb: %s (--help for usage)\n", parse_error.what());
  return 2;
}

}  // namespace eplb::cli

int main(int argc, char** argv) {
  using namespace eplb::cli;
  CLI::App app{
      "eplb - expert-parallel load balancing for Mixture-of-Experts models.\n"
      "Places expert replicas on ranks from load statistics, plans the smallest\n"
      "weight migration, and moves the weights with verified one-sided transfers."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "eplb " EPLB_VERSION);
  auto commands = registry();
  std::stable_sort(commands.begin(), commands.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, add] : commands) add(app);
  check_integer_options(app);
  if (refuse_unknown_command(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& parse_error) {
    return parse_error_exit(app, parse_error);
  } catch (const std::exception& unexpected) {
    std::fprintf(stderr, "eplb: internal error: %s\n", unexpected.what());
    return 1;
  }
  const auto& result = command_result();
  if (!result) return 0;
  if (!result->is_ok()) {
    std::fprintf(stderr, "eplb: %s\n", result->to_string().c_str());
    return command_exit_code().value_or(exit_code_for(*result));
  }
  return 0;
}
