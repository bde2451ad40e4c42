// ucx_request.cpp - one posted transfer on the UCX backend.
//
// post: for every segment, one memcpy when UCX maps the peer's memory here
// (shared memory, AgentConfig::copy_mapped_memory), otherwise ucp_get_nbx
// (READ) or ucp_put_nbx (WRITE); a WRITE
// then adds ucp_ep_flush_nbx, so that completion of the flush means every
// byte has landed at the peer (a get completes only once its bytes are in
// local memory, so a READ needs no flush). Every UCS request handle is
// tracked. poll() progresses the worker and checks the handles in order;
// once all are complete (the worker is progressed only while one is not),
// the optional notification is sent as an active message and the request is
// Done when UCX has taken it. A failure reports the peer's recorded endpoint
// error (RemoteDisconnect) or the operation's own status. Destroying a
// request that is still running cancels and drains its handles (bounded), so
// no UCX callback or write outlives it silently.
#include <cstring>

#include "common/bytes.h"
#include "eplb/common.h"
#include "ucx_internal.h"

namespace eplb::xfer::ucx {
namespace {

constexpr double kDrainSeconds = 0.5;

class UcxRequest final : public BackendRequest {
 public:
  UcxRequest(Operation op, std::shared_ptr<UcxPeerState> peer, std::vector<uint8_t> payload)
      : op_(op), peer_(std::move(peer)), payload_(std::move(payload)) {}

  ~UcxRequest() override { cancel_and_drain(); }

  void start(std::span<const TransferSegment> segments) {
    segments_.assign(segments.begin(), segments.end());
    pending_.reserve(segments.size() + 1);
    if (resolve_segments()) issue();
  }

  // Done and nothing outstanding: issue the same gets / puts again, reusing
  // the segment copy and the handle vector's capacity.
  bool repost() override {
    if (state_ != RequestState::Done || next_ < pending_.size() || peer_->failed) return false;
    pending_.clear();
    next_ = 0;
    notification_sent_ = false;
    state_ = RequestState::InProgress;
    issue();
    return true;
  }

  RequestState poll(Status* failure) override {
    if (state_ == RequestState::InProgress) advance();
    if (state_ == RequestState::Failed && failure != nullptr) *failure = failure_;
    return state_;
  }

 private:
  // Once per request (a repost reuses it): every key belongs to this peer,
  // and where UCX maps the peer's memory here, the local address of each
  // segment's remote bytes (ucp_rkey_ptr), so issue() does no lookup.
  bool resolve_segments() {
    mapped_.assign(segments_.size(), nullptr);
    for (size_t i = 0; i < segments_.size(); ++i) {
      const auto* rkey = static_cast<const UcxRemoteKey*>(segments_[i].remote_key);
      if (rkey == nullptr || rkey->peer() != peer_.get()) {
        fail(Code::Internal, "remote key does not belong to the endpoint of peer " + peer_->name);
        return false;
      }
      if (peer_->worker->copy_mapped_memory && segments_[i].length != 0)
        mapped_[i] = rkey->mapped(segments_[i].remote_address);
    }
    return true;
  }

  void issue() {
    ucp_request_param_t param{};
    for (size_t i = 0; i < segments_.size(); ++i) {
      const TransferSegment& segment = segments_[i];
      if (segment.length == 0) continue;
      if (mapped_[i] != nullptr) {
        copy_directly(segment, mapped_[i]);
        continue;
      }
      const auto* rkey = static_cast<const UcxRemoteKey*>(segment.remote_key);
      if (segment.local_memory != nullptr) {
        param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
        param.memh = static_cast<const UcxMemory*>(segment.local_memory)->memh();
      } else {
        param.op_attr_mask = 0;
      }
      ucs_status_ptr_t handle =
          op_ == Operation::Read
              ? ucp_get_nbx(peer_->endpoint, segment.local_address, segment.length, segment.remote_address,
                            rkey->rkey(), &param)
              : ucp_put_nbx(peer_->endpoint, segment.local_address, segment.length, segment.remote_address,
                            rkey->rkey(), &param);
      if (!track(handle)) return;
    }
    // A get completes once its bytes are in local memory, so a READ is
    // landed when its gets are. A put completes once the local buffer may be
    // reused; only the endpoint flush says the bytes reached the peer.
    if (op_ == Operation::Write) {
      ucp_request_param_t flush_param{};
      if (!track(ucp_ep_flush_nbx(peer_->endpoint, &flush_param))) return;
    }
    // Everything copied or completed inline and nothing to notify: Done
    // now, what advance() would conclude at the first poll.
    if (pending_.empty() && payload_.empty()) state_ = RequestState::Done;
  }

  // A peer's memory mapped into this process (UCX shared memory) is read or
  // written with one memcpy here (AgentConfig::copy_mapped_memory): the
  // transfer is done once issue() returns, like UCX's own inline get, minus
  // the protocol's cost per operation. The Agent checked at prepare time
  // that the segment lies inside the peer's region.
  // A READ that asks for its landed checksum hashes each piece as it lands.
  void copy_directly(const TransferSegment& segment, uint8_t* remote) const {
    if (op_ == Operation::Read && segment.landed_checksum != nullptr)
      *segment.landed_checksum = bytes::copy_with_checksum(segment.local_address, remote, segment.length);
    else if (op_ == Operation::Read)
      std::memcpy(segment.local_address, remote, segment.length);
    else
      std::memcpy(remote, segment.local_address, segment.length);
  }

  // Records a UCS status pointer; false (and Failed) if it is an error.
  bool track(ucs_status_ptr_t handle) {
    if (handle == nullptr) return true;
    if (UCS_PTR_IS_ERR(handle)) {
      fail_with(UCS_PTR_STATUS(handle));
      return false;
    }
    pending_.push_back(handle);
    return true;
  }

  // Frees the completed handles in order; false on the first failure.
  bool collect_completed() {
    while (next_ < pending_.size()) {
      void* handle = pending_[next_];
      const ucs_status_t status = ucp_request_check_status(handle);
      if (status == UCS_INPROGRESS) return true;
      ucp_request_free(handle);
      pending_[next_++] = nullptr;
      if (status != UCS_OK) {
        fail_with(status);
        return false;
      }
    }
    return true;
  }

  void advance() {
    // Progress the worker only while something is still running: a READ
    // served inline (UCX shared memory copies it inside ucp_get_nbx) is
    // complete without another pass over every transport.
    if (!collect_completed()) return;
    if (next_ < pending_.size()) {
      peer_->worker->progress();
      if (!collect_completed()) return;
    }
    if (next_ < pending_.size()) {
      // The endpoint error callback may run before UCX fails the requests.
      if (peer_->failed) fail_with(peer_->failure);
      return;
    }
    if (!payload_.empty() && !notification_sent_) {
      notification_sent_ = true;
      if (peer_->failed) {
        fail_with(peer_->failure);
        return;
      }
      if (!track(send_notification_am(*peer_, payload_))) return;
      if (next_ < pending_.size()) return;
    }
    state_ = RequestState::Done;
  }

  void fail_with(ucs_status_t status) {
    if (peer_->failed) {
      // Whatever the operation saw (often CANCELED by the forced close), the
      // cause is the peer's loss.
      fail(Code::RemoteDisconnect, ucx_text(peer_->failure));
    } else {
      fail(code_for(status), ucx_text(status));
    }
  }

  void fail(Code code, std::string message) {
    state_ = RequestState::Failed;
    failure_ = Status(code, std::move(message));
  }

  void cancel_and_drain() {
    if (next_ >= pending_.size()) return;
    ucp_worker_h worker = peer_->worker->worker;
    for (size_t i = next_; i < pending_.size(); ++i) {
      if (pending_[i] != nullptr) ucp_request_cancel(worker, pending_[i]);
    }
    const Deadline deadline = Deadline::after_seconds(kDrainSeconds);
    while (next_ < pending_.size()) {
      void* handle = pending_[next_];
      if (handle == nullptr || ucp_request_check_status(handle) != UCS_INPROGRESS) {
        if (handle != nullptr) ucp_request_free(handle);
        pending_[next_++] = nullptr;
        continue;
      }
      if (deadline.expired() || peer_->failed) break;
      peer_->worker->progress();
    }
    // Still running after the drain (a peer that does not progress): hand
    // the handles back to UCX, which completes them without callbacks.
    for (size_t i = next_; i < pending_.size(); ++i) {
      if (pending_[i] != nullptr) ucp_request_free(pending_[i]);
    }
    pending_.clear();
    next_ = 0;
  }

  Operation op_;
  std::shared_ptr<UcxPeerState> peer_;
  std::vector<TransferSegment> segments_;  // what start() was given, for repost()
  std::vector<uint8_t*> mapped_;  // per segment: its remote bytes mapped here, or null (through UCX)
  std::vector<uint8_t> payload_;  // encoded notification; alive until sent
  std::vector<void*> pending_;    // UCS request handles, completed in order
  size_t next_ = 0;               // first handle not yet seen complete
  bool notification_sent_ = false;
  RequestState state_ = RequestState::InProgress;
  Status failure_;
};

}  // namespace

Result<std::unique_ptr<BackendRequest>> post_ucx_request(Operation op, const std::shared_ptr<UcxPeerState>& peer,
                                                         std::span<const TransferSegment> segments,
                                                         std::vector<uint8_t> notification_payload) {
  if (peer->failed) {
    return Status(Code::RemoteDisconnect, ucx_text(peer->failure));
  }
  auto request = std::make_unique<UcxRequest>(op, peer, std::move(notification_payload));
  request->start(segments);
  return std::unique_ptr<BackendRequest>(std::move(request));
}

}  // namespace eplb::xfer::ucx
