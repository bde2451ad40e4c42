// eplb/placement_io.h - load files, load traces and placement JSON.
//
// Contract: every reader treats the file as untrusted input. It checks every
// length and index before use, never reads outside its buffer, and returns
// ParseError / Unsupported / IoError with a message naming the file, the
// position (byte offset, line and column, or JSON path) and the problem.
// Never a crash, never a silently wrong matrix.
//
// Load files, by extension:
//  .npy  NumPy format 1.0/2.0/3.0, C order, little-endian int32, int64,
//        float32 or float64; 2-D [L][E], or 3-D [W][L][E] (a trace).
//  .csv  one layer per line, comma-separated numbers, no header.
//  .json an array of arrays ([L][E]) or of arrays of arrays ([W][L][E]),
//        or an object whose key "load" holds one.
// Values must be finite and >= 0.
//
// Input files are opened without blocking and must be regular files (a FIFO,
// device, socket or directory is IoError at once). A .npy file is read no
// further than its header declares (a file of another size is refused before
// its data is read); a text file (.csv, .json, placement JSON) larger than
// `max_text_bytes` is refused before it is read.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/placement.h"
#include "eplb/status.h"

namespace eplb {

// The default limit on text inputs (the CLI's --max-input-bytes): 1 GiB.
inline constexpr uint64_t kDefaultMaxInputBytes = uint64_t(1) << 30;

// Reads a 2-D load matrix; a 3-D trace is summed over its first axis.
// `expected_experts` > 0 also checks the number of experts (columns).
Result<LoadMatrix> read_load_file(const std::string& path, int expected_experts = 0,
                                  uint64_t max_text_bytes = kDefaultMaxInputBytes);
// Reads a 3-D trace; a 2-D file is a trace of one step.
Result<LoadTrace> read_load_trace(const std::string& path, uint64_t max_text_bytes = kDefaultMaxInputBytes);

// Parsers over bytes already in memory (what the file readers and fuzzers use).
// `name` names the source in error messages.
Result<LoadTrace> parse_npy(std::span<const uint8_t> bytes, std::string_view name);
Result<LoadTrace> parse_load_csv(std::string_view text, std::string_view name);
Result<LoadTrace> parse_load_json(std::string_view text, std::string_view name);

// Writers (format chosen by extension for write_load_file).
Status write_load_file(const std::string& path, const LoadMatrix& load);
Status write_load_trace(const std::string& path, const LoadTrace& trace);
std::vector<uint8_t> encode_npy_float64(const std::vector<size_t>& shape, const std::vector<double>& values);

// Placement JSON: {"topology": {...}, "phy2log": [[...]], "log2phy": [[[...]]],
// "logcnt": [[...]]} plus optional extra keys (policy, metrics) via `extra`.
std::string placement_to_json(const Placement& placement, const Topology& topology,
                              const std::string& extra_json_object = "{}");
Status write_placement_file(const std::string& path, const Placement& placement, const Topology& topology,
                            const std::string& extra_json_object = "{}");

struct PlacementFile {
  Topology topology;
  Placement placement;
};
Result<PlacementFile> parse_placement_json(std::string_view text, std::string_view name);
Result<PlacementFile> read_placement_file(const std::string& path, uint64_t max_text_bytes = kDefaultMaxInputBytes);

}  // namespace eplb
