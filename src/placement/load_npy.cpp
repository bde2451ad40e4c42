// .npy load files: NumPy format 1.0 / 2.0 / 3.0, parsed without NumPy.
//
// Layout: magic "\x93NUMPY", major, minor, header length (uint16 for 1.0,
// uint32 for 2.0 and 3.0, little endian), a Python dict literal
// {'descr': '<f8', 'fortran_order': False, 'shape': (L, E), } padded with
// spaces and a newline, then the raw C-order data. Every length and index is
// checked before use; each error names the byte offset.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "eplb/placement_io.h"
#include "io_util.h"

namespace eplb {
namespace {

using io::file_error;

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

enum class Kind { SignedInt, UnsignedInt, Float };

struct Dtype {
  Kind kind = Kind::Float;
  int size = 8;
};

struct Header {
  bool has_descr = false, has_fortran = false, has_shape = false;
  std::string descr;
  bool fortran_order = false;
  std::vector<uint64_t> shape;
};

std::string quote_text(std::string_view text) {
  std::string out = "'";
  for (char c : text.substr(0, 40)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  if (text.size() > 40) out += "...";
  return out + "'";
}

// A tiny parser for the Python literal NumPy writes as the header.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, size_t base, std::string_view name) : text_(text), base_(base), name_(name) {}

  Status parse(Header& header) {
    skip_space();
    if (!eat('{')) return fail("expected '{' to open the header dict");
    for (;;) {
      skip_space();
      if (eat('}')) break;
      std::string key;
      EPLB_TRY(parse_string(key));
      skip_space();
      if (!eat(':')) return fail("expected ':' after key " + quote_text(key));
      skip_space();
      if (key == "descr") {
        if (header.has_descr) return fail("key 'descr' appears twice");
        header.has_descr = true;
        if (peek() == '[')
          return unsupported("structured dtypes (a list in 'descr') are not supported; save a plain numeric array");
        EPLB_TRY(parse_string(header.descr));
      } else if (key == "fortran_order") {
        if (header.has_fortran) return fail("key 'fortran_order' appears twice");
        header.has_fortran = true;
        EPLB_TRY(parse_bool(header.fortran_order));
      } else if (key == "shape") {
        if (header.has_shape) return fail("key 'shape' appears twice");
        header.has_shape = true;
        EPLB_TRY(parse_shape(header.shape));
      } else {
        return fail("unknown header key " + quote_text(key) + " (expected 'descr', 'fortran_order', 'shape')");
      }
      skip_space();
      if (eat(',')) continue;
      if (eat('}')) break;
      return fail("expected ',' or '}' in the header dict");
    }
    skip_space();
    if (pos_ != text_.size()) return fail("unexpected text after the header dict: " + quote_text(text_.substr(pos_)));
    if (!header.has_descr) return fail_at(0, "header has no 'descr' key");
    if (!header.has_fortran) return fail_at(0, "header has no 'fortran_order' key");
    if (!header.has_shape) return fail_at(0, "header has no 'shape' key");
    return Status::ok();
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r'))
      ++pos_;
  }
  Status fail_at(size_t pos, const std::string& what) const {
    return file_error(Code::ParseError, name_, fmt::format("byte {}: bad .npy header: {}", base_ + pos, what));
  }
  Status fail(const std::string& what) const {
    if (pos_ >= text_.size()) return fail_at(pos_, what + " (header ends early)");
    return fail_at(pos_, what + ", found " + quote_text(text_.substr(pos_, 12)));
  }
  Status unsupported(const std::string& what) const {
    return file_error(Code::Unsupported, name_, fmt::format("byte {}: {}", base_ + pos_, what));
  }

  Status parse_string(std::string& out) {
    char quote = peek();
    if (quote != '\'' && quote != '"') return fail("expected a quoted string");
    ++pos_;
    size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '\\' || c < 0x20 || c >= 0x7f) return fail("unexpected character in a string");
      ++pos_;
    }
    if (pos_ >= text_.size()) return fail_at(start - 1, "unterminated string");
    out.assign(text_.substr(start, pos_ - start));
    ++pos_;
    return Status::ok();
  }

  Status parse_bool(bool& out) {
    if (text_.substr(pos_, 4) == "True") {
      out = true;
      pos_ += 4;
      return Status::ok();
    }
    if (text_.substr(pos_, 5) == "False") {
      out = false;
      pos_ += 5;
      return Status::ok();
    }
    return fail("expected True or False for 'fortran_order'");
  }

  Status parse_shape(std::vector<uint64_t>& shape) {
    if (!eat('(')) return fail("expected '(' to open the shape tuple");
    for (;;) {
      skip_space();
      if (eat(')')) return Status::ok();
      if (shape.size() >= 32) return fail("shape has more than 32 dimensions");
      size_t start = pos_;
      uint64_t value = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        uint64_t digit = uint64_t(text_[pos_] - '0');
        if (value > (UINT64_MAX - digit) / 10) return fail_at(start, "shape dimension does not fit in 64 bits");
        value = value * 10 + digit;
        ++pos_;
      }
      if (pos_ == start) return fail("expected a non-negative integer in the shape tuple");
      eat('L');  // Python 2 long literal, as old NumPy wrote it
      shape.push_back(value);
      skip_space();
      if (eat(',')) continue;
      if (eat(')')) {
        if (shape.size() == 1) return fail_at(pos_ - 1, "a 1-element shape tuple needs a trailing comma");
        return Status::ok();
      }
      return fail("expected ',' or ')' in the shape tuple");
    }
  }

  std::string_view text_;
  size_t base_;
  std::string_view name_;
  size_t pos_ = 0;
};

Result<Dtype> parse_descr(const std::string& descr, std::string_view name, size_t at) {
  auto bad = [&](Code code, const std::string& why) {
    return file_error(code, name, fmt::format("byte {}: dtype {} {}", at, quote_text(descr), why));
  };
  const char* supported = "(supported: '<i4', '<i8', '<f4', '<f8', and '<i1' '|i1' '<u1' '|u1' '<i2' '<u2' '<u4' '<u8')";
  if (descr.size() < 3) return bad(Code::Unsupported, std::string("is not supported ") + supported);
  char order = descr[0];
  char kind = descr[1];
  std::string size_text = descr.substr(2);
  int size = 0;
  if (size_text == "1") size = 1;
  else if (size_text == "2") size = 2;
  else if (size_text == "4") size = 4;
  else if (size_text == "8") size = 8;
  if (order == '>' && size > 1)
    return bad(Code::Unsupported, "is big-endian; only little-endian data is supported (convert with "
                                  "a.astype(a.dtype.newbyteorder('<')))");
  if (order != '<' && order != '|' && order != '>')
    return bad(Code::Unsupported, std::string("has an unsupported byte order ") + supported);
  Dtype dtype;
  if (kind == 'i') dtype.kind = Kind::SignedInt;
  else if (kind == 'u') dtype.kind = Kind::UnsignedInt;
  else if (kind == 'f') dtype.kind = Kind::Float;
  else return bad(Code::Unsupported, std::string("is not supported ") + supported);
  if (size == 0 || (dtype.kind == Kind::Float && size != 4 && size != 8))
    return bad(Code::Unsupported, std::string("is not supported ") + supported);
  // '|' (byte order not applicable) is only meaningful for one-byte types.
  if (order == '|' && size != 1) return bad(Code::Unsupported, "uses byte order '|' for a multi-byte type");
  dtype.size = size;
  return dtype;
}

uint64_t load_little_endian(const uint8_t* bytes, int size) {
  uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    fmt::format_to(std::back_inserter(text), "{}", shape[i]);
  }
  if (shape.size() == 1) text += ",";
  return text + ")";
}

// Where the header sits: after the magic, the version and its length field.
struct Frame {
  size_t header_start = 0;
  uint64_t header_length = 0;
};

// The magic, the version and the header length field (the header itself
// may lie beyond `bytes`).
Result<Frame> check_prefix(std::span<const uint8_t> bytes, std::string_view name) {
  if (bytes.empty()) return file_error(Code::ParseError, name, "empty file (expected a .npy array)");
  size_t magic_seen = std::min(bytes.size(), sizeof kMagic);
  if (std::memcmp(bytes.data(), kMagic, magic_seen) != 0)
    return file_error(Code::ParseError, name,
                      fmt::format("byte 0: not a .npy file (wrong magic {}, expected '\\x93NUMPY')",
                                  quote_text(std::string_view(reinterpret_cast<const char*>(bytes.data()), magic_seen))));
  if (bytes.size() < 8)
    return file_error(Code::ParseError, name,
                      fmt::format("byte {}: truncated in the magic/version (file has {} "
                                  "bytes)",
                                  bytes.size(), bytes.size()));
  int major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0)
    return file_error(Code::Unsupported, name,
                      fmt::format("byte 6: .npy format version {}.{} is not supported (1.0, "
                                  "2.0, 3.0)",
                                  major, minor));
  Frame frame;
  const size_t length_bytes = major == 1 ? 2 : 4;
  frame.header_start = 8 + length_bytes;
  if (bytes.size() < frame.header_start)
    return file_error(Code::ParseError, name,
                      fmt::format("byte {}: truncated in the header length field", bytes.size()));
  frame.header_length = load_little_endian(bytes.data() + 8, int(length_bytes));
  return frame;
}

Result<Frame> check_frame(std::span<const uint8_t> bytes, std::string_view name) {
  EPLB_ASSIGN_OR_RETURN(Frame frame, check_prefix(bytes, name));
  if (frame.header_length > bytes.size() - frame.header_start)
    return file_error(Code::ParseError, name,
                      fmt::format("byte 8: truncated: the header claims {} bytes but only {} "
                                  "follow",
                                  frame.header_length, bytes.size() - frame.header_start));
  return frame;
}

// The element count of a 2-D or 3-D C-order array of `dtype`.
Result<uint64_t> check_shape(const Header& header, const Dtype& dtype, size_t at, std::string_view name) {
  const std::string shape = shape_text(header.shape);
  if (header.fortran_order)
    return file_error(Code::Unsupported, name,
                      fmt::format("byte {}: Fortran-order arrays are not supported (save "
                                  "np.ascontiguousarray(a))",
                                  at));
  if (header.shape.size() != 2 && header.shape.size() != 3)
    return file_error(Code::Unsupported, name,
                      fmt::format("byte {}: shape {} is {}-D; expected 2-D [L][E] or 3-D "
                                  "[W][L][E]",
                                  at, shape, header.shape.size()));
  uint64_t count = 1;
  for (uint64_t dimension : header.shape) {
    if (dimension == 0)
      return file_error(Code::ParseError, name,
                        fmt::format("byte {}: shape {} has a zero-size dimension (empty load)", at, shape));
    if (dimension > uint64_t(INT_MAX))
      return file_error(Code::ParseError, name,
                        fmt::format("byte {}: shape {} has a dimension larger than {}", at, shape, INT_MAX));
    if (count > UINT64_MAX / dimension / uint64_t(dtype.size))
      return file_error(Code::ParseError, name,
                        fmt::format("byte {}: shape {} overflows: its byte size does not fit "
                                    "in 64 bits",
                                    at, shape));
    count *= dimension;
  }
  return count;
}

// One element as a double; *exact is false for an integer a double rounds.
double element(const uint8_t* data, const Dtype& dtype, bool* exact) {
  uint64_t raw = load_little_endian(data, dtype.size);
  *exact = true;
  switch (dtype.kind) {
    case Kind::SignedInt: {
      int shift = 64 - 8 * dtype.size;  // sign-extend
      int64_t value = int64_t(raw << shift) >> shift;
      *exact = io::exact_in_double(value);
      return double(value);
    }
    case Kind::UnsignedInt:
      *exact = io::exact_in_double(raw);
      return double(raw);
    case Kind::Float:
      return dtype.size == 4 ? double(std::bit_cast<float>(uint32_t(raw))) : std::bit_cast<double>(raw);
  }
  return 0.0;
}

// "byte 128, element [0][3][7]"
std::string element_position(const LoadTrace& trace, bool three_d, size_t i, size_t offset) {
  const size_t e = i % size_t(trace.num_experts);
  const size_t l = (i / size_t(trace.num_experts)) % size_t(trace.num_layers);
  const size_t w = i / (size_t(trace.num_experts) * size_t(trace.num_layers));
  return three_d ? fmt::format("byte {}, element [{}][{}][{}]", offset, w, l, e)
                 : fmt::format("byte {}, element [{}][{}]", offset, l, e);
}

Status decode_values(const uint8_t* data, size_t data_start, const Dtype& dtype, bool three_d, LoadTrace& trace,
                     std::string_view name) {
  for (size_t i = 0; i < trace.values.size(); ++i) {
    bool exact = true;
    const size_t offset = i * size_t(dtype.size);
    double value = element(data + offset, dtype, &exact);
    if (!exact)
      return file_error(Code::ParseError, name,
                        fmt::format("{}: integer {} is not exactly representable as a double",
                                    element_position(trace, three_d, i, data_start + offset),
                                    load_little_endian(data + offset, dtype.size)));
    if (value < 0 || !std::isfinite(value))
      EPLB_TRY(io::check_load_value(value, name, element_position(trace, three_d, i, data_start + offset)));
    trace.values[i] = value;
  }
  return Status::ok();
}

// What the header says: the element type, the shape and where the data starts.
struct Layout {
  Header header;
  Dtype dtype;
  uint64_t count = 0;
  size_t data_start = 0;
  uint64_t data_bytes() const { return count * uint64_t(dtype.size); }
};

// `bytes` holds at least the whole header.
Result<Layout> parse_layout(std::span<const uint8_t> bytes, std::string_view name) {
  EPLB_ASSIGN_OR_RETURN(Frame frame, check_frame(bytes, name));
  std::string_view header_text(reinterpret_cast<const char*>(bytes.data()) + frame.header_start,
                               size_t(frame.header_length));
  Layout layout;
  EPLB_TRY(HeaderParser(header_text, frame.header_start, name).parse(layout.header));
  EPLB_ASSIGN_OR_RETURN(layout.dtype, parse_descr(layout.header.descr, name, frame.header_start));
  EPLB_ASSIGN_OR_RETURN(layout.count, check_shape(layout.header, layout.dtype, frame.header_start, name));
  layout.data_start = frame.header_start + size_t(frame.header_length);
  return layout;
}

Status extra_bytes_error(const Layout& layout, uint64_t file_size, std::string_view name) {
  const uint64_t end = layout.data_start + layout.data_bytes();
  return file_error(Code::ParseError, name,
                    fmt::format("byte {}: {} unexpected bytes after the data of shape {}", end, file_size - end,
                                shape_text(layout.header.shape)));
}

// The largest .npy header read (NumPy writes a few hundred bytes; its own
// reader refuses more than 10000 by default).
constexpr uint64_t kMaxHeaderBytes = uint64_t(1) << 20;

}  // namespace

Result<LoadTrace> parse_npy(std::span<const uint8_t> bytes, std::string_view name) {
  EPLB_ASSIGN_OR_RETURN(Layout layout, parse_layout(bytes, name));
  const Header& header = layout.header;
  const size_t data_start = layout.data_start;
  const uint64_t needed = layout.data_bytes(), available = bytes.size() - data_start;
  if (available < needed)
    return file_error(
        Code::ParseError, name,
        fmt::format("byte {}: truncated: shape {} of {} needs {} data bytes after byte {}, the file "
                    "has {}",
                    bytes.size(), shape_text(header.shape), quote_text(header.descr), needed, data_start, available));
  if (available > needed) return extra_bytes_error(layout, bytes.size(), name);
  LoadTrace trace;
  const bool three_d = header.shape.size() == 3;
  trace.num_steps = three_d ? int(header.shape[0]) : 1;
  trace.num_layers = int(header.shape[three_d ? 1 : 0]);
  trace.num_experts = int(header.shape[three_d ? 2 : 1]);
  trace.values.resize(size_t(layout.count));
  EPLB_TRY(decode_values(bytes.data() + data_start, data_start, layout.dtype, three_d, trace, name));
  return trace;
}

// Reads the prefix, then the header (at most kMaxHeaderBytes), then exactly
// the data the header declares; a file of another size is refused before
// its data is read.
Result<LoadTrace> io::read_npy_input(const std::string& path) {
  EPLB_ASSIGN_OR_RETURN(io::RegularFile file, io::RegularFile::open(path));
  std::vector<uint8_t> bytes;
  EPLB_TRY(file.read_up_to(bytes, std::min<uint64_t>(file.size(), 12), path));
  EPLB_ASSIGN_OR_RETURN(Frame frame, check_prefix(bytes, path));
  if (frame.header_length > kMaxHeaderBytes)
    return file_error(Code::ParseError, path,
                      fmt::format("byte 8: the header claims {} bytes, more than the {} a .npy header may have",
                                  frame.header_length, kMaxHeaderBytes));
  const uint64_t header_end = frame.header_start + frame.header_length;
  EPLB_TRY(file.read_up_to(bytes, std::min(header_end, file.size()), path));
  if (header_end > file.size()) return parse_npy(bytes, path);  // names the truncation
  EPLB_ASSIGN_OR_RETURN(Layout layout, parse_layout(bytes, path));
  const uint64_t declared = layout.data_bytes() > UINT64_MAX - layout.data_start
                                ? UINT64_MAX
                                : layout.data_start + layout.data_bytes();
  if (file.size() > declared) return extra_bytes_error(layout, file.size(), path);
  EPLB_TRY(file.read_up_to(bytes, std::min(declared, file.size()), path));
  return parse_npy(bytes, path);
}

std::vector<uint8_t> encode_npy_float64(const std::vector<size_t>& shape, const std::vector<double>& values) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) header += ", ";
    fmt::format_to(std::back_inserter(header), "{}", shape[i]);
  }
  if (shape.size() == 1) header += ",";
  header += "), }";
  // Pad with spaces so that the data starts on a 64-byte boundary; end with '\n'.
  size_t prefix = 10;
  if (((prefix + header.size() + 1 + 63) / 64) * 64 - prefix > 65535) prefix = 12;  // format 2.0
  size_t total = ((prefix + header.size() + 1 + 63) / 64) * 64;
  size_t padding = total - prefix - 1 - header.size();
  header += std::string(padding, ' ');
  header += '\n';
  std::vector<uint8_t> out(total + values.size() * 8);
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  out[6] = prefix == 10 ? 1 : 2;
  out[7] = 0;
  uint64_t length = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) out[8 + i] = uint8_t(length >> (8 * i));
  std::memcpy(out.data() + prefix, header.data(), header.size());
  uint8_t* data = out.data() + total;
  for (size_t v = 0; v < values.size(); ++v) {
    uint64_t raw = std::bit_cast<uint64_t>(values[v]);
    for (int i = 0; i < 8; ++i) data[v * 8 + size_t(i)] = uint8_t(raw >> (8 * i));
  }
  return out;
}

}  // namespace eplb
