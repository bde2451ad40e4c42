// eplb/migrate_async.h - a migration round overlapped with serving.
//
// Contract:
// - Migrator::start(current, target) starts a round on a background thread
//   (the progress thread) and returns at once. That thread plans, publishes
//   checksums, transfers, verifies and votes layer by layer exactly like
//   Migrator::migrate; it never writes a live row nor `current`.
// - The serving thread calls commit_ready(step) once before each serving
//   step, steps numbered alike on every rank (expert-parallel steps run in
//   lockstep). Each layer's vote has two phases: yes/no of every rank, then
//   (unanimous yes only) every rank's current step S_r, which fixes the
//   commit step C = max_r S_r + lead_steps; every rank commits layer l (and
//   switches its mapping) in the commit_ready call of step C, so all ranks
//   change layer l at the same serving step. A rank reaching step
//   S_r + lead_steps before the second phase's result is known waits for it
//   inside commit_ready (bounded by the collective deadline); the second
//   phase starts when every rank has voted, so that wait is one allgather,
//   not a slower rank's transfers.
// - The fence of the sync path holds: live rows change only in a commit,
//   after a unanimous vote that every rank casts once its own reads landed.
// - Failures (transfer, checksum, lost rank, deadline) surface at the next
//   poll()/commit_ready() as the sync path's named errors; committed layers
//   stay new, the others old, on every rank.
// - abort() asks the round to stop at the next vote (every rank stops there:
//   the vote carries the request); keep calling commit_ready() until done().
// - Commit mode (MigrateOptions::commit): copy (staging -> live rows, in
//   the serving thread) or swap (the rows were written into the layer's
//   spare buffer in the background; the commit swaps live and spare, O(1)).
//   At most one layer is prepared at a time, so commit_ready commits at
//   most one layer per call.
// - Nothing here prints, writes files or throws; `current` must outlive the
//   AsyncMigration and be read only by the serving thread while it runs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "eplb/migrate.h"

namespace eplb {

class AsyncMigration {
 public:
  ~AsyncMigration();  // asks to abort and joins the progress thread
  AsyncMigration(const AsyncMigration&) = delete;
  AsyncMigration& operator=(const AsyncMigration&) = delete;

  // The round's failure, if it failed (Ok while running or when done well).
  Status poll() const;
  // A layer has voted yes and waits for its commit step.
  bool ready() const;
  // Call once per serving step, before the step, with the step's number
  // (consecutive). Commits the layer whose commit step is `step` (at most
  // max_layers, >= 1) and returns the layers committed in this call; a
  // failure of the round is returned here (and by poll()).
  Result<std::vector<int>> commit_ready(int64_t step, int max_layers = 1);
  // The progress thread has finished (committed, failed or aborted).
  bool done() const;
  void abort();
  // The round's report; complete once done().
  RoundReport report() const;

  struct Impl;
  explicit AsyncMigration(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace eplb
