// .csv load files: one layer per line, comma-separated numbers, no header.
// Tolerated: a UTF-8 byte-order mark, spaces or tabs around numbers, \r\n line
// ends, a trailing newline and blank lines at the very end. Everything else
// (empty cells, ragged rows, text, NaN/Inf, negative numbers) is an error
// naming line:column.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "eplb/placement_io.h"
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
  while (pos < end) {
    ++line;
    size_t line_start = pos;
    size_t line_end = text.find('\n', pos);
    if (line_end == std::string_view::npos || line_end > end) line_end = end;
    std::string_view row = text.substr(line_start, line_end - line_start);
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    auto where = [&](size_t column_offset) {
      return "line " + std::to_string(line) + ":" + std::to_string(column_offset + 1);
    };
    size_t count = 0;
    size_t cell_start = 0;
    for (;;) {
      size_t comma = row.find(',', cell_start);
      size_t cell_end = comma == std::string_view::npos ? row.size() : comma;
      size_t first = cell_start, last = cell_end;
      while (first < last && is_space(row[first])) ++first;
      while (last > first && is_space(row[last - 1])) --last;
      std::string_view cell = row.substr(first, last - first);
      if (cell.empty()) {
        if (row.find_first_not_of(" \t") == std::string_view::npos)
          return file_error(Code::ParseError, name, where(0) + ": empty line inside the file (every line is a layer)");
        return file_error(Code::ParseError, name, where(first) + ": empty cell (value " + std::to_string(count + 1) +
                                                      " of the line)");
      }
      std::string_view number = cell;
      if (number.front() == '+') number.remove_prefix(1);
      double value = 0;
      auto [stop, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
      if (ec == std::errc::result_out_of_range && stop == number.data() + number.size()) {
        // from_chars leaves `value` untouched on overflow and on underflow: strtod tells them apart.
        std::string copy(number);
        value = std::strtod(copy.c_str(), nullptr);
        if (std::isinf(value))
          return file_error(Code::ParseError, name, where(first) + ": number " + shown(cell) +
                                                        " overflows a double (infinity)");
        ec = std::errc();  // an underflow: the nearest double (0 or a denormal) is the value
      }
      if (ec != std::errc() || stop != number.data() + number.size() || number.empty() ||
          (number.data() != cell.data() && !(number.front() >= '0' && number.front() <= '9') && number.front() != '.')) {
        std::string hint = line == 1 ? " (CSV load files have no header line)" : "";
        return file_error(Code::ParseError, name, where(first) + ": cell " + shown(cell) + " is not a number" + hint);
      }
      // Integers beyond 2^53 would be rounded silently: refuse them.
      if (number.find_first_not_of("0123456789") == std::string_view::npos && number.size() > 15) {
        uint64_t integer = 0;
        auto [integer_end, integer_ec] = std::from_chars(number.data(), number.data() + number.size(), integer);
        if (integer_ec != std::errc() || integer_end != number.data() + number.size() || !io::exact_in_double(integer))
          return file_error(Code::ParseError, name, where(first) + ": integer " + shown(cell) +
                                                        " is not exactly representable as a double");
      }
      if (value < 0 || !std::isfinite(value)) EPLB_TRY(io::check_load_value(value, name, where(first)));
      trace.values.push_back(value);
      ++count;
      if (comma == std::string_view::npos) break;
      cell_start = comma + 1;
    }
    if (line == 1) {
      columns = count;
      if (columns > size_t(INT32_MAX))
        return file_error(Code::ParseError, name, where(0) + ": too many columns");
    } else if (count != columns) {
      return file_error(Code::ParseError, name, where(0) + ": ragged rows: this line has " + std::to_string(count) +
                                                    " values, line 1 has " + std::to_string(columns));
    }
    if (line >= INT32_MAX) return file_error(Code::ParseError, name, where(0) + ": too many lines");
    pos = line_end + 1;
  }
  trace.num_layers = int(line);
  trace.num_experts = int(columns);
  EPLB_TRY(io::check_trace_shape(trace, name));
  return trace;
}

}  // namespace eplb
