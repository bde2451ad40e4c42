// eplb/app.h - `eplb run`, the main job, as an application module on top of
// the library: a simulated MoE model whose expert weights are synthetic
// (sim), a policy loop over a drifting load trace (policy), and per-layer
// verified migration (migrate) on every rank.
//
// Contract:
// - run_rank runs one rank (every rank calls it with the same options):
//   inputs, fingerprint check (every rank must agree before anything moves),
//   transfer agent, expert store filled with synthetic weights, then per
//   round: the next window of the trace -> policy -> migrate -> every rank
//   verifies every slot byte for byte against its committed mapping and the
//   ranks agree on the result (agree_on_round).
// - Progress leaves through callbacks (options.migrate.on_layer_done per
//   layer, on_ready, on_round_done); results are data (RunSummary). run_rank
//   prints nothing and writes no file; the render_* functions below turn a
//   summary into the text and JSON the CLI prints and writes.
// - fill_simulated / verify_simulated write and check a store's rows with
//   sim's synthetic expert bytes; the store itself knows nothing of sim.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/bootstrap.h"
#include "eplb/migrate.h"
#include "eplb/placement.h"
#include "eplb/placement_io.h"
#include "eplb/sim.h"
#include "eplb/status.h"
#include "eplb/xfer.h"

namespace eplb {

// --------------------------------------------------------- expert tensors ---

// The default tensors of an expert of `bytes_per_expert` bytes (>= 3 KiB):
// "scales" = bytes/256 rounded up to 64 B (at least 64 B), "down" = a third of
// the rest rounded to 64 B, "gate_up" = the remainder (about 2/3). The sum is
// exactly bytes_per_expert. Smaller experts get a single tensor "weight".
std::vector<TensorSpec> default_tensors(uint64_t bytes_per_expert);
// "gate_up:2MiB,down:1MiB,scales:8KiB" (sizes as parse_byte_size).
Result<std::vector<TensorSpec>> parse_tensors(std::string_view spec);

// --------------------------------------------------- simulated expert rows ---

// Writes every slot of `layer` (or of all layers) with the synthetic bytes of
// the expert `placement` maps it to (zeros for an empty slot), and records
// each row's checksum in the store, as an engine would hash its weights when
// it loads them (so a migration's sources need not hash them on first use).
void fill_simulated(ExpertStore& store, const Placement& placement, int layer);
void fill_simulated(ExpertStore& store, const Placement& placement);
// Checks every row of every slot of every layer byte for byte; the error
// names layer, slot, expected expert, tensor and the first differing offset.
Status verify_simulated(const ExpertStore& store, const Placement& placement);

// ---------------------------------------------------------------- eplb run ---

// ------------------------------------------------ emulated serving loop ---

// `eplb run --async`: each rank serves in lockstep with the others while a
// round migrates in the background (Migrator::start). A step calls the
// async handle's commit_ready/poll (the stall), reads the rows of a share of
// its slots per layer (XXH3 of each row against the synthetic expert the
// mapping in force names: a mismatch is an inconsistent read), pads to
// step_ms and meets the other ranks in a per-step allgather on a group of
// its own (never the migration's), which also tells when every rank is done.
struct ServingOptions {
  bool async = false;           // --async: migrate while serving
  // --commit: copy (the engine copies staging into live rows) or swap (a
  // spare buffer per layer, CommitMode::Swap: twice the expert memory).
  std::string commit = "copy";
  double step_ms = 5;           // --step-ms: a serving step lasts at least this long
  double slot_share = 0.25;     // --serve-share: share of each layer's slots a step reads
  int idle_steps = 50;          // steps measured without migration (serving_idle)
};

struct ServingStats {
  int64_t steps = 0;
  double step_seconds_p50 = 0;
  double step_seconds_p99 = 0;
  double stall_seconds_total = 0;
  double stall_seconds_max = 0;
  int64_t inconsistent_reads = 0;
  std::string first_inconsistency;  // the first inconsistent read, in words
};

struct ServingCommit {
  int layer = 0;
  int64_t step = 0;
  double seconds = 0;  // since the round started
};

struct ServingTimeline {
  std::vector<double> step_end_seconds;  // since the round started
  std::vector<double> step_seconds;
  std::vector<double> stall_seconds;
  std::vector<ServingCommit> commits;
};

struct RoundSummary {
  int round = 0;
  double balancedness_before = 0;
  double balancedness_after = 0;
  RoundReport report;            // this rank's view (bytes are whole-group)
  double seconds = 0;            // slowest rank's migration time
  bool verified = false;         // every rank verified every slot
  std::string verify_failure;
  bool served = false;           // an --async round: serving and timeline below are filled
  ServingStats serving;          // this rank's serving steps during the round
  ServingTimeline timeline;
};

struct RunSummary {
  // Known before the first round (on_ready).
  std::string trace_identity;                // the load the run replays (file or generator, and its hash)
  StoreLayout layout;
  std::string transports;                    // this rank's agent, Agent::transports()
  std::vector<std::string> peer_transports;  // what its connections to the peers use
  uint64_t arena_page_bytes = 0;             // ExpertStore::arena_page_bytes() of this rank
  // Filled as the run goes.
  std::vector<RoundSummary> rounds;
  Status status;                  // ok, or why the run stopped
  bool all_verified = false;      // every rank's every slot matches its committed mapping
  std::string final_state;        // this rank's committed state, in words
  // When a round stopped: which layers are on the new placement, and
  // whether every rank was still there to agree on it.
  std::string committed_layers;
  bool group_intact = true;
  uint64_t mapping_hash = 0;      // mapping_hash() of this rank's committed placement
  // Set by a launcher that closes the report of a rank 0 gone before its
  // tail: the JSON tail says "interrupted": true and has no mapping_hash.
  bool interrupted = false;
  std::optional<ServingStats> serving_idle;  // --async: steps without migration (before on_ready)
};

struct RunOptions {
  Topology topology;
  std::vector<TensorSpec> tensors;   // per expert, every layer
  int rounds = 3;
  int window = 20;                   // trace steps per round
  std::string policy = "deepseek";
  int threads = 1;                   // policy threads
  std::string trace_path;            // empty: generate from `generate`
  uint64_t max_input_bytes = kDefaultMaxInputBytes;  // a larger text trace file is refused
  LoadGenOptions generate;           // layers/experts/steps are set from the topology
  // Every rank's transfer agent (backend, transports, fault spec); its name
  // is agent_name_prefix + rank, and each rank draws its own fault sequence
  // (the spec's seed plus the rank).
  xfer::AgentConfig agent;
  std::string agent_name_prefix = "rank-";
  MigrateOptions migrate;            // on_layer_done: per-layer progress
  ServingOptions serving;
  // Required with serving.async: a second group of the same ranks (same
  // rank numbers), used only by the serving loop's per-step allgather, so
  // that serving never shares a collective sequence with the migration.
  ProcessGroup* serving_group = nullptr;
  double setup_timeout_seconds = 60;
  // false: summary.rounds holds only the last round (callers that take each
  // round from on_round_done, so that a long run does not grow).
  bool keep_all_rounds = true;
  // A failure its caller found before run_rank (e.g. rank 0 cannot create
  // its report file): run_rank stops, and every rank with it through the
  // fingerprint, before anything moves.
  Status precondition;
  // Called on every rank once the inputs, the agent and the store are ready.
  std::function<void(const RunSummary&)> on_ready;
  // Called on every rank after each round (agreed with the other ranks).
  std::function<void(const RoundSummary&)> on_round_done;
};

// Runs one rank; the summary's status says whether the run completed.
RunSummary run_rank(ProcessGroup& group, const RunOptions& options);

// Everything run_rank checks before it starts, without a process group:
// options, expert layout, policy name, fault spec (and its seed) and the
// trace file (read and checked against the topology; a generated trace is
// not generated). A launcher calls it once before it starts any rank, so
// that a bad option is one error, printed once, and no rank starts.
Status validate_run_options(const RunOptions& options);

// ------------------------------------------------------ memory admission ---

// What one rank of `eplb run` allocates for its store: the arena (every
// layer's tensor blocks, page aligned; shared memory under UCX) and the
// staging area (the largest layer), and with the swap commit the spare
// buffers (one more layer per layer, in the arena's allocation).
struct RankMemory {
  uint64_t arena_bytes = 0;
  uint64_t staging_bytes = 0;
  uint64_t spare_bytes = 0;
};
RankMemory rank_memory(const StoreLayout& layout, bool spare_buffers = false);
// Per rank, beyond the store: the process, UCX's FIFOs and bounce buffers.
inline constexpr uint64_t kRankOverheadBytes = uint64_t{64} << 20;

// (MachineMemory and read_machine_memory: eplb/common.h.)
// InvalidArgument naming every size and the limit when `local_ranks` ranks
// would allocate more than 90% of MemAvailable, or (arena in shared memory)
// their arenas exceed the free space of /dev/shm. Pure arithmetic.
Status admit_memory(const RankMemory& per_rank, int local_ranks, bool arena_in_shared_memory,
                    const MachineMemory& machine);

// ----------------------------------------------------- rendering a report ---

// Strings that only label the output (what the user asked for).
struct RunLabels {
  std::string transport;   // "shm", "tcp", "loopback"
  std::string bootstrap;   // "local", "mpi", "threads"
};

// The three header lines: ranks, topology, policy; experts; trace.
std::string render_banner(const RunOptions& options, const RunLabels& labels, const RunSummary& summary);
// The per-round table and the closing line (all verified, or how it stopped).
std::string render_table(const RunOptions& options, const RunSummary& summary);
// The same in parts, for callers that render each round as it ends:
// header + one row per round + end == render_table.
std::string render_table_header();
std::string render_table_row(const RoundSummary& round);
std::string render_table_end(const RunOptions& options, const RunSummary& summary);
// The report as JSON text (per round and per layer).
std::string render_json(const RunOptions& options, const RunLabels& labels, const RunSummary& summary);
// The same in parts, for a report streamed to its file as rounds end:
// head + render_json_round(first round, true) + ... + tail == render_json.
// The head uses what is known at on_ready; the tail how the run ended.
std::string render_json_head(const RunOptions& options, const RunLabels& labels, const RunSummary& summary);
std::string render_json_round(const RoundSummary& round, bool first);
std::string render_json_tail(const RunSummary& summary);

// Progress lines while the run goes: a bar per layer on a terminal, a line
// per failed layer, a line per round.
class RunProgress {
 public:
  RunProgress(bool terminal, int rounds, int layers) : terminal_(terminal), rounds_(rounds), layers_(layers) {}
  std::string layer_done(const LayerReport& layer);
  std::string round_done(const RoundSummary& round);

 private:
  bool terminal_;
  int rounds_;
  int layers_;
  int round_ = 0;
  int done_ = 0;
  uint64_t moved_ = 0;
};

}  // namespace eplb
