// faulty: a decorator over any backend that injects faults deterministically.
//
// Spec: comma-separated key=value items, any subset, each key at most once:
//   err=P        request fails with Backend "injected backend error"
//   stall=P      request stays InProgress until released
//   corrupt=P    one byte of the landed data is flipped, status Done
//   delay_ms=N   every request reports Done no earlier than N ms after post
//   disconnect_after=N  from the (N+1)-th post on, requests and notifications
//                fail with RemoteDisconnect "injected: peer vanished"
//   seed=S       seed of the fault sequence (default 0)
// P in [0, 1], err + stall + corrupt <= 1. Every post draws two numbers from
// a splitmix64 stream, so the faults depend only on the seed and the number
// of posts before. Faulted requests (err, stall, disconnect) move no bytes.
// corrupt: READ flips a byte of the local destination after the transfer;
// WRITE lands the data, then writes one flipped byte over the remote copy
// from a scratch buffer (the source stays intact); the notification, if
// any, goes with that second write.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "backend.h"
#include "common/text.h"

namespace eplb::xfer {
namespace {

struct FaultSpec {
  double err = 0, stall = 0, corrupt = 0;
  uint64_t delay_ms = 0;
  std::optional<uint64_t> disconnect_after;
  uint64_t seed = 0;
};

Status bad_value(const std::string& spec, std::string_view key, std::string_view value, const char* expected) {
  return error(Code::InvalidArgument,
               fmt::format("fault spec '{}': bad value '{}' for key '{}' (expected {})", spec, value, key, expected));
}

// One key=value item into `parsed`.
Status parse_fault_item(const std::string& spec, std::string_view key, std::string_view value, FaultSpec& parsed) {
  if (key == "err" || key == "stall" || key == "corrupt") {
    auto probability = text::parse_double(value, key);
    if (!probability || !(*probability >= 0.0 && *probability <= 1.0))
      return bad_value(spec, key, value, "a probability in [0, 1]");
    (key == "err" ? parsed.err : key == "stall" ? parsed.stall : parsed.corrupt) = *probability;
    return Status::ok();
  }
  if (key != "delay_ms" && key != "disconnect_after" && key != "seed")
    return error(Code::InvalidArgument, fmt::format("fault spec '{}': unknown key '{}' (known: err, stall, corrupt, "
                                                    "delay_ms, disconnect_after, seed)",
                                                    spec, key));
  auto number = text::parse_uint(value, key);
  if (!number) return bad_value(spec, key, value, "a non-negative integer");
  if (key == "delay_ms") {
    if (*number > 3600 * 1000) return bad_value(spec, key, value, "at most 3600000 ms");
    parsed.delay_ms = *number;
  } else if (key == "disconnect_after") {
    parsed.disconnect_after = *number;
  } else {
    parsed.seed = *number;
  }
  return Status::ok();
}

Result<FaultSpec> parse_fault_spec(const std::string& spec) {
  FaultSpec parsed;
  std::vector<std::string_view> seen;
  for (std::string_view item : text::split(spec, ',')) {
    size_t equals = item.find('=');
    if (item.empty() || equals == std::string_view::npos)
      return error(Code::InvalidArgument, fmt::format("fault spec '{}': item '{}' is not key=value", spec, item));
    std::string_view key = item.substr(0, equals), value = item.substr(equals + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      return error(Code::InvalidArgument, fmt::format("fault spec '{}': key '{}' repeated", spec, key));
    seen.push_back(key);
    EPLB_TRY(parse_fault_item(spec, key, value, parsed));
  }
  if (parsed.err + parsed.stall + parsed.corrupt > 1.0 + 1e-12)
    return error(Code::InvalidArgument, fmt::format("fault spec '{}': err + stall + corrupt exceeds 1", spec));
  return parsed;
}

enum class Fault : uint8_t { None, Error, Stall, Corrupt, Disconnect };

class FaultyRequest final : public BackendRequest {
 public:
  FaultyRequest(Fault fault, std::chrono::milliseconds delay) : fault_(fault), delay_(delay) {}

  // For None / Corrupt: the inner request and what corruption needs.
  void attach(std::unique_ptr<BackendRequest> inner, Backend* backend, BackendPeer* peer, Operation op,
              std::span<const TransferSegment> segments, uint64_t corrupt_position, std::string self_name,
              std::string notification) {
    inner_ = std::move(inner);
    backend_ = backend;
    peer_ = peer;
    op_ = op;
    segments_.assign(segments.begin(), segments.end());
    corrupt_position_ = corrupt_position;
    self_name_ = std::move(self_name);
    notification_ = std::move(notification);
  }

  RequestState poll(Status* failure) override {
    switch (fault_) {
      case Fault::Error: return fail(failure, error(Code::Backend, "injected backend error"));
      case Fault::Disconnect: return fail(failure, error(Code::RemoteDisconnect, "injected: peer vanished"));
      case Fault::Stall: return RequestState::InProgress;
      case Fault::None:
      case Fault::Corrupt: break;
    }
    if (!landed_) {
      Status inner_failure;
      RequestState state = inner_->poll(&inner_failure);
      if (state == RequestState::Failed) return fail(failure, inner_failure);
      if (state == RequestState::InProgress) return state;
      landed_ = true;
      if (fault_ == Fault::Corrupt) {
        Status started = start_corruption();
        if (!started) return fail(failure, started);
      }
    }
    if (corruptor_) {
      Status inner_failure;
      RequestState state = corruptor_->poll(&inner_failure);
      if (state == RequestState::Failed) return fail(failure, inner_failure);
      if (state == RequestState::InProgress) return state;
      corruptor_.reset();
    }
    if (std::chrono::steady_clock::now() - posted_ < delay_) return RequestState::InProgress;
    return RequestState::Done;
  }

 private:
  RequestState fail(Status* failure, Status status) {
    if (failure) *failure = std::move(status);
    return RequestState::Failed;
  }

  Status start_corruption() {
    uint64_t position = corrupt_position_;
    for (const TransferSegment& segment : segments_) {
      if (position >= segment.length) {
        position -= segment.length;
        continue;
      }
      if (op_ == Operation::Read) {
        segment.local_address[position] ^= 0xFF;
        if (segment.landed_checksum != nullptr) segment.landed_checksum->reset();  // no longer what landed
        return Status::ok();
      }
      scratch_[0] = static_cast<uint8_t>(segment.local_address[position] ^ 0xFF);
      EPLB_ASSIGN_OR_RETURN(scratch_memory_, backend_->register_memory(MemoryRegion{scratch_, sizeof scratch_}));
      TransferSegment flip{scratch_, scratch_memory_.get(), segment.remote_address + position, segment.remote_key, 1};
      EPLB_ASSIGN_OR_RETURN(corruptor_, backend_->post(Operation::Write, *peer_, {&flip, 1}, self_name_, notification_));
      return Status::ok();
    }
    return Status::ok();
  }

  // Destroyed in reverse order: requests first, then the scratch registration.
  uint8_t scratch_[8] = {};
  std::unique_ptr<BackendMemory> scratch_memory_;
  Fault fault_;
  std::chrono::milliseconds delay_;
  std::chrono::steady_clock::time_point posted_ = std::chrono::steady_clock::now();
  Backend* backend_ = nullptr;
  BackendPeer* peer_ = nullptr;
  Operation op_ = Operation::Read;
  std::vector<TransferSegment> segments_;
  uint64_t corrupt_position_ = 0;
  std::string self_name_;
  std::string notification_;
  bool landed_ = false;
  std::unique_ptr<BackendRequest> inner_;
  std::unique_ptr<BackendRequest> corruptor_;
};

class FaultyBackend final : public Backend {
 public:
  FaultyBackend(std::unique_ptr<Backend> inner, FaultSpec spec)
      : inner_(std::move(inner)), spec_(spec), random_state_(spec.seed) {}

  std::string name() const override { return inner_->name(); }
  std::string transports() const override { return inner_->transports() + " (with fault injection)"; }
  std::vector<uint8_t> connection_info() const override { return inner_->connection_info(); }
  Result<std::unique_ptr<BackendMemory>> register_memory(const MemoryRegion& region) override {
    return inner_->register_memory(region);
  }
  // Faults are injected into transfers, not into allocation.
  Result<std::unique_ptr<BackendMemory>> allocate_memory(size_t length, void** address) override {
    return inner_->allocate_memory(length, address);
  }
  Result<std::unique_ptr<BackendPeer>> connect(const std::string& peer_name,
                                               std::span<const uint8_t> connection_info) override {
    return inner_->connect(peer_name, connection_info);
  }
  Result<std::unique_ptr<BackendRemoteKey>> unpack_remote_key(BackendPeer& peer, std::span<const uint8_t> packed_key,
                                                              const KeyRegion& region) override {
    return inner_->unpack_remote_key(peer, packed_key, region);
  }

  Result<std::unique_ptr<BackendRequest>> post(Operation op, BackendPeer& peer, std::span<const TransferSegment> segments,
                                               const std::string& self_name,
                                               const std::string& notification) override {
    ++posts_;
    double draw = static_cast<double>(next_random() >> 11) * 0x1.0p-53;
    uint64_t position_draw = next_random();
    Fault fault = Fault::None;
    if (disconnected(posts_ - 1))
      fault = Fault::Disconnect;
    else if (draw < spec_.err)
      fault = Fault::Error;
    else if (draw < spec_.err + spec_.stall)
      fault = Fault::Stall;
    else if (draw < spec_.err + spec_.stall + spec_.corrupt)
      fault = Fault::Corrupt;
    auto request = std::make_unique<FaultyRequest>(fault, std::chrono::milliseconds(spec_.delay_ms));
    if (fault == Fault::None || fault == Fault::Corrupt) {
      uint64_t total = 0;
      for (const TransferSegment& segment : segments) total += segment.length;
      bool corrupt_write = fault == Fault::Corrupt && op == Operation::Write;
      EPLB_ASSIGN_OR_RETURN(auto inner,
                            inner_->post(op, peer, segments, self_name, corrupt_write ? std::string() : notification));
      request->attach(std::move(inner), inner_.get(), &peer, op, segments, total ? position_draw % total : 0,
                      self_name, notification);
    }
    return std::unique_ptr<BackendRequest>(std::move(request));
  }

  Status send_notification(BackendPeer& peer, const std::string& self_name, const std::string& message) override {
    if (disconnected(posts_)) return error(Code::RemoteDisconnect, "injected: peer vanished");
    return inner_->send_notification(peer, self_name, message);
  }
  std::vector<Notification> take_notifications() override { return inner_->take_notifications(); }
  bool progress() override { return inner_->progress(); }

 private:
  // True once `posts_before` posts have been made and the limit is reached.
  bool disconnected(uint64_t posts_before) const {
    return spec_.disconnect_after.has_value() && posts_before >= *spec_.disconnect_after;
  }
  uint64_t next_random() {  // splitmix64
    uint64_t z = (random_state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::unique_ptr<Backend> inner_;
  FaultSpec spec_;
  uint64_t random_state_;
  uint64_t posts_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_faulty_backend(std::unique_ptr<Backend> inner, const std::string& spec) {
  if (!inner) return error(Code::InvalidArgument, "faulty backend needs an inner backend");
  EPLB_ASSIGN_OR_RETURN(FaultSpec parsed, parse_fault_spec(spec));
  return std::unique_ptr<Backend>(new FaultyBackend(std::move(inner), parsed));
}

}  // namespace eplb::xfer
