// Checks shared by the subcommands' options (options.h).
#include "options.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "common/text.h"

namespace eplb::cli {

Status check_duration(double seconds, std::string_view flag, bool zero_is_automatic) {
  if (zero_is_automatic && seconds == 0) return Status::ok();
  if (std::isfinite(seconds) && seconds > 0 && seconds <= kMaxDurationSeconds) return Status::ok();
  return error(Code::InvalidArgument,
               fmt::format("{} must be a number of seconds in (0, {}] (one day){}, got {}", flag, kMaxDurationSeconds,
                           zero_is_automatic ? " or 0 (automatic)" : "", seconds));
}

CLI::Validator duration_seconds() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto seconds = text::parse_double_nearest(text, "duration");
        if (!seconds) return seconds.status().message();
        Status valid = check_duration(*seconds, "the value");
        return valid ? std::string() : valid.message();
      },
      "SECONDS in (0, 86400]");
}

CLI::Validator integer_in(int64_t low, int64_t high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        auto value = text::parse_int(text, "value");
        if (value && *value >= low && *value <= high) return std::string();
        if (low == std::numeric_limits<int64_t>::min()) return fmt::format("an integer is expected, got '{}'", text);
        if (high == std::numeric_limits<int>::max()) return fmt::format("an integer >= {} is expected, got '{}'", low, text);
        return fmt::format("an integer in [{}, {}] is expected, got '{}'", low, high, text);
      },
      "INT");
}

CLI::Validator positive_integer() { return integer_in(1, std::numeric_limits<int>::max()); }

void check_integer_options(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type == "INT") option->check(integer_in(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    else if (type == "UINT")
      option->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return text::parse_uint(text, "value") ? std::string()
                                                   : fmt::format("a non-negative integer is expected, got '{}'", text);
          },
          "UINT"));
  }
  for (CLI::App* command : app.get_subcommands({})) check_integer_options(*command);
}

void add_max_input_bytes(CLI::App& command, std::string& value) {
  value = "1GiB";
  command
      .add_option("--max-input-bytes", value,
                  "largest text input file (.csv, .json) read, e.g. 256MiB, 4GiB; a larger one is refused before it\n"
                  "is read (.npy files are read exactly as far as their header declares). Inputs must be regular files")
      ->capture_default_str();
}

Result<uint64_t> parse_max_input_bytes(const std::string& value) {
  auto bytes = parse_byte_size(value);
  if (!bytes) return bytes.status().with_context("--max-input-bytes");
  return *bytes;
}

void add_cost_aware_options(CLI::App& command, PolicyOptions& options) {
  command
      .add_option("--cluster", options.cluster,
                  "cost-aware: the hosts and network that price a migration (h100, h200; docs/scale.md)")
      ->capture_default_str();
  command
      .add_option("--interval-s", options.interval_seconds,
                  "cost-aware: seconds until the next rebalance (the tokens a move's balance buys are counted over it)")
      ->check(CLI::Range(1e-6, 1e9))
      ->capture_default_str();
  command
      .add_option("--stall-mode", options.stall_mode,
                  "cost-aware: how serving waits for the migration: sync, async-copy or async-swap")
      ->check(CLI::IsMember({"sync", "async-copy", "async-swap"}))
      ->capture_default_str();
}

}  // namespace eplb::cli
