// layer_run.h (internal) - LayerRun: one layer of the protocol on one
// rank (layer_run.cpp): attempts through the data plane (layer_attempt.cpp),
// each closed by the vote (vote.cpp), then commit or retry, abort after the
// last retry; used by Migrator rounds (layer_round.cpp) and exchanges
// (layer_exchange.cpp). And the small rules they share.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "migrator_state.h"

namespace eplb::migrate {

// "3,7,12" or "none".
std::string layer_list(const std::vector<int>& layers);
// The code of the first "no" in a vote's reasons; Aborted when none names one.
Code first_code(const std::vector<std::string>& reasons);
// The layer's deadlines (derive_deadlines) from the largest read of any rank.
Deadlines layer_deadlines(const Migrator::State& state, const MigrateOptions& options, const LayerPlan& plan);
// Whether a layer moves any row (otherwise only its replica order may change).
bool moves_rows(const LayerPlan& plan);

// One layer on this rank: its attempts, each closed by a vote, then the
// commit (a Migrator round, from the layer's plan), or none (an exchange of
// given transfers: Migrator::exchange; the engine writes its rows).
class LayerRun {
 public:
  LayerRun(Migrator::State& state, const MigrateOptions& options, int layer, const std::vector<int>& committed,
           StepGate* gate)
      : state_(state), options_(options), layer_(layer), committed_(committed), gate_(gate) {
    report_.layer = layer;
  }
  // Ok when the layer committed or had nothing to move; otherwise the
  // Status that stops the round. `published`: this layer's share of the
  // round's checksum allgather (round_checksums), unused when the layer
  // does not change.
  Status run(const Result<LayerPlan>& planned, const PublishedSums& published, Placement& current,
             const Placement& target);
  // Exchange mode: `given` (this rank's receives and sends), published by
  // every rank in `published`; Ok once every rank voted its rows verified.
  // `largest_read`: the most bytes any rank receives (for the deadlines).
  Status run_exchange(const LayerTransfers& given, const PublishedSums& published, uint64_t largest_read);
  LayerReport& report() { return report_; }
  const std::string& operation() const { return operation_; }

 private:
  void record_plan(const LayerPlan& plan);
  // `plan` null: exchange mode (`given`, no commit).
  Status attempt(const LayerPlan* plan, const LayerTransfers* given, const PublishedSums& published,
                 Placement* current, const Placement* target, int number, bool* committed);
  Status transfer_phase(const LayerPlan* plan, const LayerTransfers* given, const PublishedSums& published,
                        int number, Status outcome);
  Status attempts(const LayerPlan* plan, const LayerTransfers* given, const PublishedSums& published,
                  Placement* current, const Placement* target);
  Status lost(const Status& failure, const std::string& during);
  Status stop_reason() const;
  Result<Ballots> cast_vote(const Status& outcome, bool stop);
  Status commit(std::function<Status()> switch_layer, int64_t step);
  std::function<Status()> switch_layer(const LayerPlan& plan, Placement& current, const Placement& target);

  Migrator::State& state_;
  const MigrateOptions& options_;
  const int layer_;
  const std::vector<int>& committed_;
  StepGate* const gate_;  // async rounds only
  int64_t commit_step_ = -1;
  bool swap_ = false;  // this rank commits this layer by swapping buffers
  LayerReport report_;
  double transfer_seconds_ = 0;
  double collective_seconds_ = 0;
  double serving_wait_seconds_ = 0;
  std::string last_failure_;
  int no_voter_ = -1;      // the first rank (another than this one, if any) that voted no
  std::string operation_;  // what this rank was doing when the layer stopped the round
  std::vector<std::optional<uint64_t>> staged_sums_;
  std::shared_ptr<double> commit_seconds_ = std::make_shared<double>(0.0);
};

}  // namespace eplb::migrate
