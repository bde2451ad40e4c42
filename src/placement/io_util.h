// io_util.h - helpers shared by the load-file and placement-file readers and
// writers (private to eplb_placement).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/placement_io.h"
#include "eplb/status.h"

namespace eplb::io {

// "<name>: <what>" as a status of the given code.
Status file_error(Code code, std::string_view name, std::string_view what);

// Reads a whole file. IoError naming the path and the system's reason.
Result<std::vector<uint8_t>> read_file(const std::string& path);
// Writes a whole file atomically (temporary file in the same directory, then rename).
Status write_file(const std::string& path, std::string_view bytes);

// Lower-case extension including the dot ("" if none): "a/b.NPY" -> ".npy".
std::string extension_of(const std::string& path);

// Shortest text that reads back as exactly the same double ("12", "0.1", "1e+300").
void append_number(std::string& out, double value);

// True when the integer converts to a double without rounding.
bool exact_in_double(int64_t value);
bool exact_in_double(uint64_t value);

// Checks a value read from a load file: finite and >= 0. `where` names the
// position ("byte 128, [0][3][7]"); the message says what is wrong.
Status check_load_value(double value, std::string_view name, std::string_view where);

// Validates the shape of a parsed trace (every dimension > 0, values sized).
Status check_trace_shape(const LoadTrace& trace, std::string_view name);

}  // namespace eplb::io
