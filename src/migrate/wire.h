// wire.h - little-endian byte writer / bounds-checked reader for the
// messages the migrate module exchanges between ranks (internal).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace eplb::migrate_wire {

class Writer {
 public:
  void u32(uint32_t value) { put(&value, sizeof value); }
  void u64(uint64_t value) { put(&value, sizeof value); }
  void bytes(std::string_view data) {
    u64(data.size());
    out_.append(data.data(), data.size());
  }
  void raw(std::string_view data) { out_.append(data.data(), data.size()); }
  std::string take() { return std::move(out_); }

 private:
  void put(const void* data, size_t size) { out_.append(static_cast<const char*>(data), size); }
  std::string out_;
};

// Every read checks the remaining length; after a failed read ok() is false
// and every further read returns zero / empty.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }
  std::string_view bytes(uint64_t max_length) {
    uint64_t length = u64();
    if (!ok_ || length > max_length || length > data_.size() - position_) {
      ok_ = false;
      return {};
    }
    std::string_view view = data_.substr(position_, length);
    position_ += length;
    return view;
  }
  bool raw(std::string_view expected) {
    if (!ok_ || data_.size() - position_ < expected.size() || data_.substr(position_, expected.size()) != expected) {
      ok_ = false;
      return false;
    }
    position_ += expected.size();
    return true;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && position_ == data_.size(); }
  size_t position() const { return position_; }

 private:
  template <typename T>
  T get() {
    T value{};
    if (!ok_ || data_.size() - position_ < sizeof(T)) {
      ok_ = false;
      return value;
    }
    std::memcpy(&value, data_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  std::string_view data_;
  size_t position_ = 0;
  bool ok_ = true;
};

}  // namespace eplb::migrate_wire
