// Binds eplb's migration to Python (eplb/migrator.py, async_migration.py,
// communicator.py): _eplb.Migrator over an engine's tensors, moving rows
// through the ucx plane (an eplb agent) or a Python data plane (torch,
// staged, nixl: python_plane.h); _eplb.AsyncMigration (a round overlapped
// with serving); the reports as bound types (RoundReport, LayerReport,
// StepResult) whose fields Python reads as they are; deadlines(). Calls that
// may wait release the GIL; the group's Python collectives, the Python
// plane and the per-layer callback take it back when they run.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "common/bytes.h"
#include "convert.h"
#include "eplb/migrate.h"
#include "eplb/migrate_async.h"
#include "group.h"
#include "python_plane.h"

namespace eplb::python {
namespace {

// One adopted tensor of one layer (or of the staging buffer): its rows,
// whether the agent allocated them, for the swap commit its spare buffer
// (0: none), and what the layout check compares.
struct TensorArgument {
  std::string name;
  uintptr_t address = 0;
  uint64_t bytes_per_expert = 0;
  bool allocated_by_agent = false;
  uintptr_t spare_address = 0;
  bool spare_allocated_by_agent = false;
  std::string dtype;
  std::vector<int64_t> shape;
};

// A round's report and the per-layer callback's exception, if one raised.
struct RoundResult {
  RoundReport report;
  py::object callback_error = py::none();
};

// What one commit_ready() or poll() of an async round says.
struct StepResult {
  Status status;
  std::vector<int> layers;
};

class AsyncRound;

class Migration {
 public:
  Migration(std::shared_ptr<ProcessGroup> group, py::object transfer,
            const std::vector<std::vector<TensorArgument>>& layers, const std::vector<TensorArgument>& staging,
            int slots_per_rank, int num_nodes, double timeout_seconds, int retries, py::object on_layer,
            const std::string& commit, const std::string& transfer_schedule, const std::string& problem);
  ~Migration() {
    py::gil_scoped_release release;  // the group's and the plane's destructors take it back
    migrator_.reset();
    plane_.reset();
    store_.reset();
  }

  std::vector<int> live_buffers() const {
    std::vector<int> live;
    for (int l = 0; l < store_->layout().num_layers(); ++l) live.push_back(store_->live_buffer(l));
    return live;
  }
  RoundResult migrate(const IndexArray& old_phy2log, const IndexArray& new_phy2log, int64_t num_experts);
  RoundResult exchange(int layer, const std::vector<py::tuple>& receives, const std::vector<py::tuple>& sends,
                       const std::string& local_error);
  std::unique_ptr<AsyncRound> start(const IndexArray& old_phy2log, const IndexArray& new_phy2log, int64_t num_experts,
                                    int lead_steps);
  void forget_checksums(const std::vector<int>& layers);
  py::tuple agree(const IndexArray& phy2log, int64_t num_experts, double seconds, const std::string& check_failure);
  std::string plane_name() const { return plane_->name(); }
  const MigrateOptions& options() const { return options_; }
  std::string broken() const { return plane_->broken(); }
  py::object take_callback_failure() {
    if (!callback_failure_) return py::none();
    py::object value = callback_failure_->value();
    callback_failure_.reset();
    return value;
  }

 private:
  friend class AsyncRound;
  // Marks an eplb agent busy while a round uses it (its buffers dropped
  // meanwhile are freed when the round ends); nothing for Python planes.
  struct UseOfAgent {
    explicit UseOfAgent(AgentHandle* handle) : handle(handle) {
      if (handle) handle->begin_use();
    }
    ~UseOfAgent() {
      if (handle) handle->end_use();
    }
    AgentHandle* handle;
  };
  void adopt(const std::vector<std::vector<TensorArgument>>& layers, const std::vector<TensorArgument>& staging,
             int slots_per_rank);
  void call_on_layer(const LayerReport& layer);
  RoundResult result(RoundReport report) { return {std::move(report), take_callback_failure()}; }

  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<AgentHandle> agent_;  // the ucx plane's agent (null with a Python plane)
  py::object python_plane_;
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<DataPlane> plane_;
  std::unique_ptr<Migrator> migrator_;
  Topology topology_;
  MigrateOptions options_;
  py::object on_layer_;
  double timeout_;
  std::optional<py::error_already_set> callback_failure_;
};

Migration::Migration(std::shared_ptr<ProcessGroup> group, py::object transfer,
                     const std::vector<std::vector<TensorArgument>>& layers, const std::vector<TensorArgument>& staging,
                     int slots_per_rank, int num_nodes, double timeout_seconds, int retries, py::object on_layer,
                     const std::string& commit, const std::string& transfer_schedule, const std::string& problem)
    : group_(std::move(group)), on_layer_(std::move(on_layer)), timeout_(timeout_seconds) {
  options_.timeout_seconds = timeout_seconds;  // 0: automatic (derive_deadlines)
  options_.retries = retries;
  options_.commit = commit == "swap" ? CommitMode::Swap : CommitMode::Copy;
  throw_if_error(validate_timeouts(options_));
  const double setup_seconds = derive_deadlines(options_, 0).setup_seconds;
  const Status schedule = set_transfer_schedule(options_, transfer_schedule);
  const std::string reason = !problem.empty() ? problem
                             : schedule       ? ""
                                              : "transfer_schedule: " + schedule.message();
  if (!reason.empty()) {  // every rank fails with this rank's reason
    py::gil_scoped_release release;
    throw_if_error(Migrator::refuse_setup(*group_, reason, Deadline::after_seconds(setup_seconds)));
  }
  if (py::isinstance<AgentHandle>(transfer)) agent_ = transfer.cast<std::shared_ptr<AgentHandle>>();
  else python_plane_ = transfer;
  adopt(layers, staging, slots_per_rank);
  plane_ = agent_ ? make_ucx_plane(agent_->agent(), *store_) : make_python_plane(python_plane_);
  const int ranks = group_->size();
  topology_ = Topology{store_->layout().num_layers(), 1, slots_per_rank * ranks, 1, num_nodes, ranks};
  throw_if_error(topology_.validate());
  options_.on_layer_done = [this](const LayerReport& layer) { call_on_layer(layer); };
  UseOfAgent use(agent_.get());
  auto created = [&] {
    py::gil_scoped_release release;
    return Migrator::create(*group_, *plane_, *store_, topology_, options_, Deadline::after_seconds(setup_seconds));
  }();
  migrator_ = value_or_throw(std::move(created));
}

// The store over the engine's tensors (and their spares for the swap
// commit; staging: the engine's buffer when given, else allocated for the
// ucx plane, none for a Python plane, which keeps its own).
void Migration::adopt(const std::vector<std::vector<TensorArgument>>& layers, const std::vector<TensorArgument>& staging,
                      int slots_per_rank) {
  StoreLayout layout;
  layout.slots_per_rank = slots_per_rank;
  std::vector<std::vector<TensorMemory>> memory, spare;
  const bool swap = options_.commit == CommitMode::Swap;
  for (const auto& layer : layers) {
    layout.layers.emplace_back();
    memory.emplace_back();
    if (swap) spare.emplace_back();
    for (const auto& tensor : layer) {
      layout.layers.back().push_back({tensor.name, tensor.bytes_per_expert, tensor.dtype, tensor.shape});
      memory.back().push_back({reinterpret_cast<uint8_t*>(tensor.address), 0, tensor.allocated_by_agent});
      if (swap)
        spare.back().push_back(
            {reinterpret_cast<uint8_t*>(tensor.spare_address), 0, tensor.spare_allocated_by_agent});
    }
  }
  StoreStaging staging_kind;
  if (!staging.empty()) {
    staging_kind.kind = StoreStaging::Kind::Engine;
    for (const auto& tensor : staging)
      staging_kind.engine.push_back({reinterpret_cast<uint8_t*>(tensor.address), 0, tensor.allocated_by_agent});
  } else if (!agent_) {
    staging_kind.kind = StoreStaging::Kind::None;
  }
  store_ = value_or_throw(ExpertStore::adopt(layout, group_->rank() * slots_per_rank, std::move(memory),
                                             std::move(spare), std::move(staging_kind)));
}

// A callback that raises stops the round at this rank's next vote (every
// rank stops there, naming it); its exception goes to Python with the report.
void Migration::call_on_layer(const LayerReport& layer) {
  if (on_layer_.is_none()) return;
  py::gil_scoped_acquire gil;
  try {
    on_layer_(layer);
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

RoundResult Migration::migrate(const IndexArray& old_phy2log, const IndexArray& new_phy2log, int64_t num_experts) {
  Placement current = placement_from_array(old_phy2log, num_experts, "old_phy2log");
  Placement target = placement_from_array(new_phy2log, num_experts, "new_phy2log");
  throw_if_error(migrator_->set_num_experts(int(num_experts)));  // <= kMaxExpertsPerLayer, checked above
  RoundReport report;
  {
    UseOfAgent use(agent_.get());
    py::gil_scoped_release release;
    report = migrator_->migrate(current, target);
  }
  return result(std::move(report));
}

// receives: (source rank, source slot, destination local slot, expert);
// sends: (destination rank, source local slot, destination slot, expert).
RoundResult Migration::exchange(int layer, const std::vector<py::tuple>& receives, const std::vector<py::tuple>& sends,
                                const std::string& local_error) {
  LayerExchange exchange;
  exchange.layer = layer;
  exchange.local_error = local_error;
  for (const auto& r : receives)
    exchange.receives.push_back({r[0].cast<int>(), r[1].cast<int>(), RowBuffer::Primary,
                                 {layer, r[2].cast<int>(), RowBuffer::Staging}, r[3].cast<int>()});
  for (const auto& s : sends)
    exchange.sends.push_back(
        {s[0].cast<int>(), {layer, s[1].cast<int>(), RowBuffer::Primary}, s[2].cast<int>(), s[3].cast<int>()});
  RoundReport report;
  {
    UseOfAgent use(agent_.get());
    py::gil_scoped_release release;
    report = migrator_->exchange(exchange);
  }
  return result(std::move(report));
}

// Drops the remembered digests of `layers` (every layer when empty).
void Migration::forget_checksums(const std::vector<int>& layers) {
  if (layers.empty()) return store_->forget_checksums();
  for (int layer : layers)
    if (layer < 0 || layer >= store_->layout().num_layers())
      throw_if_error(error(Code::InvalidArgument, "forget_checksums: layer " + std::to_string(layer) +
                                                      " is outside [0, " +
                                                      std::to_string(store_->layout().num_layers()) + ")"));
  for (int layer : layers) store_->forget_checksums(layer);
}

// Collective: do all ranks hold the same mapping after a round?
py::tuple Migration::agree(const IndexArray& phy2log, int64_t num_experts, double seconds, const std::string& check_failure) {
  Placement placement = placement_from_array(phy2log, num_experts, "phy2log");
  RankOutcome mine{seconds, mapping_hash(placement), check_failure};
  Result<RoundAgreement> agreement = [&] {
    py::gil_scoped_release release;
    return agree_on_round(*group_, mine, Deadline::after_seconds(derive_deadlines(options_, 0).collective_seconds));
  }();
  RoundAgreement agreed = value_or_throw(std::move(agreement));
  return py::make_tuple(agreed.agreed, agreed.failure, agreed.slowest_seconds);
}

// An async round of a Migration: the placement the progress thread switches
// layer by layer (owned here, so that it outlives the round), the agent
// marked busy until the round is closed, and every call that may wait made
// with the GIL released (the progress thread takes it for the group's
// Python collectives, a Python plane and the per-layer callback).
class AsyncRound {
 public:
  AsyncRound(Migration& migration, Placement current, const Placement& target, int lead_steps)
      : migration_(migration), current_(std::make_unique<Placement>(std::move(current))),
        use_(std::make_unique<Migration::UseOfAgent>(migration.agent_.get())) {
    auto started = migration_.migrator_->start(*current_, target, lead_steps);
    round_ = value_or_throw(std::move(started));
  }
  ~AsyncRound() {
    py::gil_scoped_release release;
    round_.reset();
  }

  StepResult commit_ready(int64_t step, int max_layers) {
    Result<std::vector<int>> committed = [&] {
      py::gil_scoped_release release;
      return live().commit_ready(step, max_layers);
    }();
    if (!committed) return {committed.status(), {}};
    return {Status::ok(), *committed};
  }
  StepResult poll() { return {live().poll(), {}}; }
  bool ready() { return round_ && round_->ready(); }
  bool done() { return !round_ || round_->done(); }
  void abort() { live().abort(); }
  // Joins the progress thread and returns the round's report. Complete once
  // done(); before that the round is closed (a voted commit still runs).
  RoundResult close() {
    if (round_) {
      std::unique_ptr<AsyncMigration> round = std::move(round_);
      py::gil_scoped_release release;
      report_ = round->report();
      round.reset();  // a voted commit still owed runs here (StepGate::close)
      use_.reset();
    }
    return {report_, migration_.take_callback_failure()};
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

py::object peer_of(const Status& status) {
  return status.peer() >= 0 ? py::object(py::int_(status.peer())) : py::object(py::none());
}

void bind_reports(py::module_& module) {
  py::class_<LayerReport>(module, "LayerReport")
      .def_readonly("layer", &LayerReport::layer)
      .def_readonly("bytes_kept", &LayerReport::bytes_kept)
      .def_readonly("bytes_local", &LayerReport::bytes_local)
      .def_readonly("bytes_intra_node", &LayerReport::bytes_intra_node)
      .def_readonly("bytes_inter_node", &LayerReport::bytes_inter_node)
      .def_readonly("requests", &LayerReport::requests)
      .def_readonly("descriptors", &LayerReport::descriptors)
      .def_readonly("bytes_read_here", &LayerReport::bytes_read_here)
      .def_readonly("seconds", &LayerReport::seconds)
      .def_readonly("seconds_checksum", &LayerReport::seconds_checksum)
      .def_readonly("seconds_transfer", &LayerReport::seconds_transfer)
      .def_readonly("seconds_verify", &LayerReport::seconds_verify)
      .def_readonly("seconds_vote", &LayerReport::seconds_vote)
      .def_readonly("seconds_commit", &LayerReport::seconds_commit)
      .def_readonly("retries", &LayerReport::retries)
      .def_readonly("changed", &LayerReport::changed)
      .def_readonly("committed", &LayerReport::committed)
      .def_readonly("failure", &LayerReport::failure)
      .def_property_readonly("failure_code",
                             [](const LayerReport& layer) {
                               return layer.failure.empty() ? std::string() : std::string(code_name(layer.failure_code));
                             })
      .def_readonly("plane", &LayerReport::plane);
  py::class_<RoundResult>(module, "RoundReport")
      .def_property_readonly("ok", [](const RoundResult& r) { return r.report.status.is_ok(); })
      .def_property_readonly("code", [](const RoundResult& r) { return std::string(code_name(r.report.status.code())); })
      .def_property_readonly("message", [](const RoundResult& r) { return r.report.status.message(); })
      .def_property_readonly("peer", [](const RoundResult& r) { return peer_of(r.report.status); })
      .def_property_readonly("layers", [](const RoundResult& r) { return r.report.layers; })
      .def_property_readonly("seconds", [](const RoundResult& r) { return r.report.seconds; })
      .def_property_readonly("retries", [](const RoundResult& r) { return r.report.retries(); })
      .def_property_readonly("stopped_alone", [](const RoundResult& r) { return r.report.stopped_alone; })
      .def_property_readonly("failed_layer",
                             [](const RoundResult& r) {
                               return r.report.failed_layer >= 0 ? py::object(py::int_(r.report.failed_layer))
                                                                 : py::object(py::none());
                             })
      .def_property_readonly("operation", [](const RoundResult& r) { return r.report.operation; })
      .def_readonly("callback_error", &RoundResult::callback_error);
  py::class_<StepResult>(module, "StepResult")
      .def_property_readonly("ok", [](const StepResult& s) { return s.status.is_ok(); })
      .def_property_readonly("code", [](const StepResult& s) { return std::string(code_name(s.status.code())); })
      .def_property_readonly("message", [](const StepResult& s) { return s.status.message(); })
      .def_property_readonly("peer", [](const StepResult& s) { return peer_of(s.status); })
      .def_readonly("layers", &StepResult::layers);
}

}  // namespace

void bind_migrate(py::module_& module) {
  bind_reports(module);
  py::class_<TensorArgument>(module, "TensorArgument")
      .def(py::init([](std::string name, uintptr_t address, uint64_t bytes_per_expert, bool allocated_by_agent,
                       uintptr_t spare_address, bool spare_allocated_by_agent, std::string dtype,
                       std::vector<int64_t> shape) {
             return TensorArgument{std::move(name), address, bytes_per_expert, allocated_by_agent, spare_address,
                                   spare_allocated_by_agent, std::move(dtype), std::move(shape)};
           }),
           py::arg("name"), py::arg("address"), py::arg("bytes_per_expert"), py::arg("allocated_by_agent") = false,
           py::arg("spare_address") = 0, py::arg("spare_allocated_by_agent") = false, py::arg("dtype") = "",
           py::arg("shape") = std::vector<int64_t>{});
  py::class_<Migration>(module, "Migrator")
      .def(py::init<std::shared_ptr<ProcessGroup>, py::object, const std::vector<std::vector<TensorArgument>>&,
                    const std::vector<TensorArgument>&, int, int, double, int, py::object, const std::string&,
                    const std::string&, const std::string&>(),
           py::arg("group"), py::arg("transfer"), py::arg("layers"), py::arg("staging"), py::arg("slots_per_rank"),
           py::arg("num_nodes"), py::arg("timeout"), py::arg("retries"), py::arg("on_layer"),
           py::arg("commit") = "copy", py::arg("transfer_schedule") = "off", py::arg("problem") = "")
      .def("live_buffers", &Migration::live_buffers)
      .def("migrate", &Migration::migrate, py::arg("old_phy2log"), py::arg("new_phy2log"), py::arg("num_experts"))
      .def("exchange", &Migration::exchange, py::arg("layer"), py::arg("receives"), py::arg("sends"),
           py::arg("local_error") = "")
      .def("start", &Migration::start, py::keep_alive<0, 1>(), py::arg("old_phy2log"), py::arg("new_phy2log"),
           py::arg("num_experts"), py::arg("lead_steps"))
      .def("forget_checksums", &Migration::forget_checksums, py::arg("layers"))
      .def("agree", &Migration::agree, py::arg("phy2log"), py::arg("num_experts"), py::arg("seconds"),
           py::arg("check_failure"))
      .def_property_readonly("plane", &Migration::plane_name)
      .def_property_readonly("transfer_schedule",
                             [](const Migration& m) { return transfer_schedule_name(m.options()); })
      .def_property_readonly("broken", &Migration::broken);
  py::class_<AsyncRound>(module, "AsyncMigration")
      .def("commit_ready", &AsyncRound::commit_ready, py::arg("step"), py::arg("max_layers"))
      .def("poll", &AsyncRound::poll)
      .def("ready", &AsyncRound::ready)
      .def("done", &AsyncRound::done)
      .def("abort", &AsyncRound::abort)
      .def("close", &AsyncRound::close);
  // [issue 31] eplb.Migrator(transfer_schedule=): the library's one rule for the names.
  module.def(
      "check_transfer_schedule",
      [](const std::string& name) {
        MigrateOptions probe;
        throw_if_error(set_transfer_schedule(probe, name));
      },
      py::arg("name"));
  // The "eplb-dev64" digest of host rows (eplb/digest.py uses it for CPU
  // tensors): `length` bytes at each address, the GIL released.
  module.def(
      "dev64_digests",
      [](const std::vector<uintptr_t>& addresses, uint64_t length) {
        std::vector<uint64_t> out(addresses.size());
        py::gil_scoped_release release;
        for (size_t i = 0; i < addresses.size(); ++i)
          out[i] = bytes::dev64_digest({reinterpret_cast<const uint8_t*>(addresses[i]), length});
        return out;
      },
      py::arg("addresses"), py::arg("length"));
  module.def(
      "deadlines",
      [](double timeout, double collective_timeout, uint64_t largest_read_bytes) {
        MigrateOptions options;
        options.timeout_seconds = timeout;
        options.collective_timeout_seconds = collective_timeout;
        throw_if_error(validate_timeouts(options));
        const Deadlines d = derive_deadlines(options, largest_read_bytes);
        py::dict out;
        out["transfer"] = d.transfer_seconds;
        out["collective"] = d.collective_seconds;
        out["setup"] = d.setup_seconds;
        out["serving_wait"] = d.serving_wait_seconds;
        out["drain"] = d.drain_seconds;
        return out;
      },
      py::arg("timeout"), py::arg("collective_timeout") = 0.0, py::arg("largest_read_bytes") = 0);
}

}  // namespace eplb::python
