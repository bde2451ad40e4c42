// .csv load files: one layer per line, comma-separated numbers, no header.
// Tolerated: a UTF-8 byte-order mark, spaces or tabs around numbers, \r\n line
// ends, a trailing newline and blank lines at the very end. Everything else
// (empty cells, ragged rows, text, NaN/Inf, negative numbers) is an error
// naming line:column.
#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <string>

#include "eplb/placement_io.h"
#include "common/text.h"
#include "io_util.h"

namespace eplb {
namespace {

using io::file_error;

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string shown(std::string_view cell) {
  std::string out;
  for (char c : cell.substr(0, 24)) {
    unsigned char u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (cell.size() > 24) out += "...";
  return "'" + out + "'";
}

// One cell as a load value; `where` names its line:column.
Result<double> parse_cell(std::string_view cell, std::string_view name, const std::string& where, bool first_line) {
  std::string_view number = cell;
  if (number.front() == '+') number.remove_prefix(1);
  const bool starts_like_a_number = !number.empty() && ((number.front() >= '0' && number.front() <= '9') ||
                                                        number.front() == '.' || number.data() == cell.data());
  auto value = starts_like_a_number ? text::parse_double_nearest(number, "cell") : Result<double>(Status(Code::ParseError, ""));
  if (!value) {
    if (value.status().message().ends_with("overflows a double"))
      return file_error(Code::ParseError, name, fmt::format("{}: number {} overflows a double (infinity)", where,
                                                            shown(cell)));
    return file_error(Code::ParseError, name, fmt::format("{}: cell {} is not a number{}", where, shown(cell),
                                                          first_line ? " (CSV load files have no header line)" : ""));
  }
  // Integers beyond 2^53 would be rounded silently: refuse them.
  if (number.find_first_not_of("0123456789") == std::string_view::npos && number.size() > 15) {
    auto integer = text::parse_uint(number, "cell");
    if (!integer || !io::exact_in_double(*integer))
      return file_error(Code::ParseError, name, fmt::format("{}: integer {} is not exactly representable as a double",
                                                            where, shown(cell)));
  }
  if (*value < 0 || !std::isfinite(*value)) EPLB_TRY(io::check_load_value(*value, name, where));
  return value;
}

// The values of one line into `values`; their count into *count.
Status parse_line(std::string_view row, int64_t line, std::string_view name, std::vector<double>& values,
                  size_t* count) {
  auto where = [&](size_t column_offset) { return fmt::format("line {}:{}", line, column_offset + 1); };
  *count = 0;
  size_t cell_start = 0;
  for (std::string_view raw : text::split(row, ',')) {
    const std::string_view cell = text::trim(raw);
    const size_t first = cell.empty() ? cell_start : size_t(cell.data() - row.data());
    if (cell.empty()) {
      if (row.find_first_not_of(" \t") == std::string_view::npos)
        return file_error(Code::ParseError, name, where(0) + ": empty line inside the file (every line is a layer)");
      return file_error(Code::ParseError, name, fmt::format("{}: empty cell (value {} of the line)",
                                                            where(raw.data() - row.data() + raw.size()), *count + 1));
    }
    EPLB_ASSIGN_OR_RETURN(double value, parse_cell(cell, name, where(first), line == 1));
    values.push_back(value);
    ++*count;
    cell_start = size_t(raw.data() - row.data()) + raw.size() + 1;
  }
  return Status::ok();
}

}  // namespace

Result<LoadTrace> parse_load_csv(std::string_view text, std::string_view name) {
  size_t pos = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") pos = 3;  // UTF-8 byte-order mark (spreadsheets write one)
  // Find the end of the meaningful text: trailing blank lines are tolerated.
  size_t end = text.size();
  while (end > pos && (text[end - 1] == '\n' || text[end - 1] == '\r' || is_space(text[end - 1]))) --end;
  if (end == pos) return file_error(Code::ParseError, name, "empty file (expected one line of numbers per layer)");
  LoadTrace trace;
  trace.num_steps = 1;
  size_t columns = 0;
  int64_t line = 0;
  for (std::string_view row : text::split(text.substr(pos, end - pos), '\n')) {
    ++line;
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    size_t count = 0;
    EPLB_TRY(parse_line(row, line, name, trace.values, &count));
    if (line == 1) columns = count;
    else if (count != columns)
      return file_error(Code::ParseError, name, fmt::format("line {}:1: ragged rows: this line has {} values, line 1 "
                                                            "has {}",
                                                            line, count, columns));
    if (line >= INT32_MAX || columns > size_t(INT32_MAX))
      return file_error(Code::ParseError, name, fmt::format("line {}:1: too many lines or columns", line));
  }
  trace.num_layers = int(line);
  trace.num_experts = int(columns);
  EPLB_TRY(io::check_trace_shape(trace, name));
  return trace;
}

}  // namespace eplb
