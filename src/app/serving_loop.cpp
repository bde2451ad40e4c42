// serving_loop.cpp - the emulated serving loop of `eplb run --async`: per
// step, the eplb calls (commit_ready, poll: the stall), the reads of a share
// of the slots checked against the mapping in force, a pad to step_ms, and a
// per-step allgather on the serving group (lockstep + "is everyone done").
#include "serving_loop.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

namespace eplb {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// What a serving step may wait past the layer's transfer deadline: the
// checksums and the vote of a healthy group (see serving_wait_seconds).
constexpr double kServingWaitMargin = 5.0;

// A layer's transfer deadline: --timeout, or (automatic) the migration's own
// rule, 5 s + 1 s per 256 MiB, for the most a rank can read in one layer
// (all its slots).
double transfer_deadline_seconds(const RunOptions& options, const ExpertStore& store) {
  if (options.migrate.timeout_seconds > 0) return options.migrate.timeout_seconds;
  uint64_t largest = 0;
  for (int l = 0; l < store.layout().num_layers(); ++l) largest = std::max(largest, store.layout().layer_bytes(l));
  return 5.0 + double(largest) / double(256ull << 20);
}

}  // namespace

// A healthy rank is held inside commit_ready at most while a vote waits for
// the slowest rank's transfers (the transfer deadline) and checksums; a
// rank that keeps the others waiting longer at a step is lost or stopped.
double serving_wait_seconds(const RunOptions& options, const ExpertStore& store) {
  return transfer_deadline_seconds(options, store) + kServingWaitMargin;
}

namespace {

// The step times of a loop, and its stats once finished.
struct StepRecorder {
  Clock::time_point start = Clock::now();
  ServingStats stats;
  ServingTimeline timeline;

  double now() const { return seconds_between(start, Clock::now()); }
  void record(Clock::time_point step_start, double stall) {
    const auto end = Clock::now();
    timeline.step_end_seconds.push_back(seconds_between(start, end));
    timeline.step_seconds.push_back(seconds_between(step_start, end));
    timeline.stall_seconds.push_back(stall);
    stats.steps += 1;
    stats.stall_seconds_total += stall;
    stats.stall_seconds_max = std::max(stats.stall_seconds_max, stall);
  }
  void finish() {
    std::vector<double> sorted = timeline.step_seconds;
    std::sort(sorted.begin(), sorted.end());
    auto rank = [&](double q) { return sorted[std::min(sorted.size() - 1, size_t(std::ceil(q * double(sorted.size()))) - 1)]; };
    if (sorted.empty()) return;
    stats.step_seconds_p50 = rank(0.50);
    stats.step_seconds_p99 = rank(0.99);
  }
};

// The rest of a step after the eplb calls: reads, pad to step_ms, meet the
// other ranks. Returns whether every rank said it is done.
Result<bool> finish_step(ProcessGroup& serving, ServingReader& reader, int64_t step, const Placement& mapping,
                         Clock::time_point step_start, bool done_here, const RunOptions& options,
                         ServingStats& stats) {
  reader.read_step(step, mapping, stats);
  std::this_thread::sleep_until(step_start + std::chrono::duration<double, std::milli>(options.serving.step_ms));
  auto gathered =
      serving.allgather(done_here ? "1" : "0", Deadline::after_seconds(serving_wait_seconds(options, reader.store())));
  if (!gathered) return gathered.status().with_context(fmt::format("serving step {}", step));
  bool all_done = true;
  for (size_t r = 0; r < gathered->size(); ++r) {
    const std::string& flag = (*gathered)[r];
    if (flag != "0" && flag != "1")
      return error(Code::Mismatch, fmt::format("serving step {}: rank {} sent a malformed step message ({} bytes)",
                                               step, r, flag.size()));
    all_done = all_done && flag == "1";
  }
  return all_done;
}

// The eplb calls of a step (the stall): commit_ready, poll, done.
bool eplb_calls(AsyncMigration& async, int64_t step, StepRecorder& recorder, double* stall) {
  const auto before = Clock::now();
  auto committed = async.commit_ready(step);
  (void)async.poll();  // a failure is also in commit_ready's answer and in the report
  const bool done = async.done();
  *stall = seconds_between(before, Clock::now());
  if (committed)
    for (int layer : *committed) recorder.timeline.commits.push_back({layer, step, recorder.now()});
  return done;
}

// The serving group failed: ask the round to stop and keep committing what
// every rank already agreed on, step by step, until the round is done. The
// progress thread needs at most a layer's transfers and a vote (the
// transfer deadline + 10 s, the collective deadline) to see the abort.
void drain(AsyncMigration& async, int64_t step, StepRecorder& recorder, const ServingReader& reader,
           const RunOptions& options) {
  async.abort();
  const double transfer = transfer_deadline_seconds(options, reader.store());
  const Deadline deadline = Deadline::after_seconds(2 * transfer + 10.0 + kServingWaitMargin);
  while (!async.done() && !deadline.expired()) {
    double stall = 0;
    const auto start = Clock::now();
    eplb_calls(async, ++step, recorder, &stall);
    std::this_thread::sleep_until(start + std::chrono::duration<double, std::milli>(std::max(1.0, options.serving.step_ms)));
  }
}

// The round's status: the migration's, which names the layer and the rank
// (the sync path's message); the serving loop's when only it failed; when
// this rank's serving loop failed and the round was aborted, both (an abort
// alone would not say why).
Status round_status(const Status& migration, const Status& serving) {
  if (serving.is_ok()) return migration;
  if (migration.is_ok()) return serving;
  if (migration.code() != Code::Aborted) return migration;
  return Status(Code::Aborted, migration.message() + "; this rank's serving loop: " + serving.to_string());
}

}  // namespace

Status check_serving_options(const RunOptions& options) {
  const ServingOptions& serving = options.serving;
  if (serving.commit != "copy" && serving.commit != "swap")
    return error(Code::InvalidArgument, fmt::format("--commit must be copy or swap, got '{}'", serving.commit));
  if (!(serving.step_ms >= 0 && serving.step_ms <= 10000))
    return error(Code::InvalidArgument, fmt::format("--step-ms must be in [0, 10000], got {}", serving.step_ms));
  if (!(serving.slot_share > 0 && serving.slot_share <= 1))
    return error(Code::InvalidArgument, fmt::format("--serve-share must be in (0, 1], got {}", serving.slot_share));
  if (serving.idle_steps < 1 || serving.idle_steps > 100000)
    return error(Code::InvalidArgument, fmt::format("idle steps must be in [1, 100000], got {}", serving.idle_steps));
  return Status::ok();
}

ServingReader::ServingReader(const ExpertStore& store, const ServingOptions& options)
    : store_(store),
      slots_per_step_(std::clamp(int(std::ceil(options.slot_share * store.slots_per_rank())), 1,
                                 std::max(1, store.slots_per_rank()))) {}

uint64_t ServingReader::expected(int layer, int expert, int tensor) {
  const auto key = std::make_tuple(layer, expert, tensor);
  if (auto found = hashes_.find(key); found != hashes_.end()) return found->second;
  scratch_.resize(store_.row_bytes(layer, tensor));
  if (expert < 0) std::memset(scratch_.data(), 0, scratch_.size());
  else fill_expert_bytes(layer, expert, tensor, 0, scratch_);
  const uint64_t hash = XXH3_64bits(scratch_.data(), scratch_.size());
  hashes_.emplace(key, hash);
  return hash;
}

void ServingReader::expect(const Placement& placement) {
  const StoreLayout& layout = store_.layout();
  for (int l = 0; l < layout.num_layers(); ++l)
    for (int s = 0; s < store_.slots_per_rank(); ++s)
      for (int t = 0; t < int(layout.layers[l].size()); ++t)
        expected(l, placement.phy2log(l, store_.first_slot() + s), t);
}

void ServingReader::read_step(int64_t step, const Placement& mapping, ServingStats& stats) {
  const StoreLayout& layout = store_.layout();
  const int slots = store_.slots_per_rank();
  for (int l = 0; l < layout.num_layers(); ++l)
    for (int i = 0; i < slots_per_step_; ++i) {
      const int s = int((step * slots_per_step_ + i) % slots), slot = store_.first_slot() + s;
      const int expert = mapping.phy2log(l, slot);
      for (int t = 0; t < int(layout.layers[l].size()); ++t) {
        const uint64_t live = XXH3_64bits(store_.row(l, s, t), store_.row_bytes(l, t));
        if (live == expected(l, expert, t)) continue;
        if (stats.inconsistent_reads++ == 0)
          stats.first_inconsistency = fmt::format("serving step {}: layer {} slot {} should hold expert {} (the "
                                                  "mapping in force) but tensor '{}' holds other bytes",
                                                  step, l, slot, expert, layout.layers[l][t].name);
      }
    }
}

Result<ServingStats> serve_idle(ProcessGroup& serving, ServingReader& reader, const Placement& current,
                                const RunOptions& options) {
  StepRecorder recorder;
  reader.expect(current);
  for (int64_t step = 0; step < options.serving.idle_steps; ++step) {
    const auto start = Clock::now();
    auto all_done = finish_step(serving, reader, step, current, start, step + 1 == options.serving.idle_steps,
                                options, recorder.stats);
    if (!all_done) return all_done.status().with_context("idle serving");
    recorder.record(start, 0);
  }
  recorder.finish();
  return recorder.stats;
}

ServedRound serve_async_round(Migrator& migrator, ProcessGroup& serving, ServingReader& reader, Placement& current,
                              const Placement& target, const RunOptions& options) {
  ServedRound served;
  reader.expect(target);
  StepRecorder recorder;
  auto started = migrator.start(current, target, 2);
  if (!started) {
    served.report.status = started.status();
    return served;
  }
  AsyncMigration& async = **started;
  int64_t step = 0;
  for (;; ++step) {
    const auto start = Clock::now();
    double stall = 0;
    const bool done_here = eplb_calls(async, step, recorder, &stall);
    auto all_done = finish_step(serving, reader, step, current, start, done_here, options, recorder.stats);
    recorder.record(start, stall);
    if (!all_done) served.serving_status = all_done.status();
    if (!all_done || *all_done) break;
  }
  if (!served.serving_status.is_ok()) drain(async, step, recorder, reader, options);
  served.report = async.report();
  if (!async.done())
    served.report.status = error(Code::Timeout, "the async migration did not finish after the serving group failed");
  served.report.status = round_status(served.report.status, served.serving_status);
  recorder.finish();
  served.stats = recorder.stats;
  served.timeline = std::move(recorder.timeline);
  return served;
}

}  // namespace eplb
