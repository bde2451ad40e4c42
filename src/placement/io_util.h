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

// An input file opened with O_NONBLOCK (a FIFO cannot hang the open) and
// kept only if it is a regular file: a FIFO, device, socket or directory is
// IoError at once, naming what it is. Closes itself.
class RegularFile {
 public:
  static Result<RegularFile> open(const std::string& path);
  RegularFile(RegularFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  RegularFile& operator=(RegularFile&&) = delete;
  ~RegularFile();
  uint64_t size() const { return size_; }  // as fstat saw it when opened
  // Appends bytes from the current position until `bytes` holds `total`
  // bytes or the file ends; never reads past `total`. Callers keep `total`
  // within size() (+1): the buffer is sized to it up front.
  Status read_up_to(std::vector<uint8_t>& bytes, uint64_t total, std::string_view name);

 private:
  RegularFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_;
  uint64_t size_;
};

// Reads a whole regular text file of at most `max_bytes` bytes: a larger
// one is IoError naming both sizes, before (or, if it grows, while) reading.
Result<std::vector<uint8_t>> read_text_input(const std::string& path, uint64_t max_bytes);
// Reads and parses a regular .npy file, reading no more bytes than its
// header declares (load_npy.cpp).
Result<LoadTrace> read_npy_input(const std::string& path);
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
