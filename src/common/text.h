// common/text.h - the one way eplb splits text and reads numbers and byte
// sizes from it (option values, spec strings, environment variables).
//
// Contract: numbers are parsed with std::from_chars over the whole text (no
// locale, no leading '+' or spaces, no trailing characters); anything else
// is InvalidArgument naming `what` and the text. Byte sizes follow one
// grammar for every command: a decimal number and an optional unit, B, K,
// KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB (any case), all powers of 1024:
// "4096", "4K", "512KiB", "1.5GiB". Internal to the library (not installed).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/status.h"

namespace eplb::text {

// The unit of a byte size ("KiB", "m", "") as a power of 1024; -1 if unknown.
int unit_power(std::string_view unit);

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {""}.
std::vector<std::string_view> split(std::string_view text, char separator);
// Without leading and trailing spaces and tabs.
std::string_view trim(std::string_view text);

// The job's secret from EPLB_RUN_SECRET (the one place that reads it):
// "" when unset or empty; InvalidArgument unless 64 lowercase hex digits (what `eplb
// run`'s launcher gives its ranks; a Python job sets the same in every
// process, e.g. `secrets.token_hex(32)`).
Result<std::string> job_secret_from_environment();

// The whole text as a number. `what` names it in the error
// ("EPLB_RANK", "seed", "block size").
Result<int64_t> parse_int(std::string_view text, std::string_view what);
Result<uint64_t> parse_uint(std::string_view text, std::string_view what);
// Finite only ("nan", "inf" are refused).
Result<double> parse_double(std::string_view text, std::string_view what);
// Any double std::from_chars reads, "nan" and "inf" included (the caller
// checks what it accepts), and a number too small for a double (1e-400)
// as its nearest double, 0; one too large (1e400) is InvalidArgument
// "... overflows a double".
Result<double> parse_double_nearest(std::string_view text, std::string_view what);
// An integer in [low, high].
Result<int64_t> parse_int_in(std::string_view text, std::string_view what, int64_t low, int64_t high);

}  // namespace eplb::text

namespace eplb {

// A byte size in the grammar above, a whole number of bytes in [1 B, 1 TiB].
Result<uint64_t> parse_byte_size(std::string_view text);

}  // namespace eplb
