// ucx_backend.cpp - the UCX (UCP) backend: context, worker, endpoints,
// memory registration, remote keys and notifications over active messages.
// The transfer requests themselves live in ucx_request.cpp.
//
// Transports: AgentConfig::transports and net_devices are set in UCX's
// configuration (ucp_config_modify of TLS and NET_DEVICES) unless UCX_TLS or
// UCX_NET_DEVICES is set in the environment, which wins.
// Unless UCX_KEEPALIVE_INTERVAL is set, the keepalive interval is lowered to
// 1 s so that a dead peer on a quiet transport is noticed within seconds.
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <ucs/config/global_opts.h>
#include <ucs/config/parser.h>

#include "common/bytes.h"
#include "common/pages.h"
#include "common/text.h"
#include "eplb/common.h"
#include "ucx_internal.h"

namespace eplb::xfer {
namespace ucx {

std::string ucx_text(ucs_status_t status) { return std::string("UCX: ") + ucs_status_string(status); }

Code code_for(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return Code::RemoteDisconnect;
    case UCS_ERR_CANCELED:
      return Code::Canceled;
    default:
      return Code::Backend;
  }
}

Status status_for(ucs_status_t status, const std::string& context) {
  return Status(code_for(status), context + ": " + ucx_text(status));
}

ucs_status_t UcxWorkerState::wait_request(void* request, double seconds) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  const Deadline deadline = Deadline::after_seconds(seconds);
  while (true) {
    progress();
    const ucs_status_t status = ucp_request_check_status(request);
    if (status != UCS_INPROGRESS) {
      ucp_request_free(request);
      return status;
    }
    if (deadline.expired()) {
      // UCX completes and frees it internally later; no callback is attached.
      ucp_request_free(request);
      return UCS_INPROGRESS;
    }
  }
}

void UcxWorkerState::reap_parked_sends() {
  size_t kept = 0;
  for (auto& send : parked_sends) {
    if (ucp_request_check_status(send.request) == UCS_INPROGRESS) {
      parked_sends[kept++] = std::move(send);
    } else {
      ucp_request_free(send.request);
    }
  }
  parked_sends.resize(kept);
}

UcxWorkerState::~UcxWorkerState() {
  if (worker != nullptr) {
    for (auto& send : parked_sends) {
      ucp_request_cancel(worker, send.request);
      ucp_request_free(send.request);
    }
    parked_sends.clear();
    ucp_worker_destroy(worker);
  }
  if (context != nullptr) ucp_cleanup(context);
}

UcxPeerState::~UcxPeerState() {
  if (error_slot != nullptr) error_slot->peer = nullptr;
  if (endpoint == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // A dead peer cannot acknowledge a flush: release the endpoint at once.
  param.flags = failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(endpoint, &param);
  const ucs_status_t status = worker->wait_request(request, kTeardownSeconds);
  (void)status;  // Teardown cannot fail; the worker's destruction reclaims the rest.
  endpoint = nullptr;
}

UcxMemory::~UcxMemory() {
  if (memh_ != nullptr) ucp_mem_unmap(worker_->context, memh_);
}

UcxRemoteKey::~UcxRemoteKey() {
  if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
}

uint8_t* UcxRemoteKey::mapped(uint64_t address) const {
  void* local = nullptr;
  if (unmappable_ || rkey_ == nullptr) return nullptr;
  if (ucp_rkey_ptr(rkey_, address, &local) != UCS_OK || local == nullptr) {
    unmappable_ = true;
    return nullptr;
  }
  return static_cast<uint8_t*>(local);
}

void UcxRemoteKey::map_eagerly(uint64_t address, uint64_t length) {
  void* local = nullptr;
  if (rkey_ == nullptr || length == 0 || ucp_rkey_ptr(rkey_, address, &local) != UCS_OK || local == nullptr) return;
  pages::prepare_for_reading(local, length);
}

std::vector<uint8_t> encode_notification(const std::string& sender, const std::string& message) {
  bytes::Writer payload;
  payload.blob<uint32_t>(sender);
  payload.raw(message);
  return payload.take_vector();
}

ucs_status_ptr_t send_notification_am(UcxPeerState& peer, const std::vector<uint8_t>& payload) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  return ucp_am_send_nbx(peer.endpoint, kNotificationAmId, nullptr, 0, payload.data(), payload.size(), &param);
}

namespace {

// The transports of an endpoint's lanes ("cma", "posix", ...), sorted, from
// UCX's own description of the endpoint (ucp_ep_print_info); lines read:
//   lane[3]:  3:cma/memory.0 md[3]  -> md[3]/cma/sysdev[255] rma_bw#0
std::vector<std::string> endpoint_transports(ucp_ep_h endpoint) {
  std::set<std::string> found;
  char* text = nullptr;
  size_t length = 0;
  FILE* stream = open_memstream(&text, &length);
  if (stream == nullptr || endpoint == nullptr) return {};
  ucp_ep_print_info(endpoint, stream);
  std::fclose(stream);
  for (std::string_view line : text::split(std::string_view(text, length), '\n')) {
    size_t lane = line.find("lane[");
    size_t colon = lane == std::string_view::npos ? lane : line.find(':', line.find("]:", lane) + 2);
    if (colon == std::string_view::npos) continue;
    size_t slash = line.find('/', colon);
    if (slash != std::string_view::npos) found.emplace(line.substr(colon + 1, slash - colon - 1));
  }
  std::free(text);
  return {found.begin(), found.end()};
}

// Untrusted bytes from a peer: length-checked before anything is read.
ucs_status_t on_notification(void* arg, const void* header, size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param) {
  auto* state = static_cast<UcxWorkerState*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || length < 4 || length > kMaxNotificationBytes ||
      data == nullptr) {
    ++state->dropped_notifications;
    // For a rendezvous descriptor an error status drops it; otherwise UCS_OK.
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? UCS_ERR_UNSUPPORTED : UCS_OK;
  }
  bytes::Reader reader(std::span<const uint8_t>(static_cast<const uint8_t*>(data), length));
  std::string_view sender = reader.blob<uint32_t>(length);
  if (!reader.ok()) {
    ++state->dropped_notifications;
    return UCS_OK;
  }
  Notification notification;
  notification.peer.assign(sender);
  notification.message.assign(reader.raw(reader.remaining()));
  state->notifications.push_back(std::move(notification));
  return UCS_OK;
}

void on_endpoint_error(void* arg, ucp_ep_h endpoint, ucs_status_t status) {
  auto* slot = static_cast<EndpointErrorSlot*>(arg);
  if (slot->peer == nullptr) return;
  if (!slot->peer->failed) {
    slot->peer->failed = true;
    slot->peer->failure = status;
  }
}

// Upper bound of what UCX's rkey parser can read past the packed bytes we
// hand it (md map, memory type, one size byte and up to 255 bytes per md).
constexpr size_t kRemoteKeyPadding = 8 + 1 + 64 * 256 + 64;
constexpr size_t kMaxConnectionInfoBytes = 1 << 16;
// Zeros after a peer's worker address (see connect): more than any
// transport's device or interface address (each at most 255 B long).
constexpr size_t kAddressPadding = 512;

}  // namespace

Status check_packed_key(std::span<const uint8_t> key, const std::string& peer, const WorkerAddressShape* remote,
                        const KeyRegion& region) {
  auto bad = [&](size_t at, const std::string& what) {
    return error(Code::Mismatch, fmt::format("ucx backend: packed remote key of peer {} ({} bytes): {} at offset {}",
                                             peer, key.size(), what, at));
  };
  if (key.size() < sizeof(uint64_t) + 1) return bad(0, "too short for its md map and memory type");
  uint64_t md_map = 0;
  std::memcpy(&md_map, key.data(), sizeof md_map);
  if (md_map == 0) return bad(0, "empty md map");
  if (key[8] >= UCS_MEMORY_TYPE_LAST) return bad(8, fmt::format("unknown memory type {}", key[8]));
  size_t at = 9;
  for (int md = 0; md < 64; ++md) {
    if ((md_map & (uint64_t(1) << md)) == 0) continue;
    if (at >= key.size()) return bad(at, fmt::format("no size for md {}", md));
    const size_t length = key[at];
    if (at + 1 + length > key.size()) return bad(at, fmt::format("md {}'s {} bytes run past the key", md, length));
    if (remote != nullptr) EPLB_TRY(check_key_part(md, key.subspan(at + 1, length), *remote, region, peer));
    at += 1 + length;
  }
  return Status::ok();
}

namespace {

class UcxBackend final : public Backend {
 public:
  UcxBackend(std::shared_ptr<UcxWorkerState> state, std::vector<uint8_t> address, WorkerAddressShape shape,
             std::string transports)
      : state_(std::move(state)),
        address_(std::move(address)),
        shape_(std::move(shape)),
        transports_(std::move(transports)) {}

  std::string name() const override { return "ucx"; }
  std::string transports() const override { return transports_; }
  std::vector<std::string> peer_transports(BackendPeer& peer) const override {
    auto* ucx_peer = dynamic_cast<UcxPeer*>(&peer);
    return ucx_peer ? endpoint_transports(ucx_peer->state()->endpoint) : std::vector<std::string>{};
  }
  std::vector<uint8_t> connection_info() const override { return address_; }

  Result<std::unique_ptr<BackendMemory>> register_memory(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::Host) {
      return error(Code::Unsupported, "ucx backend: only host memory can be registered (device memory is planned)");
    }
    if (region.address == nullptr || region.length == 0) {
      return error(Code::InvalidArgument, "ucx backend: cannot register an empty region");
    }
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = region.address;
    params.length = region.length;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(state_->context, &params, &memh);
    if (status != UCS_OK) {
      return status_for(status, "ucp_mem_map of " + format_bytes(region.length));
    }
    return pack(memh);
  }

  // Packs the remote key of a mapped region; unmaps it on failure.
  Result<std::unique_ptr<BackendMemory>> pack(ucp_mem_h memh) {
    void* packed = nullptr;
    size_t packed_size = 0;
    const ucs_status_t status = ucp_rkey_pack(state_->context, memh, &packed, &packed_size);
    if (status != UCS_OK) {
      ucp_mem_unmap(state_->context, memh);
      return status_for(status, "ucp_rkey_pack");
    }
    std::vector<uint8_t> key(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packed_size);
    ucp_rkey_buffer_release(packed);
    return std::unique_ptr<BackendMemory>(std::make_unique<UcxMemory>(state_, memh, std::move(key)));
  }

  Result<std::unique_ptr<BackendMemory>> allocate_memory(size_t length, void** address) override {
    if (length == 0) return error(Code::InvalidArgument, "ucx backend: cannot allocate an empty region");
    ucp_mem_map_params_t params{};
    params.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.address = nullptr;
    params.length = length;
    params.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(state_->context, &params, &memh);
    if (status != UCS_OK) return status_for(status, "ucp_mem_map allocating " + format_bytes(length));
    ucp_mem_attr_t attributes{};
    attributes.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = ucp_mem_query(memh, &attributes);
    if (status != UCS_OK || attributes.address == nullptr || attributes.length < length) {
      ucp_mem_unmap(state_->context, memh);
      return status_for(status != UCS_OK ? status : UCS_ERR_NO_MEMORY, "ucp_mem_query");
    }
    restrict_own_sysv_segments();
    auto memory = pack(memh);
    if (!memory) return memory.status();
    *address = attributes.address;
    return memory;
  }

  Result<std::unique_ptr<BackendPeer>> connect(const std::string& peer_name,
                                               std::span<const uint8_t> connection_info) override {
    if (connection_info.empty() || connection_info.size() > kMaxConnectionInfoBytes) {
      return error(
          Code::Mismatch,
          fmt::format("ucx backend: connection info of peer {} has {} bytes, expected a UCX worker address of 1..{}",
                      peer_name, connection_info.size(), kMaxConnectionInfoBytes));
    }
    auto checked = check_worker_address(connection_info, shape_, peer_name);
    if (!checked) return checked.status();
    // UCX parses the address itself; give it an aligned private copy, with
    // zeros after it: a transport reads its device and interface addresses
    // at the sizes it expects, which may run past a short one.
    std::vector<uint64_t> address((connection_info.size() + kAddressPadding + 7) / 8, 0);
    std::memcpy(address.data(), connection_info.data(), connection_info.size());

    auto peer = std::make_shared<UcxPeerState>();
    peer->worker = state_;
    peer->name = peer_name;
    peer->address = std::move(*checked);
    state_->error_slots.push_back(std::make_unique<EndpointErrorSlot>());
    peer->error_slot = state_->error_slots.back().get();
    peer->error_slot->peer = peer.get();

    // Peer failure handling first; UCX 1.13's mm shared-memory transports
    // (posix, sysv) cannot detect a dead peer, and UCX refuses such an
    // endpoint with UNREACHABLE: fall back to no error handling there (a dead
    // peer then shows as the caller's Timeout, or an error from cma).
    ucs_status_t status = create_endpoint(*peer, address.data(), UCP_ERR_HANDLING_MODE_PEER, /*quiet=*/true);
    if (status == UCS_ERR_UNREACHABLE) {
      status = create_endpoint(*peer, address.data(), UCP_ERR_HANDLING_MODE_NONE, /*quiet=*/false);
      peer->peer_failure_handling = false;
    }
    if (status != UCS_OK) {
      peer->endpoint = nullptr;
      return status_for(status, "ucp_ep_create to peer " + peer_name);
    }
    return std::unique_ptr<BackendPeer>(std::make_unique<UcxPeer>(std::move(peer)));
  }

  ucs_status_t create_endpoint(UcxPeerState& peer, const void* address, ucp_err_handling_mode_t mode, bool quiet) {
    ucp_ep_params_t params{};
    params.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = static_cast<const ucp_address_t*>(address);
    params.err_mode = mode;
    params.err_handler.cb = on_endpoint_error;
    params.err_handler.arg = peer.error_slot;
    // The first attempt may fail by design; keep UCX from logging it.
    const ucs_log_level_t saved = ucs_global_opts.log_component.log_level;
    if (quiet) ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_FATAL;
    const ucs_status_t status = ucp_ep_create(state_->worker, &params, &peer.endpoint);
    ucs_global_opts.log_component.log_level = saved;
    return status;
  }

  Result<std::unique_ptr<BackendRemoteKey>> unpack_remote_key(BackendPeer& peer, std::span<const uint8_t> packed_key,
                                                              const KeyRegion& region) override {
    auto* ucx_peer = dynamic_cast<UcxPeer*>(&peer);
    if (ucx_peer == nullptr) return error(Code::Internal, "ucx backend: peer handle of another backend");
    const auto& state = ucx_peer->state();
    if (packed_key.empty() || packed_key.size() > kMaxConnectionInfoBytes) {
      return error(Code::Mismatch, fmt::format("ucx backend: packed remote key of peer {} has {} bytes", state->name,
                                               packed_key.size()));
    }
    EPLB_TRY(check_packed_key(packed_key, state->name, &state->address, region));
    // The packed key carries no length of its own: a zero tail keeps a
    // truncated key from making UCX read past our copy.
    std::vector<uint8_t> padded(packed_key.size() + kRemoteKeyPadding, 0);
    std::memcpy(padded.data(), packed_key.data(), packed_key.size());
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t status = ucp_ep_rkey_unpack(state->endpoint, padded.data(), &rkey);
    if (status != UCS_OK) {
      Status failure = status_for(status, "ucp_ep_rkey_unpack for peer " + state->name);
      if (failure.code() == Code::Backend) failure = Status(Code::Mismatch, failure.message());
      return failure;
    }
    return std::unique_ptr<BackendRemoteKey>(std::make_unique<UcxRemoteKey>(state, rkey));
  }

  Result<std::unique_ptr<BackendRequest>> post(Operation op, BackendPeer& peer,
                                               std::span<const TransferSegment> segments,
                                               const std::string& self_name,
                                               const std::string& notification) override {
    auto* ucx_peer = dynamic_cast<UcxPeer*>(&peer);
    if (ucx_peer == nullptr) return error(Code::Internal, "ucx backend: peer handle of another backend");
    std::vector<uint8_t> payload;
    if (!notification.empty()) {
      if (4 + self_name.size() + notification.size() > kMaxNotificationBytes) {
        return error(Code::InvalidArgument, "ucx backend: notification of " + format_bytes(notification.size()) +
                                                " exceeds " + format_bytes(kMaxNotificationBytes));
      }
      payload = encode_notification(self_name, notification);
    }
    return post_ucx_request(op, ucx_peer->state(), segments, std::move(payload));
  }

  Status send_notification(BackendPeer& peer, const std::string& self_name, const std::string& message) override {
    auto* ucx_peer = dynamic_cast<UcxPeer*>(&peer);
    if (ucx_peer == nullptr) return error(Code::Internal, "ucx backend: peer handle of another backend");
    UcxPeerState& state = *ucx_peer->state();
    if (4 + self_name.size() + message.size() > kMaxNotificationBytes) {
      return error(Code::InvalidArgument, "ucx backend: notification of " + format_bytes(message.size()) +
                                              " exceeds " + format_bytes(kMaxNotificationBytes));
    }
    if (state.failed) {
      return Status(Code::RemoteDisconnect, "notification to peer " + state.name + ": " + ucx_text(state.failure));
    }
    ParkedSend send;
    send.payload = std::make_unique<std::vector<uint8_t>>(encode_notification(self_name, message));
    ucs_status_ptr_t request = send_notification_am(state, *send.payload);
    if (request == nullptr) return Status::ok();
    if (UCS_PTR_IS_ERR(request)) {
      return status_for(UCS_PTR_STATUS(request), "notification to peer " + state.name);
    }
    // Usually completes at once; if the transport is backed up, keep the
    // payload alive until UCX is done with it and report success now.
    const Deadline deadline = Deadline::after_seconds(0.05);
    while (!deadline.expired()) {
      state_->progress();
      const ucs_status_t status = ucp_request_check_status(request);
      if (status == UCS_INPROGRESS) continue;
      ucp_request_free(request);
      if (status == UCS_OK) return Status::ok();
      if (state.failed) {
        return Status(Code::RemoteDisconnect, "notification to peer " + state.name + ": " + ucx_text(state.failure));
      }
      return status_for(status, "notification to peer " + state.name);
    }
    send.request = request;
    state_->parked_sends.push_back(std::move(send));
    return Status::ok();
  }

  std::vector<Notification> take_notifications() override {
    progress();
    std::vector<Notification> taken;
    taken.swap(state_->notifications);
    return taken;
  }

  bool progress() override {
    bool handled = false;
    while (state_->progress() != 0) handled = true;
    if (!state_->parked_sends.empty()) state_->reap_parked_sends();
    return handled;
  }

 private:
  std::shared_ptr<UcxWorkerState> state_;
  std::vector<uint8_t> address_;
  WorkerAddressShape shape_;  // of address_: what a peer's address is checked against
  std::string transports_;
};

}  // namespace
}  // namespace ucx

namespace ucx {
namespace {

// Sets UCX_<name> in `config` to AgentConfig's `chosen` value unless the
// environment sets it (the user's choice wins); returns where the value came
// from, for the report ("UCX_TLS=tcp,self (AgentConfig)"), or "" when unset.
Result<std::string> apply_setting(ucp_config_t* config, const char* name, const std::string& chosen) {
  const std::string variable = fmt::format("UCX_{}", name);
  if (const char* set = std::getenv(variable.c_str()); set != nullptr)
    return fmt::format("{}={} (environment)", variable, set);
  if (chosen.empty()) return std::string();
  ucs_status_t status = ucp_config_modify(config, name, chosen.c_str());
  if (status != UCS_OK)
    return Status(Code::InvalidArgument, fmt::format("{}={}: {}", variable, chosen, ucx_text(status)));
  return fmt::format("{}={} (AgentConfig)", variable, chosen);
}

// UCX's configuration from the environment plus the agent's choices.
Result<ucp_config_t*> read_config(const AgentConfig& agent, std::string* description) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return status_for(status, "ucp_config_read (check the UCX_* environment)");
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  // One memory handle per registration, sized to the region: no registration
  // cache merging or widening regions (a peer's key then reaches no byte the
  // owner did not register, where the transport enforces it). The user's
  // UCX_RCACHE_ENABLE wins.
  if (std::getenv("UCX_RCACHE_ENABLE") == nullptr) (void)ucp_config_modify(config, "RCACHE_ENABLE", "n");
  auto tls = apply_setting(config, "TLS", agent.transports);
  auto devices = tls ? apply_setting(config, "NET_DEVICES", agent.net_devices) : tls;
  if (!devices) {
    ucp_config_release(config);
    return devices.status().with_context("agent " + agent.name);
  }
  *description = fmt::format("ucx: {}{}{}", tls->empty() ? "UCX_TLS unset (UCX's default)" : *tls,
                             devices->empty() ? "" : ", ", *devices);
  return config;
}

Status create_worker(UcxWorkerState& state, const std::string& name) {
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucs_status_t status = ucp_worker_create(state.context, &worker_params, &state.worker);
  if (status != UCS_OK) {
    state.worker = nullptr;
    return status_for(status, "ucp_worker_create for agent " + name);
  }
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  handler.id = kNotificationAmId;
  handler.cb = on_notification;
  handler.arg = &state;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  status = ucp_worker_set_am_recv_handler(state.worker, &handler);
  if (status != UCS_OK) return status_for(status, "ucp_worker_set_am_recv_handler");
  return Status::ok();
}

// UCX's unified mode packs no address lengths (each side takes its own).
// The variable is read with UCX's own parser for its boolean settings.
bool unified_mode() {
  const char* value = std::getenv("UCX_UNIFIED_MODE");
  int on = 0;
  return value != nullptr && ucs_config_sscanf_bool(value, &on, nullptr) == 1 && on != 0;
}

Result<std::vector<uint8_t>> worker_address(UcxWorkerState& state) {
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  ucs_status_t status = ucp_worker_get_address(state.worker, &address, &address_length);
  if (status != UCS_OK) return status_for(status, "ucp_worker_get_address");
  std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(address), reinterpret_cast<uint8_t*>(address) + address_length);
  ucp_worker_release_address(state.worker, address);
  return bytes;
}

}  // namespace
}  // namespace ucx

Result<std::unique_ptr<Backend>> make_ucx_backend(const AgentConfig& config) {
  using namespace ucx;
  std::string description;
  EPLB_ASSIGN_OR_RETURN(ucp_config_t* ucx_config, read_config(config, &description));
  auto state = std::make_shared<UcxWorkerState>();
  state->copy_mapped_memory = config.copy_mapped_memory;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  params.name = config.name.c_str();
  ucs_status_t status = ucp_init(&params, ucx_config, &state->context);
  ucp_config_release(ucx_config);
  if (status != UCS_OK) {
    state->context = nullptr;
    return status_for(status, fmt::format("ucp_init for agent {} ({})", config.name, description));
  }
  EPLB_TRY(create_worker(*state, config.name));
  restrict_own_sysv_segments();
  EPLB_ASSIGN_OR_RETURN(std::vector<uint8_t> address, worker_address(*state));
  // Peers' addresses are checked against this one's layout before UCX reads them.
  auto shape = read_worker_address(address, "this process");
  if (!shape || unified_mode()) {
    return error(Code::Unsupported, fmt::format("{}: a peer's address could not be checked before UCX reads it (UCX "
                                                "{}; unified mode, UCX_UNIFIED_MODE, is not supported)",
                                                shape ? "UCX_UNIFIED_MODE is on" : shape.status().message(),
                                                ucp_get_version_string()));
  }
  measure_segments(address, *shape);
  return std::unique_ptr<Backend>(
      std::make_unique<UcxBackend>(std::move(state), std::move(address), std::move(*shape), description));
}

}  // namespace eplb::xfer
