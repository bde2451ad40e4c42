// Migration of engine-owned tensors: eplb.Migrator's engine. The Python
// layer (eplb/migrator.py) has checked the tensors (CPU, contiguous, same
// layout on every rank) and passes their addresses; this file adopts them
// in an ExpertStore, sets up the C++ Migrator (collective) and runs rounds
// with the GIL released. The group's Python collectives and the per-layer
// callback take the GIL back when they run.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "convert.h"
#include "eplb/migrate.h"
#include "eplb/migrate_async.h"
#include "group.h"

namespace eplb::python {
namespace {

py::tuple status_tuple(const Status& status) {
  return py::make_tuple(std::string(code_name(status.code())), status.message());
}

// One adopted tensor of one layer: its rows and whether the agent allocated
// them, and for the swap commit its spare buffer (0: none) likewise.
struct TensorArgument {
  std::string name;
  uintptr_t address = 0;
  uint64_t bytes_per_expert = 0;
  bool allocated_by_agent = false;
  uintptr_t spare_address = 0;
  bool spare_allocated_by_agent = false;
};

py::dict layer_dict(const LayerReport& layer) {
  py::dict item;
  item["layer"] = layer.layer;
  item["bytes_kept"] = layer.bytes_kept;
  item["bytes_local"] = layer.bytes_local;
  item["bytes_intra_node"] = layer.bytes_intra_node;
  item["bytes_inter_node"] = layer.bytes_inter_node;
  item["bytes_read_here"] = layer.bytes_read_here;
  item["seconds"] = layer.seconds;
  item["retries"] = layer.retries;
  item["changed"] = layer.changed;
  item["committed"] = layer.committed;
  item["failure"] = layer.failure;
  item["failure_code"] = layer.failure.empty() ? std::string() : std::string(code_name(layer.failure_code));
  item["seconds_transfer"] = layer.seconds_transfer;
  item["seconds_commit"] = layer.seconds_commit;
  return item;
}

// (code, message, layers, seconds, retries, stopped_alone, the on_layer
// callback's exception or None).
py::tuple report_tuple(const RoundReport& report, py::object callback_error) {
  py::list layers;
  for (const auto& layer : report.layers) layers.append(layer_dict(layer));
  return py::make_tuple(std::string(code_name(report.status.code())), report.status.message(), layers,
                        report.seconds, report.retries(), report.stopped_alone, std::move(callback_error));
}

class AsyncRound;

class Migration {
 public:
  Migration(std::shared_ptr<ProcessGroup> group, std::shared_ptr<AgentHandle> agent,
            const std::vector<std::vector<TensorArgument>>& layers, int slots_per_rank, int num_nodes,
            double timeout_seconds, int retries, py::object on_layer, const std::string& commit)
      : group_(std::move(group)), agent_(std::move(agent)), on_layer_(std::move(on_layer)), timeout_(timeout_seconds) {
    if (commit != "copy" && commit != "swap")
      throw_if_error(error(Code::InvalidArgument, "commit must be 'copy' or 'swap', got '" + commit + "'"));
    options_.commit = commit == "swap" ? CommitMode::Swap : CommitMode::Copy;
    adopt_tensors(layers, slots_per_rank);
    const int ranks = group_->size();
    topology_ = Topology{store_->layout().num_layers(), 1, slots_per_rank * ranks, 1, num_nodes, ranks};
    throw_if_error(topology_.validate());
    // A collective waits for the slowest rank's transfers (up to the
    // timeout) plus its own time (up to the timeout again).
    options_.timeout_seconds = timeout_seconds;
    options_.collective_timeout_seconds = 2 * timeout_seconds;
    options_.retries = retries;
    options_.on_layer_done = [this](const LayerReport& layer) { call_on_layer(layer); };
    UseOfAgent use(*agent_);
    auto created = [&] {
      py::gil_scoped_release release;
      return Migrator::create(*group_, agent_->agent(), *store_, topology_, options_,
                              Deadline::after_seconds(timeout_seconds));
    }();
    migrator_ = value_or_throw(std::move(created));
  }

  // Which buffer of each layer is live (0: the engine's tensors, 1: their spares).
  std::vector<int> live_buffers() const {
    std::vector<int> live;
    for (int l = 0; l < store_->layout().num_layers(); ++l) live.push_back(store_->live_buffer(l));
    return live;
  }

  ~Migration() {
    py::gil_scoped_release release;  // the group's destructor takes it back
    migrator_.reset();
    store_.reset();
  }

  // One round; returns (status code name, message, per-layer dicts, seconds, retries).
  py::tuple migrate(const IndexArray& old_phy2log, const IndexArray& new_phy2log, int64_t num_experts) {
    Placement current = placement_from_array(old_phy2log, num_experts, "old_phy2log");
    Placement target = placement_from_array(new_phy2log, num_experts, "new_phy2log");
    throw_if_error(migrator_->set_num_experts(int(num_experts)));  // <= kMaxExpertsPerLayer, checked above
    RoundReport report;
    {
      UseOfAgent use(*agent_);
      py::gil_scoped_release release;
      report = migrator_->migrate(current, target);
    }
    return report_tuple(report, take_callback_failure());
  }

  // Drops the remembered checksums of `layers` (every layer when empty): the
  // engine wrote those rows itself, so their sources are hashed again when
  // next read. Out-of-range layers are refused.
  void forget_checksums(const std::vector<int>& layers) {
    if (layers.empty()) return store_->forget_checksums();
    for (int layer : layers)
      if (layer < 0 || layer >= store_->layout().num_layers())
        throw_if_error(error(Code::InvalidArgument, "forget_checksums: layer " + std::to_string(layer) +
                                                        " is outside [0, " +
                                                        std::to_string(store_->layout().num_layers()) + ")"));
    for (int layer : layers) store_->forget_checksums(layer);
  }

  // Collective: starts an async round (eplb/migrate_async.h); the returned
  // round keeps this Migration alive (keep_alive in the binding).
  std::unique_ptr<AsyncRound> start(const IndexArray& old_phy2log, const IndexArray& new_phy2log,
                                          int64_t num_experts, int lead_steps);

  // Collective: do all ranks hold the same mapping after a round?
  py::tuple agree(const IndexArray& phy2log, int64_t num_experts, double seconds, const std::string& check_failure) {
    Placement placement = placement_from_array(phy2log, num_experts, "phy2log");
    RankOutcome mine{seconds, mapping_hash(placement), check_failure};
    Result<RoundAgreement> agreement = [&] {
      py::gil_scoped_release release;
      return agree_on_round(*group_, mine, Deadline::after_seconds(timeout_));
    }();
    RoundAgreement agreed = value_or_throw(std::move(agreement));
    return py::make_tuple(agreed.agreed, agreed.failure, agreed.slowest_seconds);
  }

 private:
  friend class AsyncRound;
  struct UseOfAgent {
    explicit UseOfAgent(AgentHandle& handle) : handle(handle) { handle.begin_use(); }
    ~UseOfAgent() { handle.end_use(); }
    AgentHandle& handle;
  };

  // The store over the engine's tensors (and their spares, for the swap commit).
  void adopt_tensors(const std::vector<std::vector<TensorArgument>>& layers, int slots_per_rank) {
    StoreLayout layout;
    layout.slots_per_rank = slots_per_rank;
    std::vector<std::vector<TensorMemory>> memory, spare;
    const bool swap = options_.commit == CommitMode::Swap;
    for (const auto& layer : layers) {
      layout.layers.emplace_back();
      memory.emplace_back();
      if (swap) spare.emplace_back();
      for (const auto& tensor : layer) {
        layout.layers.back().push_back({tensor.name, tensor.bytes_per_expert});
        memory.back().push_back({reinterpret_cast<uint8_t*>(tensor.address), 0, tensor.allocated_by_agent});
        if (swap)
          spare.back().push_back(
              {reinterpret_cast<uint8_t*>(tensor.spare_address), 0, tensor.spare_allocated_by_agent});
      }
    }
    store_ = value_or_throw(
        ExpertStore::adopt(layout, group_->rank() * slots_per_rank, std::move(memory), std::move(spare)));
  }

  // A callback that raises stops the round at this rank's next vote (every
  // rank stops there, naming it); its exception is handed to Python with
  // the round's report.
  void call_on_layer(const LayerReport& layer) {
    if (on_layer_.is_none()) return;
    py::gil_scoped_acquire gil;
    try {
      on_layer_(layer_dict(layer));
    } catch (py::error_already_set& failure) {
      if (callback_failure_) return;
      const std::string what = py::str(failure.value()).cast<std::string>();
      const std::string type = py::str(failure.type().attr("__name__")).cast<std::string>();
      migrator_->stop_at_next_vote(error(Code::Aborted, "rank " + std::to_string(group_->rank()) +
                                                            "'s on_layer callback raised " + type + ": " + what +
                                                            " (after layer " + std::to_string(layer.layer) + ")"));
      callback_failure_.emplace(std::move(failure));
    }
  }
  py::object take_callback_failure() {
    if (!callback_failure_) return py::none();
    py::object value = callback_failure_->value();
    callback_failure_.reset();
    return value;
  }

  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<AgentHandle> agent_;
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<Migrator> migrator_;
  Topology topology_;
  MigrateOptions options_;
  py::object on_layer_;
  double timeout_;
  std::optional<py::error_already_set> callback_failure_;
};

// An async round of a Migration: the placement the progress thread switches
// layer by layer (owned here, so that it outlives the round), the agent
// marked busy until the round is closed, and every call that may wait made
// with the GIL released (the progress thread takes it for the group's
// Python collectives and the per-layer callback).
class AsyncRound {
 public:
  AsyncRound(Migration& migration, Placement current, const Placement& target, int lead_steps)
      : migration_(migration), current_(std::make_unique<Placement>(std::move(current))),
        use_(std::make_unique<Migration::UseOfAgent>(*migration.agent_)) {
    auto started = migration_.migrator_->start(*current_, target, lead_steps);
    round_ = value_or_throw(std::move(started));
  }
  ~AsyncRound() { close(); }

  // (code, message, committed layers) of the call for serving step `step`.
  py::tuple commit_ready(int64_t step, int max_layers) {
    Result<std::vector<int>> committed = [&] {
      py::gil_scoped_release release;
      return live().commit_ready(step, max_layers);
    }();
    if (!committed) return py::make_tuple(std::string(code_name(committed.status().code())),
                                          committed.status().message(), py::list());
    return py::make_tuple(std::string("ok"), std::string(), py::cast(*committed));
  }
  py::tuple poll() { return status_tuple(live().poll()); }
  bool ready() { return round_ && round_->ready(); }
  bool done() { return !round_ || round_->done(); }
  void abort() { live().abort(); }
  // Joins the progress thread and returns the report as Migration::migrate
  // does. Complete once done(); before that the round is closed (its
  // pending commit refused, so the caller drains it first: eplb/async_migration.py).
  py::tuple close() {
    if (round_) {
      std::unique_ptr<AsyncMigration> round = std::move(round_);
      py::gil_scoped_release release;
      report_ = round->report();
      round.reset();
      use_.reset();
    }
    return report_tuple(report_, migration_.take_callback_failure());
  }

 private:
  AsyncMigration& live() {
    if (!round_) throw_if_error(error(Code::NotAllowed, "this async migration was closed"));
    return *round_;
  }
  Migration& migration_;
  std::unique_ptr<Placement> current_;
  std::unique_ptr<Migration::UseOfAgent> use_;
  std::unique_ptr<AsyncMigration> round_;
  RoundReport report_;
};

std::unique_ptr<AsyncRound> Migration::start(const IndexArray& old_phy2log, const IndexArray& new_phy2log,
                                             int64_t num_experts, int lead_steps) {
  Placement current = placement_from_array(old_phy2log, num_experts, "old_phy2log");
  Placement target = placement_from_array(new_phy2log, num_experts, "new_phy2log");
  throw_if_error(migrator_->set_num_experts(int(num_experts)));  // <= kMaxExpertsPerLayer, checked above
  return std::make_unique<AsyncRound>(*this, std::move(current), target, lead_steps);
}

}  // namespace

void bind_migrate(py::module_& module) {
  py::class_<TensorArgument>(module, "TensorArgument")
      .def(py::init([](std::string name, uintptr_t address, uint64_t bytes_per_expert, bool allocated_by_agent,
                       uintptr_t spare_address, bool spare_allocated_by_agent) {
             return TensorArgument{std::move(name), address, bytes_per_expert, allocated_by_agent, spare_address,
                                   spare_allocated_by_agent};
           }),
           py::arg("name"), py::arg("address"), py::arg("bytes_per_expert"), py::arg("allocated_by_agent"),
           py::arg("spare_address") = 0, py::arg("spare_allocated_by_agent") = false);
  py::class_<Migration>(module, "Migration")
      .def(py::init<std::shared_ptr<ProcessGroup>, std::shared_ptr<AgentHandle>,
                    const std::vector<std::vector<TensorArgument>>&, int, int, double, int, py::object,
                    const std::string&>(),
           py::arg("group"), py::arg("agent"), py::arg("layers"), py::arg("slots_per_rank"), py::arg("num_nodes"),
           py::arg("timeout"), py::arg("retries"), py::arg("on_layer"), py::arg("commit") = "copy")
      .def("live_buffers", &Migration::live_buffers)
      .def("migrate", &Migration::migrate, py::arg("old_phy2log"), py::arg("new_phy2log"), py::arg("num_experts"))
      .def("start", &Migration::start, py::keep_alive<0, 1>(), py::arg("old_phy2log"), py::arg("new_phy2log"),
           py::arg("num_experts"), py::arg("lead_steps"))
      .def("forget_checksums", &Migration::forget_checksums, py::arg("layers"))
      .def("agree", &Migration::agree, py::arg("phy2log"), py::arg("num_experts"), py::arg("seconds"),
           py::arg("check_failure"));
  py::class_<AsyncRound>(module, "AsyncRound")
      .def("commit_ready", &AsyncRound::commit_ready, py::arg("step"), py::arg("max_layers"))
      .def("poll", &AsyncRound::poll)
      .def("ready", &AsyncRound::ready)
      .def("done", &AsyncRound::done)
      .def("abort", &AsyncRound::abort)
      .def("close", &AsyncRound::close);
}

}  // namespace eplb::python
