// Agent: requests (make, post, status, release, wait) and notifications.
#include <fmt/format.h>
#include <thread>

#include "agent_impl.h"

namespace eplb::xfer {
namespace {

constexpr size_t kMaxListedInTimeout = 16;

std::string plural(size_t count, const char* noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

// Paces a polling loop: yields at first, then sleeps briefly so a long wait
// does not burn a core; never sleeps past the deadline.
class Pacer {
 public:
  explicit Pacer(const Deadline& deadline) : deadline_(deadline) {}
  void pause() {
    if (++rounds_ < 2000) {
      std::this_thread::yield();
      return;
    }
    auto nap = std::min<std::chrono::nanoseconds>(std::chrono::microseconds(50), deadline_.remaining());
    if (nap.count() > 0) std::this_thread::sleep_for(nap);
  }

 private:
  const Deadline& deadline_;
  uint64_t rounds_ = 0;
};

// Resolves an index span ("empty" = all) against a list of `count` entries.
Status resolve_indices(const std::string& agent, const char* side, std::span<const int> indices, size_t count,
                       std::vector<size_t>* out) {
  out->clear();
  if (indices.empty()) {
    for (size_t i = 0; i < count; ++i) out->push_back(i);
    return Status::ok();
  }
  out->reserve(indices.size());
  for (size_t position = 0; position < indices.size(); ++position) {
    int index = indices[position];
    if (index < 0 || static_cast<size_t>(index) >= count)
      return error(Code::InvalidArgument,
                   fmt::format("agent {}: {} index {} at position {} is out of range (the list has {})", agent, side,
                               index, position, plural(count, "descriptor")));
    out->push_back(static_cast<size_t>(index));
  }
  return Status::ok();
}

}  // namespace

std::string Agent::Impl::describe(const RequestStateRecord& request) const {
  return std::string(operation_name(request.op)) + " of " + plural(request.segments.size(), "descriptor") + " (" +
         format_bytes(request.total_bytes) + ") " + (request.op == Operation::Read ? "from" : "to") + " agent " +
         request.remote->peer->name;
}

Result<RequestId> Agent::Impl::make_request(Operation op, DescriptorListId local_id, std::span<const int> local_indices,
                                          DescriptorListId remote_id, std::span<const int> remote_indices,
                                          const std::string& notification, bool checksum_landed) {
  if (op != Operation::Read && op != Operation::Write)
    return error(Code::InvalidArgument, fmt::format("agent {}: unknown operation {}", name_, static_cast<int>(op)));
  auto local = lists_.find(local_id);
  if (local == lists_.end())
    return error(Code::NotFound, fmt::format("agent {}: no descriptor list {}", name_, local_id));
  auto remote = lists_.find(remote_id);
  if (remote == lists_.end())
    return error(Code::NotFound, fmt::format("agent {}: no descriptor list {}", name_, remote_id));
  if (local->second->remote)
    return error(Code::InvalidArgument,
                 fmt::format("agent {}: descriptor list {} is a remote list, the local side needs a local one", name_,
                             local_id));
  if (!remote->second->remote)
    return error(Code::InvalidArgument,
                 fmt::format("agent {}: descriptor list {} is a local list, the remote side needs a remote one", name_,
                             remote_id));
  if (is_stale(*remote->second)) return stale_list_error(*remote->second, fmt::format("descriptor list {}", remote_id));

  const auto& local_entries = local->second->entries;
  const auto& remote_entries = remote->second->entries;
  std::vector<size_t> local_picked, remote_picked;
  EPLB_TRY(resolve_indices(name_, "local", local_indices, local_entries.size(), &local_picked));
  EPLB_TRY(resolve_indices(name_, "remote", remote_indices, remote_entries.size(), &remote_picked));
  if (local_picked.size() != remote_picked.size())
    return error(Code::InvalidArgument, "agent " + name_ + ": " + plural(local_picked.size(), "local descriptor") +
                                            " cannot pair with " + plural(remote_picked.size(), "remote descriptor"));

  auto request = std::make_unique<RequestStateRecord>();
  request->op = op;
  request->local = local->second;
  request->remote = remote->second;
  request->notification = notification;
  request->segments.reserve(local_picked.size());
  if (checksum_landed && op == Operation::Read) request->landed.resize(local_picked.size());
  for (size_t i = 0; i < local_picked.size(); ++i) {
    const ListEntry& l = local_entries[local_picked[i]];
    const ListEntry& r = remote_entries[remote_picked[i]];
    if (l.length != r.length)
      return error(Code::InvalidArgument,
                   fmt::format("agent {}: pair {}: local descriptor {} has {} bytes but remote descriptor {} has {}",
                               name_, i, local_picked[i], l.length, remote_picked[i], r.length));
    request->segments.push_back(
        TransferSegment{reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(l.address)), l.local_memory, r.address,
                        r.remote_key, l.length, request->landed.empty() ? nullptr : &request->landed[i]});
    request->total_bytes += l.length;
  }
  RequestId id = next_handle();
  requests_[id] = std::move(request);
  return id;
}

Result<std::vector<std::optional<uint64_t>>> Agent::Impl::landed_checksums(RequestId id) {
  RequestStateRecord* found = find_request(id);
  if (found == nullptr) return error(Code::NotFound, fmt::format("agent {}: no request {}", name_, id));
  poll(*found);
  if (found->phase != RequestPhase::Done)
    return error(Code::NotAllowed, fmt::format("agent {}: request {} ({}) is not done; its landed checksums are not "
                                               "known yet",
                                               name_, id, describe(*found)));
  if (found->landed.empty()) return std::vector<std::optional<uint64_t>>(found->segments.size());
  return found->landed;
}

Status Agent::Impl::fail_request(RequestStateRecord& request, const Status& backend_failure) {
  request.backend.reset();
  request.phase = RequestPhase::Failed;
  Code code = backend_failure.is_ok() ? Code::Internal : backend_failure.code();
  std::string text = backend_failure.is_ok() ? "backend reported a failure without a reason" : backend_failure.message();
  request.failure = error(code, describe(request) + " failed after " + format_seconds(request.since_post.seconds()) +
                                    ": " + std::string(code_name(code)) + " (" + text + ")");
  return request.failure;
}

Status Agent::Impl::post(RequestId id) {
  RequestStateRecord* found = find_request(id);
  if (found == nullptr) return error(Code::NotFound, fmt::format("agent {}: no request {}", name_, id));
  RequestStateRecord& request = *found;
  if (request.phase == RequestPhase::InProgress)
    return error(
        Code::NotAllowed,
        fmt::format("agent {}: request {} ({}) is still in progress; wait for it or release it before posting again",
                    name_, id, describe(request)));
  if (is_stale(*request.remote)) return stale_list_error(*request.remote, fmt::format("request {}", id));
  if (!request.failure.is_ok()) request.failure = Status::ok();
  for (auto& landed : request.landed) landed.reset();  // each post's own bytes
  // A finished request keeps its backend request, which may start the same
  // transfer again without allocating (the UCX backend can).
  if (request.backend && request.phase == RequestPhase::Done && request.backend->repost()) {
    request.phase = RequestPhase::InProgress;
    start_clock_unless_done(request);
    return Status::ok();
  }
  request.since_post.reset();
  request.backend.reset();
  auto posted = backend_->post(request.op, *request.remote->peer->connection, request.segments, name_,
                               request.notification);
  if (!posted) return fail_request(request, posted.status());
  request.backend = std::move(posted).value();
  request.phase = RequestPhase::InProgress;
  start_clock_unless_done(request);
  return Status::ok();
}

// A transfer served inside post (shared memory) is Done at once and needs
// no clock: reading it costs about as much as a 4 KiB copy on this class of
// VM. Anything still running (or failed) is timed from now.
void Agent::Impl::start_clock_unless_done(RequestStateRecord& request) {
  Status failure;
  const RequestState state = request.backend->poll(&failure);
  if (state == RequestState::Done) {
    request.phase = RequestPhase::Done;
    return;
  }
  request.since_post.reset();
  if (state == RequestState::Failed) (void)fail_request(request, failure);
}

void Agent::Impl::poll(RequestStateRecord& request) {
  if (request.phase != RequestPhase::InProgress || !request.backend) return;
  Status failure;
  switch (request.backend->poll(&failure)) {
    case RequestState::InProgress: return;
    case RequestState::Done:  // the backend request is kept for a repost
      request.phase = RequestPhase::Done;
      return;
    case RequestState::Failed: (void)fail_request(request, failure); return;
  }
}

RequestStatus Agent::Impl::status(RequestId id) {
  RequestStateRecord* found = find_request(id);
  if (found == nullptr)
    return {RequestState::Failed, error(Code::NotFound, fmt::format("agent {}: no request {}", name_, id))};
  RequestStateRecord& request = *found;
  if (request.phase == RequestPhase::InProgress) {
    poll(request);  // often done already (a transfer served inline)
    if (request.phase == RequestPhase::InProgress) {
      backend_->progress();
      poll(request);
    }
  }
  switch (request.phase) {
    case RequestPhase::Idle:
      return {RequestState::Failed, error(Code::NotAllowed, fmt::format("agent {}: request {} ({}) was never posted",
                                                                        name_, id, describe(request)))};
    case RequestPhase::InProgress: return {RequestState::InProgress, Status::ok()};
    case RequestPhase::Done: return {RequestState::Done, Status::ok()};
    case RequestPhase::Failed: return {RequestState::Failed, request.failure};
  }
  return {RequestState::Failed, error(Code::Internal, "request in an unknown phase")};
}

Status Agent::Impl::release(RequestId id) {
  auto found = requests_.find(id);
  if (found == requests_.end())
    return error(Code::NotFound, fmt::format("agent {}: no request {} (released already?)", name_, id));
  if (id == last_request_id_) last_request_ = nullptr;
  requests_.erase(found);  // destroying the backend request cancels it
  return Status::ok();
}

Status Agent::Impl::wait(std::span<const RequestId> ids, Deadline deadline) {
  std::vector<RequestStateRecord*> waiting;
  waiting.reserve(ids.size());
  for (RequestId id : ids) {
    auto found = requests_.find(id);
    if (found == requests_.end()) return error(Code::NotFound, fmt::format("agent {}: no request {}", name_, id));
    if (found->second->phase == RequestPhase::Idle)
      return error(Code::NotAllowed,
                   fmt::format("agent {}: request {} ({}) was never posted", name_, id, describe(*found->second)));
    waiting.push_back(found->second.get());
  }
  Stopwatch waited;
  Pacer pacer(deadline);
  for (;;) {
    backend_->progress();
    bool all_done = true;
    for (RequestStateRecord* request : waiting) {
      poll(*request);
      if (request->phase == RequestPhase::Failed) return request->failure;
      if (request->phase != RequestPhase::Done) all_done = false;
    }
    if (all_done) return Status::ok();
    if (deadline.expired()) break;
    pacer.pause();
  }
  std::string listed;
  size_t pending = 0;
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (waiting[i]->phase != RequestPhase::InProgress) continue;
    if (++pending > kMaxListedInTimeout) continue;
    if (!listed.empty()) listed += ", ";
    listed += fmt::format("request {} ({}, posted {} ago)", ids[i], describe(*waiting[i]),
                          format_seconds(waiting[i]->since_post.seconds()));
  }
  if (pending > kMaxListedInTimeout) listed += fmt::format(" and {} more", pending - kMaxListedInTimeout);
  return error(Code::Timeout,
               fmt::format("agent {}: wait timed out after {} with {} of {} still in progress: {}", name_,
                           format_seconds(waited.seconds()), pending, plural(waiting.size(), "request"), listed));
}

Status Agent::Impl::send_notification(const std::string& peer, const std::string& message) {
  auto found = peers_.find(peer);
  if (found == peers_.end())
    return error(Code::NotFound, "agent " + name_ + ": unknown peer " + peer + " (load its metadata first)");
  Status sent = backend_->send_notification(*found->second->connection, name_, message);
  if (sent) return sent;
  return error(sent.code(), "agent " + name_ + ": notification to agent " + peer + " failed: " +
                                std::string(code_name(sent.code())) + " (" + sent.message() + ")");
}

std::vector<Notification> Agent::Impl::take_notifications() {
  backend_->progress();
  return backend_->take_notifications();
}

Result<std::vector<Notification>> Agent::Impl::wait_notifications(Deadline deadline) {
  Stopwatch waited;
  Pacer pacer(deadline);
  for (;;) {
    std::vector<Notification> arrived = take_notifications();
    if (!arrived.empty()) return arrived;
    if (deadline.expired()) break;
    pacer.pause();
  }
  return error(Code::Timeout,
               "agent " + name_ + ": no notification arrived within " + format_seconds(waited.seconds()));
}

}  // namespace eplb::xfer
