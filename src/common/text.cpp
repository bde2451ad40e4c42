// The text helpers of common/text.h, all on std::from_chars.
#include "text.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace eplb::text {
namespace {

template <typename T>
Result<T> parse_whole(std::string_view text, std::string_view what, std::string_view kind) {
  T value{};
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || stop != end)
    return error(Code::InvalidArgument, fmt::format("{} '{}' is not {}", what, text, kind));
  return value;
}

}  // namespace

// The unit of a byte size as a power of 1024 (any case); -1 if unknown.
int unit_power(std::string_view unit) {
  std::string lower;
  for (char c : unit) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  static constexpr std::string_view kUnits[][3] = {
      {"b", "", ""}, {"k", "kb", "kib"}, {"m", "mb", "mib"}, {"g", "gb", "gib"}, {"t", "tb", "tib"}};
  if (lower.empty()) return 0;
  for (int power = 0; power < 5; ++power)
    for (std::string_view name : kUnits[power])
      if (!name.empty() && lower == name) return power;
  return -1;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> items;
  size_t start = 0;
  for (;;) {
    size_t end = text.find(separator, start);
    items.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return items;
    start = end + 1;
  }
}

std::string_view trim(std::string_view text) {
  size_t first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  size_t last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

Result<int64_t> parse_int(std::string_view text, std::string_view what) {
  return parse_whole<int64_t>(text, what, "an integer");
}

Result<uint64_t> parse_uint(std::string_view text, std::string_view what) {
  return parse_whole<uint64_t>(text, what, "a non-negative integer");
}

Result<double> parse_double(std::string_view text, std::string_view what) {
  EPLB_ASSIGN_OR_RETURN(double value, parse_whole<double>(text, what, "a number"));
  if (!std::isfinite(value)) return error(Code::InvalidArgument, fmt::format("{} '{}' is not finite", what, text));
  return value;
}

namespace {

// The decimal exponent of the leading digit of a number in from_chars'
// general format ("0.00012e-3" -> -7); only for numbers out of range.
int64_t decimal_magnitude(std::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  const size_t e = text.find_first_of("eE");
  int64_t exponent = 0;
  if (e != std::string_view::npos) {
    std::string_view digits = text.substr(e + 1);
    if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
    std::from_chars(digits.data(), digits.data() + digits.size(), exponent);
  }
  const std::string_view mantissa = text.substr(0, e);
  const size_t point = std::min(mantissa.find('.'), mantissa.size());
  const size_t first = mantissa.find_first_not_of("0.");
  if (first == std::string_view::npos) return INT64_MIN;  // zero
  return exponent + (first < point ? int64_t(point - first) - 1 : -int64_t(first - point));
}

}  // namespace

Result<double> parse_double_nearest(std::string_view text, std::string_view what) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range && stop == end) {
    if (decimal_magnitude(text) >= 0)
      return error(Code::InvalidArgument, fmt::format("{} '{}' overflows a double", what, text));
    return text[0] == '-' ? -0.0 : 0.0;
  }
  if (text.empty() || ec != std::errc() || stop != end)
    return error(Code::InvalidArgument, fmt::format("{} '{}' is not a number", what, text));
  return value;
}

Result<int64_t> parse_int_in(std::string_view text, std::string_view what, int64_t low, int64_t high) {
  auto value = parse_whole<int64_t>(text, what, "an integer");
  if (!value || *value < low || *value > high)
    return error(Code::InvalidArgument, fmt::format("{} '{}' is not an integer in [{}, {}]", what, text, low, high));
  return value;
}

Result<std::string> job_secret_from_environment() {
  const char* secret = std::getenv("EPLB_RUN_SECRET");
  if (secret == nullptr || *secret == '\0') return std::string();  // set but empty: none, as unset
  const std::string_view text(secret);
  if (text.size() != 64 || text.find_first_not_of("0123456789abcdef") != std::string_view::npos)
    return error(Code::InvalidArgument,
                 fmt::format("EPLB_RUN_SECRET is not 64 lowercase hex digits ({} characters)", text.size()));
  return std::string(text);
}

}  // namespace eplb::text

namespace eplb {

Result<uint64_t> parse_byte_size(std::string_view text) {
  auto bad = [&] {
    return error(Code::InvalidArgument,
                 fmt::format("'{}' is not a byte size (examples: 4096, 4K, 512KiB, 1MiB, 1.5GiB; units B, "
                             "K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB are all powers of 1024)",
                             text));
  };
  size_t digits = 0;
  while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) ++digits;
  const int power = text::unit_power(text.substr(digits));
  if (digits == 0 || power < 0) return bad();
  const std::string_view number = text.substr(0, digits);
  const double scale = std::ldexp(1.0, 10 * power);
  double bytes = 0;
  if (number.find('.') == std::string_view::npos) {
    auto whole = text::parse_uint(number, "byte size");
    if (!whole) return bad();
    bytes = double(*whole) * scale;
  } else {
    auto fraction = text::parse_double(number, "byte size");
    if (!fraction) return bad();
    bytes = *fraction * scale;
  }
  if (!(bytes >= 1) || bytes > std::ldexp(1.0, 40) || bytes != std::floor(bytes))
    return error(Code::InvalidArgument,
                 fmt::format("byte size '{}' must be a whole number of bytes in [1 B, 1 TiB]", text));
  return static_cast<uint64_t>(bytes);
}

}  // namespace eplb
