// eplb/plan.h - the migration planner: old placement + new placement ->
// what every rank does, per layer.
//
// Contract: pure and deterministic; every rank computes the same plan
// independently, nothing is broadcast. For one layer and every receiving
// rank r, each slot of r is exactly one of:
//   Keep       the slot's expert is unchanged;
//   LocalCopy  the expert already lives on r in the old placement (any slot),
//              or arrives on r by a RemoteRead in this layer (copy after read);
//   RemoteRead the expert is not on r: exactly one READ per (expert, r).
// Sources: a replica on r's node before one on another node; receivers are
// spread evenly over the candidate source replicas; ties by lowest slot.
// All remote reads of one layer from one source rank form one ReadRequest;
// runs of adjacent source rows landing in adjacent destination rows merge
// into one ReadRun. Counts are in slots (multiply by bytes per expert).
// Planning allocates only the result: per layer, one array of slot ops, one
// of requests and one of read-from slots, views per rank into them; runs
// live inline in their request.
// A whole DeepSeek-V3-shaped change (58 layers, 288 slots, 32 ranks) plans
// in about 0.3 ms (docs/plan.md).
//
// The transfer schedule (schedule_transfers, below; docs/scale.md) orders a
// layer plan's reads into rounds that keep every link, ingress and egress,
// as busy as its share of the bytes allows. Hosts are the topology's nodes
// (ranks [n*P/N, (n+1)*P/N) share host n). Pure and deterministic too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "eplb/placement.h"
#include "eplb/status.h"

namespace eplb {

enum class SlotAction : uint8_t { Keep, LocalCopy, RemoteRead };

struct SlotOp {
  int slot = 0;            // global slot index (on the receiving rank)
  int expert = 0;          // logical expert the slot holds after the layer commits
  SlotAction action = SlotAction::Keep;
  int source_rank = -1;    // RemoteRead: the rank read from; LocalCopy: this rank
  int source_slot = -1;    // global slot copied/read from. For LocalCopy it is a
                           // slot of the OLD placement on this rank, or, when
                           // copy_after_read, the slot filled by this layer's
                           // RemoteRead of the same expert (read staging first).
  bool copy_after_read = false;
};

// `count` consecutive rows: source slots [source_slot, +count) on the source
// rank -> destination slots [dest_slot, +count) on the receiving rank.
struct ReadRun {
  int source_slot = 0;
  int dest_slot = 0;
  int count = 0;
};

// The runs of one ReadRequest. Reads like a std::vector<ReadRun> (size,
// empty, [], begin/end, front/back, push_back); up to two runs are stored
// inline, so a plan needs no heap allocation per request (most have one run).
class ReadRunList {
 public:
  static constexpr size_t kInline = 2;

  ReadRunList() = default;
  ReadRunList(std::initializer_list<ReadRun> runs) {
    reserve(runs.size());
    for (const ReadRun& run : runs) push_back(run);
  }

  size_t size() const { return spilled_.empty() ? inline_size_ : spilled_.size(); }
  bool empty() const { return size() == 0; }
  ReadRun* begin() { return spilled_.empty() ? inline_ : spilled_.data(); }
  ReadRun* end() { return begin() + size(); }
  const ReadRun* begin() const { return spilled_.empty() ? inline_ : spilled_.data(); }
  const ReadRun* end() const { return begin() + size(); }
  ReadRun& operator[](size_t i) { return begin()[i]; }
  const ReadRun& operator[](size_t i) const { return begin()[i]; }
  ReadRun& front() { return *begin(); }
  const ReadRun& front() const { return *begin(); }
  ReadRun& back() { return end()[-1]; }
  const ReadRun& back() const { return end()[-1]; }

  void reserve(size_t count) {
    if (count <= kInline) return;
    if (spilled_.empty()) {
      spilled_.reserve(count);
      spilled_.assign(inline_, inline_ + inline_size_);
      inline_size_ = 0;
    } else {
      spilled_.reserve(count);
    }
  }
  void push_back(const ReadRun& run) {
    if (spilled_.empty() && inline_size_ < kInline) {
      inline_[inline_size_++] = run;
      return;
    }
    if (spilled_.empty()) reserve(2 * kInline);
    spilled_.push_back(run);
  }
  void clear() {
    spilled_.clear();
    inline_size_ = 0;
  }

 private:
  // Invariant: while spilled_ is non-empty it holds every run and inline_size_ == 0.
  ReadRun inline_[kInline] = {};
  size_t inline_size_ = 0;
  std::vector<ReadRun> spilled_;
};

struct ReadRequest {
  int source_rank = 0;
  ReadRunList runs;  // ordered by dest_slot
  int slots() const;
};

// A read-only view of slot numbers (into a LayerPlan's storage); compares
// equal to a std::vector<int> holding the same values.
struct SlotList : std::span<const int> {
  using std::span<const int>::span;
  SlotList(std::span<const int> view) : std::span<const int>(view) {}
  friend bool operator==(SlotList list, const std::vector<int>& values) {
    return std::equal(list.begin(), list.end(), values.begin(), values.end());
  }
};

// A rank's part of a LayerPlan: views into the LayerPlan's storage.
struct RankLayerPlan {
  int rank = 0;
  std::span<const SlotOp> slots;       // one per slot of the rank, in slot order
  std::span<const ReadRequest> reads;  // one per source rank, ordered by source rank
};

struct PlanStats {
  int64_t slots_kept = 0;
  int64_t slots_local_copy = 0;
  int64_t slots_read_intra_node = 0;
  int64_t slots_read_inter_node = 0;
  int64_t requests = 0;     // ReadRequests (one per receiving rank and source rank)
  int64_t descriptors = 0;  // ReadRuns after merging
  PlanStats& operator+=(const PlanStats& other);
};

// One layer's plan. Every rank's slots, requests and read-from slots live in
// one array each (the storage below: three allocations per layer, not three
// per rank); RankLayerPlan and slots_read_from view into it. Moving keeps the
// views valid; copying copies the storage and re-points them.
struct LayerPlan {
  int layer = 0;
  std::vector<RankLayerPlan> ranks;  // indexed by rank
  PlanStats stats;
  // For every rank, the global slots that some other rank reads in this layer
  // (what that rank must checksum and keep stable until the vote), ascending.
  std::vector<SlotList> slots_read_from;

  // Storage, written by the planner and read through the views above.
  std::vector<SlotOp> slot_storage;       // [R]: every slot's op, by global slot
  std::vector<ReadRequest> read_storage;  // every rank's requests, rank by rank
  std::vector<int> read_from_storage;     // every slot read by another rank, ascending

  LayerPlan() = default;
  LayerPlan(const LayerPlan& other);
  LayerPlan& operator=(const LayerPlan& other);
  LayerPlan(LayerPlan&&) noexcept = default;
  LayerPlan& operator=(LayerPlan&&) noexcept = default;
  ~LayerPlan() = default;
};

struct MigrationPlan {
  std::vector<LayerPlan> layers;
  PlanStats stats;
};

Result<LayerPlan> plan_layer(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                             const Topology& topology, int layer);
Result<MigrationPlan> plan_migration(const Placement& old_placement, const Placement& new_placement,
                                     const Topology& topology);

// ---- The contention-aware transfer schedule ----------------------------

// Bandwidths of the links a migration crosses, in bytes per second, each
// way. A read inside a host uses the source rank's intra-host egress and the
// receiver's intra-host ingress (NVLink); a read between hosts uses the
// source rank's NIC egress, its host's egress, the receiver host's ingress
// and the receiver's NIC ingress. host 0: no host-wide limit.
struct LinkBandwidths {
  double intra_host = 0;  // per rank
  double nic = 0;         // per rank
  double host = 0;        // per host, all its ranks together (0: unlimited)
  Status validate() const;
};

// Bytes per link of one layer (or summed over layers): indexed by rank
// (intra_*, nic_*) or by host (host_*). Reads only; local copies use no link.
struct LinkLoads {
  std::vector<double> intra_out, intra_in, nic_out, nic_in;  // [P]
  std::vector<double> host_out, host_in;                     // [N]
  LinkLoads() = default;
  LinkLoads(int ranks, int hosts);
  LinkLoads& operator+=(const LinkLoads& other);
  double total_inter_host() const;  // sum of nic_in
  double total_intra_host() const;  // sum of intra_in
};

LinkLoads link_loads(const LayerPlan& plan, const Topology& topology, double bytes_per_expert);

// The makespan lower bound: the most loaded link's bytes over its bandwidth.
double lower_bound_seconds(const LinkLoads& loads, const LinkBandwidths& bandwidths);

// One read of one expert row set: `run.count` consecutive slots of `source`
// into `receiver` (runs never merge across rounds).
struct ScheduledRead {
  int receiver = 0;
  int source = 0;
  ReadRun run;
  bool inter_host = false;
};

// The reads of one round: every rank's NIC sends at most one expert and
// receives at most one, every host's link carries at most host_slots
// experts each way, every rank's intra-host link at most one each way.
// Ordered by receiver, then source, then destination slot.
struct TransferRound {
  std::vector<ScheduledRead> reads;
  double seconds = 0;  // the round's busiest link: its bytes over its bandwidth
};

struct TransferSchedule {
  int layer = 0;
  std::vector<TransferRound> rounds;
  LinkLoads loads;
  int host_slots = 1;               // experts one host link carries at once, each way
  double lower_bound_seconds = 0;   // the most loaded link's bytes over its bandwidth
  double makespan_seconds = 0;      // sum of the rounds' seconds (rounds run one after another)
};

// Orders a layer plan's reads into rounds (docs/scale.md, "The schedule"):
// every RemoteRead appears exactly once, one expert per read. Between hosts
// each host's ranks are spread over host_slots ports each way (busiest
// ranks first onto the least loaded port), and the rounds are an edge
// colouring of the (source port, receiver port) multigraph with as many
// colours as its busiest port has experts (Konig's theorem): exactly the
// lower bound when ports are ranks (host links do not bind) or hosts (one
// expert at a time per host link). Reads inside hosts are coloured the same
// way on their own links and share the rounds.
Result<TransferSchedule> schedule_transfers(const LayerPlan& plan, const Topology& topology,
                                            const LinkBandwidths& bandwidths, double bytes_per_expert);

// Rank `rank`'s reads in the schedule, round by round: one ReadRequest per
// source rank and round (runs merged where adjacent). Rounds without a read
// of this rank are left out, or kept as empty entries with
// `keep_empty_rounds` (so that every rank has one entry per round of the
// schedule: the executor's fenced rounds). What the executor posts, one
// round after another.
std::vector<std::vector<ReadRequest>> rank_rounds(const TransferSchedule& schedule, int rank,
                                                  bool keep_empty_rounds = false);

}  // namespace eplb
