// Migrator::exchange: a layer's transfers as an engine gives them (vLLM's
// communicator), through the same protocol as a round, ranks as threads
// over the loopback backend. The received rows must land verified in the
// staging rows; a bad call or unpaired sends and receives must stop every
// rank before anything moves; corruption is retried.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "eplb/bootstrap.h"
#include "eplb/migrate.h"
#include "expert_content.h"

namespace eplb {
namespace {

std::atomic<int> exchange_counter{0};
constexpr int kSlots = 4;  // per rank
const Topology kTopology{2, 8, 2 * kSlots, 1, 1, 2};

struct RankRun {
  std::vector<RoundReport> reports;
  Status setup;
  Status staged;  // the received rows in staging hold their experts' content
};

// Rank r's receives and sends of layer `layer`: rank 1 receives the rows of
// rank 0's slots 0 and 2 into its staging rows 1 and 3 (and rank 0 the row
// of rank 1's slot 5 into its staging row 0), unless `edit` changes them.
using Edit = std::function<void(int rank, LayerExchange&)>;
LayerExchange exchange_of(int rank, int layer, const Edit& edit) {
  LayerExchange exchange;
  exchange.layer = layer;
  const RowBuffer primary = RowBuffer::Primary;
  if (rank == 0) {
    exchange.sends = {{1, {layer, 0, primary}, kSlots + 1, 0}, {1, {layer, 2, primary}, kSlots + 3, 2}};
    exchange.receives = {{1, kSlots + 1, primary, {layer, 0, RowBuffer::Staging}, 5}};
  } else {
    exchange.sends = {{0, {layer, 1, primary}, 0, 5}};
    exchange.receives = {{0, 0, primary, {layer, 1, RowBuffer::Staging}, 0},
                         {0, 2, primary, {layer, 3, RowBuffer::Staging}, 2}};
  }
  if (edit) edit(rank, exchange);
  return exchange;
}

Status check_staged(const ExpertStore& store, const LayerExchange& exchange) {
  for (const RowReceive& receive : exchange.receives)
    for (int t = 0; t < int(store.layout().layers[0].size()); ++t) {
      const uint8_t* row = store.staging_row(exchange.layer, receive.to.local_slot, t);
      for (uint64_t i = 0; i < store.row_bytes(exchange.layer, t); ++i)
        if (row[i] != testing::content_byte(exchange.layer, receive.expert, t, i))
          return error(Code::Mismatch, "staging row " + std::to_string(receive.to.local_slot) + " differs");
    }
  return Status::ok();
}

std::vector<RankRun> run_exchanges(const std::string& fault_spec, const Edit& edit, int layers_to_run = 2,
                                   MigrateOptions options = {}) {
  auto groups = make_thread_groups(2);
  std::vector<RankRun> runs(2);
  StoreLayout layout = StoreLayout::uniform(kTopology.num_layers, kSlots, testing::three_tensors(4096));
  std::vector<std::thread> threads;
  const std::string prefix = "exchange-" + std::to_string(exchange_counter++) + "-";
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      xfer::AgentConfig config;
      config.name = prefix + std::to_string(r);
      config.backend = "loopback";
      config.fault_spec = fault_spec;
      auto agent = xfer::Agent::create(config);
      auto store = ExpertStore::create_arena(layout, r * kSlots);
      testing::fill_rows(**store, default_placement(kTopology));
      auto migrator = Migrator::create(*groups[size_t(r)], **agent, **store, kTopology, options,
                                       Deadline::after_seconds(20));
      runs[size_t(r)].setup = migrator.status();
      if (!migrator) return;
      for (int layer = 0; layer < layers_to_run; ++layer) {
        LayerExchange exchange = exchange_of(r, layer, edit);
        runs[size_t(r)].reports.push_back((*migrator)->exchange(exchange));
        if (!runs[size_t(r)].reports.back().status.is_ok()) return;
        if (Status staged = check_staged(**store, exchange); !staged) runs[size_t(r)].staged = staged;
      }
    });
  for (auto& thread : threads) thread.join();
  return runs;
}

TEST(Exchange, GivenTransfersLandVerifiedInStaging) {
  auto runs = run_exchanges("", {});
  for (const RankRun& run : runs) {
    ASSERT_TRUE(run.setup) << run.setup.to_string();
    ASSERT_EQ(run.reports.size(), 2u);
    for (const RoundReport& report : run.reports) {
      EXPECT_TRUE(report.status) << report.status.to_string();
      ASSERT_EQ(report.layers.size(), 1u);
      EXPECT_TRUE(report.layers[0].committed);
      EXPECT_EQ(report.layers[0].plane, "ucx");
    }
    EXPECT_TRUE(run.staged) << run.staged.to_string();
  }
}

TEST(Exchange, CorruptionIsCaughtAndRetried) {
  MigrateOptions options;
  options.retries = 8;
  auto runs = run_exchanges("corrupt=0.5,seed=7", {}, 2, options);
  int retries = 0;
  for (const RankRun& run : runs) {
    ASSERT_EQ(run.reports.size(), 2u);
    for (const RoundReport& report : run.reports) {
      EXPECT_TRUE(report.status) << report.status.to_string();
      retries += report.retries();
    }
    EXPECT_TRUE(run.staged) << run.staged.to_string();
  }
  EXPECT_GT(retries, 0);
}

TEST(Exchange, ABadCallOnOneRankStopsEveryRankBeforeAnythingMoves) {
  auto runs = run_exchanges("", [](int rank, LayerExchange& exchange) {
    if (rank == 0) exchange.local_error = "add_send(expert 7, dst_rank 1): rank 0 does not hold expert 7";
  }, 1);
  for (const RankRun& run : runs) {
    ASSERT_EQ(run.reports.size(), 1u);
    const Status& status = run.reports[0].status;
    ASSERT_FALSE(status);
    EXPECT_NE(status.message().find("rank 0: add_send(expert 7, dst_rank 1)"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("Nothing was transferred"), std::string::npos);
    EXPECT_EQ(status.peer(), 0);
    EXPECT_TRUE(run.reports[0].layers.empty());
  }
}

TEST(Exchange, UnpairedSendsAndReceivesAreNamedBeforeAnythingMoves) {
  auto runs = run_exchanges("", [](int rank, LayerExchange& exchange) {
    if (rank == 0) exchange.sends.pop_back();  // rank 1 still expects expert 2
  }, 1);
  for (const RankRun& run : runs) {
    const Status& status = run.reports[0].status;
    ASSERT_FALSE(status);
    EXPECT_EQ(status.code(), Code::Mismatch);
    EXPECT_NE(status.message().find("rank 1 expects expert 2 from rank 0"), std::string::npos) << status.message();
  }
}

TEST(Exchange, NothingQueuedAnywhereEndsAfterOneCollective) {
  auto runs = run_exchanges("", [](int, LayerExchange& exchange) {
    exchange.sends.clear();
    exchange.receives.clear();
  }, 2);
  for (const RankRun& run : runs) {
    ASSERT_EQ(run.reports.size(), 2u);
    for (const RoundReport& report : run.reports) {
      EXPECT_TRUE(report.status) << report.status.to_string();
      EXPECT_TRUE(report.layers.empty());
    }
  }
}

}  // namespace
}  // namespace eplb
