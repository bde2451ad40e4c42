// Shared helpers for the file readers and writers: whole-file I/O, number
// formatting and the value checks every load format applies.
#include <fmt/format.h>
#include "io_util.h"

#include "common/files.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace eplb::io {

Status file_error(Code code, std::string_view name, std::string_view what) {
  std::string message(name);
  message += ": ";
  message += what;
  return Status(code, std::move(message));
}

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

Result<RegularFile> RegularFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return file_error(Code::IoError, path, std::string("cannot open: ") + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    int saved = errno;
    ::close(fd);
    return file_error(Code::IoError, path, std::string("cannot stat: ") + std::strerror(saved));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return file_error(Code::IoError, path,
                      fmt::format("is {}; input files must be regular files", file_kind(info.st_mode)));
  }
  return RegularFile(fd, uint64_t(info.st_size));
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RegularFile::read_up_to(std::vector<uint8_t>& bytes, uint64_t total, std::string_view name) {
  if (total <= bytes.size()) return Status::ok();
  size_t used = bytes.size();
  bytes.resize(size_t(total));
  while (used < bytes.size()) {
    ssize_t got = ::read(fd_, bytes.data() + used, std::min<size_t>(bytes.size() - used, size_t(1) << 24));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) {
      int saved = errno;
      return file_error(Code::IoError, name, fmt::format("cannot read at byte {}: {}", used, std::strerror(saved)));
    }
    if (got == 0) break;
    used += size_t(got);
  }
  bytes.resize(used);
  return Status::ok();
}

Result<std::vector<uint8_t>> read_text_input(const std::string& path, uint64_t max_bytes) {
  EPLB_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  auto too_large = [&](uint64_t seen) {
    return file_error(Code::IoError, path,
                      fmt::format("{} {} bytes, more than the text input limit of {} bytes (max-input-bytes)",
                                  seen > file.size() ? "grew past" : "is", seen, max_bytes));
  };
  if (file.size() > max_bytes) return too_large(file.size());
  std::vector<uint8_t> bytes;
  // One byte more than the limit tells a file that grew while being read.
  EPLB_TRY(file.read_up_to(bytes, std::min(max_bytes, file.size()) + 1, path));
  if (bytes.size() > max_bytes) return too_large(bytes.size());
  return bytes;
}

Status write_file(const std::string& path, std::string_view bytes) { return files::write_atomically(path, bytes); }

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
