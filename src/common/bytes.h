// common/bytes.h - the one byte codec of eplb's wire formats (xfer metadata,
// bootstrap frames, migrate messages, the xfer-bench control socket).
//
// Contract: every integer is written and read little-endian whatever the
// host order. Writer appends fixed-width integers, raw bytes and
// length-prefixed blobs. Reader treats its input as untrusted: every read
// checks the bytes left; after the first failed read ok() is false, every
// later read returns zero or empty, and position() stays where the failure
// happened (for error messages). checksum() is the one checksum of wire
// formats (XXH3-64). Internal to the library (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace eplb::bytes {

// Little-endian load and store of an unsigned integer at a raw pointer.
template <typename T>
inline void store(uint8_t* out, T value) {
  static_assert(std::is_unsigned_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
}
template <typename T>
inline T load(const uint8_t* in) {
  static_assert(std::is_unsigned_v<T>);
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return static_cast<T>(value);
}

// XXH3-64 of `data` (seed 0).
uint64_t checksum(std::span<const uint8_t> data);
uint64_t checksum(std::string_view data);
// Copies `length` bytes from `source` to `target` (non-overlapping) and
// returns checksum() of the copied bytes, hashed in cache-sized pieces right
// after each is copied: one pass over memory instead of a copy then a hash.
uint64_t copy_with_checksum(uint8_t* target, const uint8_t* source, size_t length);
// The "eplb-dev64" digest of `data` (python/eplb/digest.py defines it; the
// torch ops there compute the same value on any device): the zero-padded
// little-endian uint32 words w_i, acc = sum w_i * (2i + 1) * 0x9E3779B97F4A7C15
// mod 2^64, then MurmurHash3's fmix64 of acc ^ (length * 0xC2B2AE3D27D4EB4F).
uint64_t dev64_digest(std::span<const uint8_t> data);

class Writer {
 public:
  void u8(uint8_t value) { out_.push_back(static_cast<char>(value)); }
  void u16(uint16_t value) { put(value); }
  void u32(uint32_t value) { put(value); }
  void u64(uint64_t value) { put(value); }
  void i32(int32_t value) { put(static_cast<uint32_t>(value)); }
  void f64(double value) {
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    put(bits);
  }
  void raw(std::string_view data) { out_.append(data); }
  void raw(std::span<const uint8_t> data) { out_.append(reinterpret_cast<const char*>(data.data()), data.size()); }
  // A blob: its length as LengthType, then its bytes.
  template <typename LengthType = uint64_t>
  void blob(std::string_view data) {
    put(static_cast<LengthType>(data.size()));
    raw(data);
  }
  // Overwrites a u32 written earlier at `offset` (a total length, say).
  void patch_u32(size_t offset, uint32_t value) {
    store(reinterpret_cast<uint8_t*>(out_.data()) + offset, value);
  }
  size_t size() const { return out_.size(); }
  const std::string& view() const { return out_; }
  std::string take() { return std::move(out_); }
  std::vector<uint8_t> take_vector() const { return {out_.begin(), out_.end()}; }

 private:
  template <typename T>
  void put(T value) {
    uint8_t buffer[sizeof(T)];
    store(buffer, value);
    out_.append(reinterpret_cast<const char*>(buffer), sizeof(T));
  }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> data) : data_(data) {}
  explicit Reader(std::string_view data)
      : data_(reinterpret_cast<const uint8_t*>(data.data()), data.size()) {}

  uint8_t u8() { return get<uint8_t>(); }
  uint16_t u16() { return get<uint16_t>(); }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }
  int32_t i32() { return static_cast<int32_t>(get<uint32_t>()); }
  double f64() {
    uint64_t bits = get<uint64_t>();
    double value = 0;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }
  // The next `length` bytes (empty and !ok() if fewer are left).
  std::string_view raw(size_t length) {
    if (!ok_ || length > remaining()) return fail_view();
    std::string_view view(reinterpret_cast<const char*>(data_.data()) + position_, length);
    position_ += length;
    return view;
  }
  // A blob written by Writer::blob<LengthType>, at most `max_length` bytes.
  template <typename LengthType = uint64_t>
  std::string_view blob(uint64_t max_length) {
    const size_t start = position_;
    const uint64_t length = get<LengthType>();
    if (!ok_ || length > max_length || length > remaining()) {
      if (ok_) position_ = start;
      return fail_view();
    }
    return raw(static_cast<size_t>(length));
  }
  // Consumes `expected` (a magic) if the input continues with it.
  bool expect(std::string_view expected) {
    if (!ok_ || remaining() < expected.size() ||
        std::memcmp(data_.data() + position_, expected.data(), expected.size()) != 0) {
      ok_ = false;
      return false;
    }
    position_ += expected.size();
    return true;
  }

  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && position_ == data_.size(); }
  size_t position() const { return position_; }
  size_t remaining() const { return data_.size() - position_; }
  size_t size() const { return data_.size(); }

 private:
  template <typename T>
  T get() {
    if (!ok_ || remaining() < sizeof(T)) {
      ok_ = false;
      return T{};
    }
    T value = load<T>(data_.data() + position_);
    position_ += sizeof(T);
    return value;
  }
  std::string_view fail_view() {
    ok_ = false;
    return {};
  }
  std::span<const uint8_t> data_;
  size_t position_ = 0;
  bool ok_ = true;
};

}  // namespace eplb::bytes
