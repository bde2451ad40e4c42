// options.h - checks shared by the eplb subcommands' options: durations
// (finite, > 0, at most a day), the input size limit (--max-input-bytes) and
// report files (--json, --metrics) that must be writable before any work.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "eplb/policy.h"
#include "eplb/status.h"

namespace eplb::cli {

inline constexpr double kMaxDurationSeconds = 86400;

// A duration flag's value: finite, > 0 (or exactly 0 when `zero_is_automatic`)
// and at most one day; otherwise InvalidArgument naming the flag.
Status check_duration(double seconds, std::string_view flag, bool zero_is_automatic = false);
// The same check as a CLI11 validator (for options checked at parse time).
CLI::Validator duration_seconds();

// An integer option's value: an integer in [low, high], else a message
// saying that an integer is expected (CLI11's numeric ranges check doubles
// and print their limits in full).
CLI::Validator integer_in(int64_t low, int64_t high);
CLI::Validator positive_integer();
// Gives every integer option of `app` and its subcommands an integer_in
// check of its type's range (run after the commands are added).
void check_integer_options(CLI::App& app);

// --max-input-bytes on a command that reads input files.
void add_max_input_bytes(CLI::App& command, std::string& value);
// Its value in bytes (the byte-size grammar of common/text.h).
Result<uint64_t> parse_max_input_bytes(const std::string& value);

// The cost-aware policy's options (PolicyOptions: --cluster, --interval-s,
// --stall-mode; the expert size comes from the command's --bytes-per-expert).
void add_cost_aware_options(CLI::App& command, PolicyOptions& options);

}  // namespace eplb::cli
