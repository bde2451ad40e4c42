// serving_loop.h (internal to src/app) - the emulated serving loop of
// `eplb run --async` (see ServingOptions in eplb/app.h): idle steps, and a
// round migrated by Migrator::start while the ranks serve in lockstep.
#pragma once

#include <map>
#include <tuple>

#include "eplb/app.h"
#include "eplb/migrate_async.h"

namespace eplb {

// Bad values and combinations of the serving options, named.
Status check_serving_options(const RunOptions& options);

// The reads of a serving step: XXH3 of each row of the step's slots against
// the synthetic expert the mapping in force names (hashes computed once per
// (layer, expert, tensor) by expect(), outside the steps).
class ServingReader {
 public:
  ServingReader(const ExpertStore& store, const ServingOptions& options);
  // Makes the expected hashes of every expert `placement` puts on this
  // rank's slots known (call before serving with a mapping).
  void expect(const Placement& placement);
  // Reads the step's share of slots in every layer; counts mismatches.
  void read_step(int64_t step, const Placement& mapping, ServingStats& stats);
  const ExpertStore& store() const { return store_; }

 private:
  uint64_t expected(int layer, int expert, int tensor);
  const ExpertStore& store_;
  int slots_per_step_;
  std::map<std::tuple<int, int, int>, uint64_t> hashes_;
  std::vector<uint8_t> scratch_;
};

// How long a serving step waits for the other ranks before the serving
// group counts as failed: the layer's transfer deadline (--timeout, or the
// automatic one for this store) + 5 s.
double serving_wait_seconds(const RunOptions& options, const ExpertStore& store);

// Steps without migration (serving_idle).
Result<ServingStats> serve_idle(ProcessGroup& serving, ServingReader& reader, const Placement& current,
                                const RunOptions& options);

struct ServedRound {
  RoundReport report;
  ServingStats stats;
  ServingTimeline timeline;
  Status serving_status;  // the serving group failed (a rank lost or stuck); also in report.status
};
// One round migrated in the background while this rank serves; returns once
// every rank's migration is done (or the serving group failed).
ServedRound serve_async_round(Migrator& migrator, ProcessGroup& serving, ServingReader& reader, Placement& current,
                              const Placement& target, const RunOptions& options);

}  // namespace eplb
