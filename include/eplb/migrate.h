// eplb/migrate.h - the migration executor: expert store, per-layer
// protocol (stage, wait, verify, vote, commit or abort), reports as data.
//
// Contract:
// - StoreLayout says what one rank holds: S slots of every layer, an expert
//   being a list of tensors per layer; tensor t of layer l is rows
//   [S][bytes of t per expert]. check_layouts_agree compares every rank's.
// - ExpertStore holds this rank's slots [first_slot, first_slot + S) of every
//   layer: either one arena owned by the store (create_arena, allocated
//   through the transfer agent where it can) or an engine's buffers, adopted
//   in place (adopt), plus one staging area sized for one layer's slots. The
//   store knows nothing of what the bytes are; the engine (or a simulation)
//   writes them and calls forget_checksums() when it rewrites rows itself.
// - Spare buffers (create_arena with spare_buffers, or adopt with the
//   engine's second buffers): a second buffer per layer, the size of the
//   layer, for the swap commit
//   (CommitMode::Swap). Per layer one buffer is live (row() reads it), the
//   other is the spare: a round writes the layer's new rows into the spare
//   (READs land there directly, unchanged rows are copied in) and its commit
//   swaps the two (swap_layer: O(1), the checksum cache follows). Costs one
//   extra layer of memory per layer (spare_bytes()). Peers learn which of a
//   source's two buffers is live from the source's per-layer checksum
//   publication; both are in its memory map.
// - Migrator::create is collective: every rank registers its store with its
//   xfer Agent, allgathers its layout and memory map and refuses a mismatch
//   (Mismatch naming the rank, layer, tensor and both sizes) before any byte
//   moves.
// - Migrator::migrate is collective and moves layer by layer. First every
//   layer is planned (plan_layer: the same plans on every rank) and sources
//   publish, in one allgather for the whole round, the checksum (XXH3-64;
//   computed once, then remembered by the store and carried over from
//   verified reads at commit) of every row a peer will read in every changed
//   layer. Then per changed layer: READs (one request per source rank) and local copies
//   land in staging; wait with a deadline; verify every received row;
//   unanimous vote; yes -> the changed live rows are written (from staging,
//   or, for a local copy of a row that stays put, straight from that live
//   row) and the layer's mapping in `current` switches; no -> staging is
//   dropped, live rows and mapping stay as they were, the layer is retried
//   with fresh requests up to `retries` times, then the round stops with
//   Aborted naming the layer, ranks, peers, experts and statuses. Layers
//   committed before keep their new placement. A lost rank (collective fails)
//   stops the round with that collective's Status (naming the rank).
// - Fence: a source's live rows of layer l change only in layer l's commit,
//   which follows a unanimous vote, which every rank casts only after its own
//   reads of layer l have landed or been released. So no rank overwrites rows
//   a peer may still be reading, and no extra barrier is needed: layer l+1
//   reads other rows, which change only after l+1's own vote.
//   With the swap commit, peers read only the published live buffer; the
//   spare is private until the swap, and the old live buffer (the spare
//   after it) is written again only in layer l of a later round, after
//   every READ of it landed (docs/async.md).
// - Reports are data (LayerReport, RoundReport); progress leaves through the
//   MigrateOptions callbacks. agree_on_round lets the ranks compare their
//   committed mappings and their own checks after a round.
// - Every wait has a deadline; nothing here throws, prints or writes files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/bootstrap.h"
#include "eplb/common.h"
#include "eplb/data_plane.h"
#include "eplb/placement.h"
#include "eplb/plan.h"
#include "eplb/status.h"
#include "eplb/xfer.h"

namespace eplb {

// ---------------------------------------------------------------- layout ---

// One tensor of an expert: its name, bytes per expert, and, where the
// engine knows them, its element type ("bfloat16", "float8_e4m3fn", ...)
// and the shape of one expert's rows (empty: not given). Layouts agree only
// when all four do on every rank.
struct TensorSpec {
  std::string name;
  uint64_t bytes_per_expert = 0;
  std::string dtype;
  std::vector<int64_t> shape;
  bool operator==(const TensorSpec&) const = default;
  std::string describe() const;  // "'down' float32 [16, 32] (2 KiB)"
};

struct StoreLayout {
  int slots_per_rank = 0;
  std::vector<std::vector<TensorSpec>> layers;  // layers[l] = tensors of layer l

  // Every layer with the same tensors.
  static StoreLayout uniform(int num_layers, int slots_per_rank, const std::vector<TensorSpec>& tensors);

  int num_layers() const { return static_cast<int>(layers.size()); }
  uint64_t bytes_per_expert(int layer) const;    // sum over the layer's tensors
  uint64_t layer_bytes(int layer) const;         // slots_per_rank * bytes_per_expert(layer)
  uint64_t total_bytes() const;                  // all layers
  uint64_t max_layer_bytes() const;              // the staging size
  Status validate() const;                       // non-empty, positive sizes, unique names
  // Versioned binary encoding (for the allgather) and its checked decoder.
  std::string encode() const;
  static Result<StoreLayout> decode(std::string_view bytes);
  // "8 layers x 18 slots x [gate_up 683 KiB, down 341 KiB, scales 16 B]"
  std::string to_string() const;
};

// Compares every rank's encoded layout with rank 0's: the one layout check
// (the Python Migrator and the vLLM communicator raise its result). The
// error names the first differing rank, layer and tensor and both sizes,
// dtypes or shapes, e.g. "nbytes_per_expert mismatch: rank 2 has layer 3
// tensor 'down' of 349504 B per expert, rank 0 has 349525 B ...".
Status check_layouts_agree(const std::vector<std::string>& encoded_layouts);

// ----------------------------------------------------------------- store ---

// Engine-owned memory of one tensor of one layer: S rows, row_stride bytes
// apart, each bytes_per_expert (of that tensor) long.
struct TensorMemory {
  uint8_t* address = nullptr;
  uint64_t row_stride = 0;  // 0: rows are packed (stride = bytes per expert)
  // The rows lie inside memory the Migrator's agent allocated
  // (Agent::allocate_memory), registered already: regions() leaves them out.
  bool registered = false;
};

// Where an adopted store's staging rows are: allocated by the store (host
// memory, the ucx plane's), the engine's own buffer of one layer's shape
// ([tensor]; every layer's rows must fit it: vLLM's expert_buffer), or
// none (a data plane that keeps its own staging, on a device: the store's
// addresses are then never dereferenced by the protocol).
struct StoreStaging {
  enum class Kind { Allocate, Engine, None } kind = Kind::Allocate;
  std::vector<TensorMemory> engine;  // Kind::Engine: [tensor]
};

class ExpertStore {
 public:
  // Allocates one page-aligned arena for all layers plus the staging area.
  // With `agent`, the arena comes from agent->allocate_memory() (with UCX:
  // shared-memory segments that same-host peers read without this process's
  // CPU) and is registered already; backends that cannot allocate fall back
  // to private memory. Such an arena belongs to the agent: it is freed when
  // the agent is destroyed, and the store must not be used after that.
  // With `spare_buffers`, the arena holds two buffers per layer (twice the
  // live bytes) so that a Migrator can commit by swapping them.
  static Result<std::unique_ptr<ExpertStore>> create_arena(const StoreLayout& layout, int first_slot,
                                                           xfer::Agent* agent = nullptr, bool spare_buffers = false);
  // Uses the engine's buffers memory[layer][tensor] (not owned, must outlive
  // the store); the staging area as `staging` says. With `spare` (the same
  // shape as `memory`, empty for none), the engine's second buffers become
  // the spares of the swap commit; after a round the engine finds each
  // layer's live buffer with live_buffer(layer) (0: memory, 1: spare).
  static Result<std::unique_ptr<ExpertStore>> adopt(const StoreLayout& layout, int first_slot,
                                                    std::vector<std::vector<TensorMemory>> memory,
                                                    std::vector<std::vector<TensorMemory>> spare = {},
                                                    StoreStaging staging = {});
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  const StoreLayout& layout() const { return layout_; }
  int first_slot() const { return first_slot_; }
  int slots_per_rank() const { return layout_.slots_per_rank; }

  // Live row of (layer, local slot, tensor), and its length.
  uint8_t* row(int layer, int local_slot, int tensor) const;
  uint64_t row_bytes(int layer, int tensor) const { return layout_.layers[layer][tensor].bytes_per_expert; }
  uint64_t row_stride(int layer, int tensor) const { return memory_[layer][tensor].row_stride; }
  // Staging row for (local slot, tensor) when staging layer `layer`.
  uint8_t* staging_row(int layer, int local_slot, int tensor) const;

  // Spare buffers (see the contract). has_spare(): created with them;
  // spare_bytes(): their size (0 without). live_buffer(layer): 0 or 1, which
  // of the layer's two buffers is live; buffer_row: a row of buffer 0 or 1
  // (buffer 1 only with spares); spare_row: the non-live buffer's row.
  bool has_spare() const { return !spare_.empty(); }
  uint64_t spare_bytes() const;
  int live_buffer(int layer) const { return live_[layer]; }
  uint8_t* buffer_row(int layer, int buffer, int local_slot, int tensor) const;
  uint8_t* spare_row(int layer, int local_slot, int tensor) const;
  // The swap commit of a layer: the spare becomes live and the live buffer
  // the spare; `sums` ([local slot * tensors + tensor], as the checksum
  // cache) become the remembered checksums of the new live rows.
  void swap_layer(int layer, std::vector<std::optional<uint64_t>> sums);

  // XXH3-64 of a live row, computed now.
  uint64_t checksum(int layer, int local_slot, int tensor) const;
  // The same, remembered: computed on first use, then kept until the row is
  // rewritten by a migration commit (which records the verified checksum of
  // what it wrote) or forgotten. Whoever writes live rows outside a
  // migration (an engine loading weights, a simulation filling them) must
  // call forget_checksums() for what it wrote.
  uint64_t known_checksum(int layer, int local_slot, int tensor);
  // Cached value or nothing (no hashing).
  std::optional<uint64_t> cached_checksum(int layer, int local_slot, int tensor) const;
  void remember_checksum(int layer, int local_slot, int tensor, std::optional<uint64_t> value);
  void forget_checksums();
  void forget_checksums(int layer);

  // The memory to register with the xfer Agent (live memory + staging),
  // without an arena or adopted tensors the agent allocated (registered already).
  std::vector<xfer::MemoryRegion> regions() const;
  // The page size this process maps the arena with: 4 KiB, or 2 MiB when it
  // came from reserved huge pages (UCX's System V allocation takes them when
  // vm.nr_hugepages has enough free). 0 for adopted memory or when unknown.
  uint64_t arena_page_bytes() const { return arena_page_bytes_; }

 private:
  ExpertStore() = default;
  StoreLayout layout_;
  int first_slot_ = 0;
  std::vector<std::vector<TensorMemory>> memory_;  // [layer][tensor], stride resolved: the live buffer
  std::vector<std::vector<TensorMemory>> spare_;   // [layer][tensor]: the spare buffer (empty without)
  std::vector<int> live_;                          // [layer]: 0 or 1, which buffer memory_ is
  std::vector<std::vector<uint64_t>> staging_offsets_;  // [layer][tensor] offset into staging
  uint8_t* arena_ = nullptr;
  uint64_t arena_bytes_ = 0;
  uint64_t arena_page_bytes_ = 0;
  xfer::Agent* agent_ = nullptr;      // owner of the arena when agent_region_ != 0
  xfer::RegionId agent_region_ = 0;
  uint8_t* staging_ = nullptr;  // allocated by the store (unmapped with it)
  uint64_t staging_bytes_ = 0;
  std::vector<TensorMemory> engine_staging_;  // Staging::Kind::Engine: [tensor]
  // [layer][local slot * tensors + tensor]: XXH3 of the live row, if known.
  std::vector<std::vector<std::optional<uint64_t>>> checksums_;
  void reset_checksums(int layer);
  Status finish_setup(StoreStaging::Kind staging);  // staging area and checksum cache
  // Bytes from a buffer's first row to the end of its last.
  uint64_t span_bytes(size_t layer, size_t tensor, const TensorMemory& buffer) const;
};

// -------------------------------------------------------------- executor ---

struct LayerReport;

// How a layer's new rows reach the live rows after the unanimous vote.
// Copy: staging -> live rows (the only mode for adopted memory, whose
// addresses the engine may have frozen). Swap: the rows were written into
// the layer's spare buffer in the background; the commit swaps live and
// spare (needs a store created with spare buffers).
enum class CommitMode { Copy, Swap };
std::string_view commit_mode_name(CommitMode mode);  // "copy", "swap"

struct MigrateOptions {
  // Deadline for the transfers of one layer attempt; <= 0: automatic,
  // 5 s + 1 s per 256 MiB this rank reads in the layer.
  double timeout_seconds = 0;
  int retries = 2;  // extra attempts per layer after a failed vote
  // Copy or Swap (Swap: InvalidArgument unless the store has spare buffers).
  CommitMode commit = CommitMode::Copy;
  // Deadline for each collective (allgather, vote); <= 0: automatic,
  // the layer's transfer deadline + 10 s.
  double collective_timeout_seconds = 0;
  // Async rounds (Migrator::start): the progress thread, and the threads
  // it starts, run under SCHED_BATCH (Linux), so that waking it (a commit,
  // a finished wait) never preempts the serving thread on a busy CPU: the
  // serving thread keeps the core until its step yields it. Best effort: a
  // refusal (seccomp, another OS) leaves the default policy. false: the
  // progress thread keeps the caller's policy.
  bool batch_progress_thread = true;
  // [issue 31: transfer schedule] Set: each layer's READs are posted round
  // by round in the order schedule_transfers gives for these link
  // bandwidths (plan.h; every rank computes the same schedule), each round
  // after this rank's previous one landed. Unset (default): all of a
  // layer's READs at once. Off until measurements show it helps
  // (docs/scale.md). Hook: scheduled_read_rounds() in
  // src/migrate/scheduled_reads.cpp, called from layer_round.cpp.
  std::optional<LinkBandwidths> transfer_schedule;
  // [issue 31] With transfer_schedule: the rounds are fenced (names
  // "ranks-fenced", "hosts-fenced": set_transfer_schedule). After each
  // round of the schedule every rank joins one small allgather carrying its
  // round's outcome, so that no rank posts round k+1 while another rank's
  // round k still holds a link (a READ of round k+1 would meet one of round
  // k on its source's or receiver's link). A failure on any rank ends the
  // attempt on every rank at that fence (then the vote, and a retry).
  // false (default): each rank starts its next round once its own landed.
  bool fence_schedule_rounds = false;
  // Test hook, called on every rank before each attempt of each layer.
  std::function<void(int layer, int attempt)> before_attempt;
  // Progress, called on every rank after each layer (committed, unchanged or failed).
  std::function<void(const LayerReport& report)> on_layer_done;
};

// The one place every deadline of a migration comes from (transfers,
// collectives, set-up, the serving thread's wait for a vote, draining a
// closed async round), from the options and the largest read of a layer.
// Automatic (timeout 0): 5 s + 1 s per 256 MiB read; collectives: the
// transfers + 10 s; serving wait: a collective + 5 s; drain: 3 collectives.
struct Deadlines {
  double transfer_seconds = 0;
  double collective_seconds = 0;
  double setup_seconds = 0;
  double serving_wait_seconds = 0;
  double drain_seconds = 0;
};
inline constexpr double kMaxTimeoutSeconds = 86400;  // a day: no deadline means "never"
Deadlines derive_deadlines(const MigrateOptions& options, uint64_t largest_read_bytes);
// InvalidArgument unless every timeout is in [0, kMaxTimeoutSeconds].
Status validate_timeouts(const MigrateOptions& options);

// [issue 31] The transfer schedule by the name the CLI (--transfer-schedule)
// and eplb.Migrator(transfer_schedule=) take, into `options`
// (transfer_schedule and fence_schedule_rounds): "off" (unset: all READs at
// once), "ranks" (one expert per NIC per round, hosts limited only by their
// ranks' NICs: {1, 1, 0}) or "hosts" (also one expert per host link per
// round, as on scripts/netns_cluster.sh: {1, 1, 1}), each of the last two
// also "-fenced" (fence_schedule_rounds); only the ratios matter to the
// order. Otherwise InvalidArgument "must be off, ranks, hosts, ranks-fenced
// or hosts-fenced, got '<name>'" (callers add the option's name as
// context); `options` is then unchanged.
inline constexpr std::string_view kTransferScheduleNames = "off, ranks, hosts, ranks-fenced or hosts-fenced";
Status set_transfer_schedule(MigrateOptions& options, std::string_view name);
// The inverse: "off", "ranks", "hosts" (+ "-fenced"), or "custom" (+
// "-fenced") for other bandwidths.
std::string transfer_schedule_name(const MigrateOptions& options);

struct LayerReport {
  int layer = 0;
  // Whole group (all ranks), from the plan.
  uint64_t bytes_kept = 0;
  uint64_t bytes_local = 0;
  uint64_t bytes_intra_node = 0;
  uint64_t bytes_inter_node = 0;
  int64_t requests = 0;
  int64_t descriptors = 0;
  // This rank.
  uint64_t bytes_read_here = 0;
  double seconds = 0;
  // This rank's time per phase (all attempts): checksumming its source rows
  // and publishing them, transfers + local copies until landed, verifying
  // received rows, voting (waiting for the slowest rank), committing.
  double seconds_checksum = 0;
  double seconds_transfer = 0;
  double seconds_verify = 0;
  double seconds_vote = 0;
  double seconds_commit = 0;
  int retries = 0;
  bool changed = false;    // the plan moves something
  bool committed = false;  // changed and switched to the new placement
  std::string failure;     // last failure (a retried failure is kept too)
  Code failure_code = Code::Ok;  // the code of `failure` (Ok when there is none)
  std::string plane;       // the data plane that moved the layer's rows ("ucx", "torch", ...)
};

struct RoundReport {
  std::vector<LayerReport> layers;
  double seconds = 0;
  Status status;  // ok, or why the round stopped
  // The round failed on this rank only, after its last vote (a stop
  // requested then): the other ranks completed it.
  bool stopped_alone = false;
  // When status failed: the layer the round stopped at (-1: before any,
  // or after the last), and what this rank was doing ("opening the round",
  // "voting on attempt 2", "committing", "transfers and verification").
  // status.peer() is the rank the failure names, when there is one.
  int failed_layer = -1;
  std::string operation;
  // Bytes of committed layers only (a failed layer's bytes were dropped).
  uint64_t bytes_moved() const;  // local + intra + inter
  uint64_t bytes_local() const;
  uint64_t bytes_intra_node() const;
  uint64_t bytes_inter_node() const;
  int retries() const;
  int failures() const;  // layers that failed (at least one attempt), including retried ones
  int layers_committed() const;
};

// One layer's transfers given by the engine (Migrator::exchange): receives
// land in Staging rows (source_buffer Primary), sends leave Primary rows.
// `local_error`: a bad call the engine recorded (an expert its source does
// not hold, ...): every rank raises it and nothing moves.
struct LayerExchange {
  int layer = 0;
  std::vector<RowReceive> receives;
  std::vector<RowSend> sends;
  std::string local_error;
};

class Migrator {
 public:
  // Collective: registers the store with `agent`, exchanges metadata and
  // memory maps with every rank, checks that layouts agree.
  static Result<std::unique_ptr<Migrator>> create(ProcessGroup& group, xfer::Agent& agent, ExpertStore& store,
                                                  const Topology& topology, MigrateOptions options,
                                                  Deadline deadline);
  // Collective, for a rank that cannot take part (its tensors cannot be
  // used): joins the set-up exchange of the other ranks' create() with
  // `why`, so that every rank fails with it, naming this rank. Returns that
  // failure (or the exchange's own).
  static Status refuse_setup(ProcessGroup& group, const std::string& why, Deadline deadline);
  // The same over any data plane (eplb/data_plane.h); `plane` must
  // outlive the Migrator. Every rank must use the same kind of plane.
  static Result<std::unique_ptr<Migrator>> create(ProcessGroup& group, DataPlane& plane, ExpertStore& store,
                                                  const Topology& topology, MigrateOptions options,
                                                  Deadline deadline);
  ~Migrator();

  // Collective: moves the store from `current` to `target`; `current`
  // switches layer by layer as layers commit. report.status says how the
  // round ended.
  RoundReport migrate(Placement& current, const Placement& target);
  // Collective: the same round overlapped with serving (eplb/migrate_async.h).
  // `lead_steps` (>= 1) is D in the commit step C = max_r S_r + D.
  Result<std::unique_ptr<class AsyncMigration>> start(Placement& current, const Placement& target,
                                                      int lead_steps = 2);

  // Collective: one layer's transfers as the engine gives them (vLLM's
  // communicator records add_send / add_recv), through the same protocol
  // as a round: one publication (every rank's sent rows with their experts
  // and digests, its receives and sends, any bad call it recorded, which
  // every rank then raises), the pairing of sends and receives checked on
  // every rank before anything moves, then the attempts (transfer, verify,
  // vote, retries). The verified rows are in the receives' staging rows; no
  // commit (the engine writes its weights itself). Nothing queued on any
  // rank: Ok after the publication. The report holds one layer (or none).
  RoundReport exchange(const LayerExchange& exchange);

  // Thread-safe: this rank stops the running round at its next vote (every
  // rank then stops there, naming this rank and `why`); after the round's
  // last vote, the round still fails on this rank with `why`. For a
  // per-layer callback that failed (on_layer_done runs on the round's
  // thread). Cleared when the next round starts.
  void stop_at_next_vote(Status why);

  // The number of logical experts the placements of the next migrate()
  // calls have (the store and the memory maps do not depend on it; an
  // engine whose expert count is only known from its placements sets it
  // before each round). InvalidArgument when the topology would be invalid.
  Status set_num_experts(int num_experts);

  const MigrateOptions& options() const { return options_; }
  MigrateOptions& options() { return options_; }

  struct State;  // opaque: the set-up and the peers' memory maps

 private:
  Migrator() = default;
  std::unique_ptr<State> state_;
  MigrateOptions options_;
};

// ------------------------------------------------------- after a round ---

// What one rank says after a round: its migration time, the hash of the
// mapping it committed (mapping_hash), and the outcome of its own check of
// its slots ("" when fine; an engine's or a simulation's check).
struct RankOutcome {
  double seconds = 0;
  uint64_t mapping_hash = 0;
  std::string check_failure;
};
struct RoundAgreement {
  double slowest_seconds = 0;  // the largest `seconds` of any rank
  bool agreed = false;         // same mapping on every rank and every check passed
  std::string failure;         // otherwise: the first rank whose check failed or whose mapping differs
};
// XXH3-64 of a placement's phy2log.
uint64_t mapping_hash(const Placement& placement);
// Collective: exchanges every rank's RankOutcome (a versioned, checked
// message) and compares them. Fails only when the exchange itself fails or
// a rank's message is malformed.
Result<RoundAgreement> agree_on_round(ProcessGroup& group, const RankOutcome& mine, Deadline deadline);

}  // namespace eplb
