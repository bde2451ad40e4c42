// Load files on disk: readers dispatch on the extension to the parsers over
// bytes; writers produce files those parsers read back exactly.
//
// Writers: .npy is always float64 ('<f8', format 1.0, data 64-byte aligned):
// every double, integral or not, round-trips bit for bit. .csv and .json
// print each value as the shortest decimal that reads back as the same double
// (integers print as integers). A trace of more than one step cannot be
// written as .csv (CSV holds one [L][E] matrix): write_load_trace refuses it.
#include <fmt/format.h>
#include <cmath>
#include <string>

#include "eplb/placement_io.h"
#include "io_util.h"

namespace eplb {
namespace {

using io::file_error;

Result<LoadTrace> parse_by_extension(const std::string& path, uint64_t max_text_bytes) {
  std::string extension = io::extension_of(path);
  if (extension != ".npy" && extension != ".csv" && extension != ".json")
    return file_error(Code::Unsupported, path,
                      "unknown load file extension '" + extension + "' (expected .npy, .csv or .json)");
  if (extension == ".npy") return io::read_npy_input(path);
  EPLB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, io::read_text_input(path, max_text_bytes));
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (extension == ".csv") return parse_load_csv(text, path);
  return parse_load_json(text, path);
}

std::string text_rows(const double* values, int rows, int columns, bool json, const char* indent) {
  std::string out;
  out.reserve(size_t(rows) * size_t(columns) * 6 + 16);
  for (int r = 0; r < rows; ++r) {
    if (json) out += indent, out += '[';
    for (int c = 0; c < columns; ++c) {
      if (c) out += json ? ", " : ",";
      io::append_number(out, values[size_t(r) * size_t(columns) + size_t(c)]);
    }
    if (json) out += r + 1 < rows ? "],\n" : "]\n";
    else out += '\n';
  }
  return out;
}

Status check_writable(const std::string& path, int steps, int layers, int experts, size_t values) {
  if (steps <= 0 || layers <= 0 || experts <= 0 ||
      values != size_t(steps) * size_t(layers) * size_t(experts))
    return file_error(
        Code::InvalidArgument, path,
        fmt::format("cannot write a load of shape {} x {} x {} holding {} values", steps, layers, experts, values));
  return Status::ok();
}

Status check_values(const std::string& path, const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]) || values[i] < 0) {
      std::string text;
      io::append_number(text, values[i]);
      return file_error(
          Code::InvalidArgument, path,
          fmt::format("refusing to write value {} at flat index {} (loads must be finite and >= 0)", text, i));
    }
  return Status::ok();
}

}  // namespace

LoadMatrix LoadTrace::sum(int first, int count) const {
  LoadMatrix matrix(num_layers, num_experts);
  int begin = std::max(first, 0);
  int64_t end = std::min<int64_t>(int64_t(first) + count, num_steps);
  size_t per_step = size_t(num_layers) * size_t(num_experts);
  for (int64_t step = begin; step < end; ++step)
    for (size_t i = 0; i < per_step; ++i) matrix.values[i] += values[size_t(step) * per_step + i];
  return matrix;
}

Result<LoadTrace> read_load_trace(const std::string& path, uint64_t max_text_bytes) {
  return parse_by_extension(path, max_text_bytes);
}

Result<LoadMatrix> read_load_file(const std::string& path, int expected_experts, uint64_t max_text_bytes) {
  EPLB_ASSIGN_OR_RETURN(LoadTrace trace, parse_by_extension(path, max_text_bytes));
  if (expected_experts > 0 && trace.num_experts != expected_experts)
    return file_error(
        Code::ParseError, path,
        fmt::format("has {} experts (columns) per layer, the topology has {}", trace.num_experts, expected_experts));
  LoadMatrix load = trace.sum(0, trace.num_steps);
  for (size_t i = 0; i < load.values.size(); ++i)
    if (!std::isfinite(load.values[i]))
      return file_error(Code::ParseError, path,
                        fmt::format("the sum over {} steps overflows at [{}][{}]", trace.num_steps,
                                    i / size_t(load.num_experts), i % size_t(load.num_experts)));
  return load;
}

Status write_load_file(const std::string& path, const LoadMatrix& load) {
  EPLB_TRY(check_writable(path, 1, load.num_layers, load.num_experts, load.values.size()));
  EPLB_TRY(check_values(path, load.values));
  std::string extension = io::extension_of(path);
  if (extension == ".npy") {
    std::vector<uint8_t> bytes =
        encode_npy_float64({size_t(load.num_layers), size_t(load.num_experts)}, load.values);
    return io::write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  if (extension == ".csv")
    return io::write_file(path, text_rows(load.values.data(), load.num_layers, load.num_experts, false, ""));
  if (extension == ".json")
    return io::write_file(path, "[\n" + text_rows(load.values.data(), load.num_layers, load.num_experts, true, "  ") +
                                    "]\n");
  return file_error(Code::InvalidArgument, path,
                    "unknown load file extension '" + extension + "' (expected .npy, .csv or .json)");
}

Status write_load_trace(const std::string& path, const LoadTrace& trace) {
  EPLB_TRY(check_writable(path, trace.num_steps, trace.num_layers, trace.num_experts, trace.values.size()));
  EPLB_TRY(check_values(path, trace.values));
  std::string extension = io::extension_of(path);
  if (extension == ".npy") {
    std::vector<uint8_t> bytes = encode_npy_float64(
        {size_t(trace.num_steps), size_t(trace.num_layers), size_t(trace.num_experts)}, trace.values);
    return io::write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  if (extension == ".csv") {
    if (trace.num_steps != 1)
      return file_error(
          Code::InvalidArgument, path,
          fmt::format("a CSV load file holds one [L][E] matrix, not a trace of {} steps; write .npy or .json instead",
                      trace.num_steps));
    return io::write_file(path, text_rows(trace.values.data(), trace.num_layers, trace.num_experts, false, ""));
  }
  if (extension == ".json") {
    std::string out = "[\n";
    size_t per_step = size_t(trace.num_layers) * size_t(trace.num_experts);
    for (int step = 0; step < trace.num_steps; ++step) {
      out += " [\n";
      out += text_rows(trace.values.data() + size_t(step) * per_step, trace.num_layers, trace.num_experts, true,
                       "  ");
      out += step + 1 < trace.num_steps ? " ],\n" : " ]\n";
    }
    out += "]\n";
    return io::write_file(path, out);
  }
  return file_error(Code::InvalidArgument, path,
                    "unknown load file extension '" + extension + "' (expected .npy, .csv or .json)");
}

}  // namespace eplb
