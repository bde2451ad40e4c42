// async_migration.cpp - Migrator::start and AsyncMigration: the round of
// layer_round.cpp on a progress thread, its commits handed to the serving
// thread through a StepGate (step_gate.cpp).
#include "eplb/migrate_async.h"

#include <fmt/format.h>

#include <sched.h>

#include <thread>

#include "migrator_state.h"

namespace eplb {

struct AsyncMigration::Impl {
  explicit Impl(int lead_steps, Placement target_placement) : gate(lead_steps), target(std::move(target_placement)) {}
  migrate::StepGate gate;
  Placement target;
  mutable std::mutex report_mutex;
  RoundReport report;
  std::thread progress;
};

AsyncMigration::AsyncMigration(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AsyncMigration::~AsyncMigration() {
  impl_->gate.close();
  if (impl_->progress.joinable()) impl_->progress.join();
}

Status AsyncMigration::poll() const { return impl_->gate.failure(); }
bool AsyncMigration::ready() const { return impl_->gate.ready(); }
bool AsyncMigration::done() const { return impl_->gate.done(); }
void AsyncMigration::abort() { impl_->gate.request_abort(); }

Result<std::vector<int>> AsyncMigration::commit_ready(int64_t step, int max_layers) {
  return impl_->gate.commit_ready(step, max_layers);
}

RoundReport AsyncMigration::report() const {
  std::lock_guard lock(impl_->report_mutex);
  return impl_->report;
}

namespace {

// The progress thread as batch work: a thread woken by the serving thread
// (commit_at's notify) would otherwise preempt it at once on a busy core,
// and the serving thread would wait inside commit_ready for the progress
// thread's transfers: measured as 2-20 ms of stall per round with 4 ranks
// on 2 cores (docs/async.md). Threads started from here inherit the policy.
void become_batch_thread() {
#ifdef SCHED_BATCH
  sched_param priority{};
  (void)sched_setscheduler(0, SCHED_BATCH, &priority);  // best effort (see MigrateOptions)
#endif
}

}  // namespace

Result<std::unique_ptr<AsyncMigration>> Migrator::start(Placement& current, const Placement& target,
                                                        int lead_steps) {
  if (lead_steps < 1 || lead_steps > 1000)
    return error(Code::InvalidArgument, fmt::format("start: lead_steps {} is outside [1, 1000]", lead_steps));
  auto impl = std::make_unique<AsyncMigration::Impl>(lead_steps, target);
  AsyncMigration::Impl* shared = impl.get();
  State* state = state_.get();
  const MigrateOptions* options = &options_;
  shared->progress = std::thread([shared, state, options, &current] {
    if (options->batch_progress_thread) become_batch_thread();
    RoundReport report = migrate::run_round(*state, *options, current, shared->target, &shared->gate);
    Status status = report.status;
    {
      std::lock_guard lock(shared->report_mutex);
      shared->report = std::move(report);
    }
    shared->gate.finish(status);
  });
  return std::make_unique<AsyncMigration>(std::move(impl));
}

}  // namespace eplb
