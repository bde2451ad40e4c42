// Shared helpers for the file readers and writers: whole-file I/O, number
// formatting and the value checks every load format applies.
#include <fmt/format.h>
#include "io_util.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace eplb::io {

Status file_error(Code code, std::string_view name, std::string_view what) {
  std::string message(name);
  message += ": ";
  message += what;
  return Status(code, std::move(message));
}

Result<std::vector<uint8_t>> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error(Code::IoError, path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> bytes;
  size_t used = 0;
  for (;;) {
    if (bytes.size() - used < 65536) bytes.resize(std::max<size_t>(bytes.size() * 2, used + 65536));
    ssize_t got = ::read(fd, bytes.data() + used, bytes.size() - used);
    if (got < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      return file_error(Code::IoError, path, fmt::format("cannot read at byte {}: {}", used, std::strerror(saved)));
    }
    if (got == 0) break;
    used += size_t(got);
  }
  ::close(fd);
  bytes.resize(used);
  return bytes;
}

Status write_file(const std::string& path, std::string_view bytes) {
  std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return file_error(Code::IoError, path, std::string("cannot create: ") + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t wrote = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      return file_error(Code::IoError, path,
                        fmt::format("cannot write {} bytes: {}", bytes.size(), std::strerror(saved)));
    }
    done += size_t(wrote);
  }
  if (::close(fd) != 0) {
    int saved = errno;
    ::unlink(temporary.c_str());
    return file_error(Code::IoError, path, std::string("cannot close: ") + std::strerror(saved));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(temporary.c_str());
    return file_error(Code::IoError, path, std::string("cannot rename into place: ") + std::strerror(saved));
  }
  return Status::ok();
}

std::string extension_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string extension = path.substr(dot);
  for (char& c : extension)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return extension;
}

void append_number(std::string& out, double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) {  // cannot happen with 64 bytes; keep a readable fallback
    out += "nan";
    return;
  }
  out.append(buffer, end);
}

bool exact_in_double(int64_t value) {
  double converted = double(value);
  // 2^63 itself is out of int64's range: converting it back would be undefined.
  if (converted >= 9223372036854775808.0 || converted < -9223372036854775808.0) return false;
  return int64_t(converted) == value;
}

bool exact_in_double(uint64_t value) {
  double converted = double(value);
  if (converted >= 18446744073709551616.0) return false;
  return uint64_t(converted) == value;
}

Status check_load_value(double value, std::string_view name, std::string_view where) {
  if (std::isnan(value)) return file_error(Code::ParseError, name, std::string(where) + ": value is NaN");
  if (std::isinf(value))
    return file_error(Code::ParseError, name, std::string(where) + ": value is " + (value > 0 ? "+" : "-") +
                                                  "infinity");
  if (value < 0) {
    std::string text;
    append_number(text, value);
    return file_error(Code::ParseError, name, std::string(where) + ": value " + text +
                                                  " is negative (loads are token counts >= 0)");
  }
  return Status::ok();
}

Status check_trace_shape(const LoadTrace& trace, std::string_view name) {
  if (trace.num_steps <= 0 || trace.num_layers <= 0 || trace.num_experts <= 0)
    return file_error(
        Code::ParseError, name,
        fmt::format("empty load (shape {} x {} x {})", trace.num_steps, trace.num_layers, trace.num_experts));
  if (trace.values.size() != size_t(trace.num_steps) * size_t(trace.num_layers) * size_t(trace.num_experts))
    return file_error(Code::Internal, name, "parsed values do not match the shape");
  return Status::ok();
}

}  // namespace eplb::io
