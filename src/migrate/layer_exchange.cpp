// layer_exchange.cpp - Migrator::exchange: one layer's transfers as the
// engine gives them (vLLM's communicator: add_send / add_recv), through the
// same protocol as a round (layer_run.h): one publication collective (every
// rank's sent rows with their experts and digests, its receives and sends,
// and any bad call it recorded), the pairing checked on every rank, then
// the attempts, each closed by a vote. The engine writes its rows from
// staging itself afterwards (no commit here).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "common/bytes.h"
#include "layer_run.h"

namespace eplb {
namespace migrate {
namespace {

constexpr std::string_view kExchangeMagic = "EPLBEXCHANGE";
constexpr uint32_t kExchangeVersion = 1;
constexpr uint32_t kMaxEntries = 1u << 24;

// What one rank publishes: its bad call (if any), the rows it sends (slot,
// expert, digests), its receives and its sends.
struct Publication {
  std::string local_error;
  std::vector<int32_t> slots, experts;  // distinct sent rows
  std::vector<uint64_t> sums;           // [row * tensors + tensor]
  std::vector<std::array<int32_t, 4>> receives;  // (source rank, source slot, expert, destination slot)
  std::vector<std::array<int32_t, 4>> sends;     // (destination rank, source slot, expert, destination slot)
};

std::string encode(const Publication& mine) {
  bytes::Writer writer;
  writer.raw(kExchangeMagic);
  writer.u32(kExchangeVersion);
  writer.blob(mine.local_error);
  writer.u32(uint32_t(mine.slots.size()));
  for (size_t i = 0; i < mine.slots.size(); ++i) {
    writer.i32(mine.slots[i]);
    writer.i32(mine.experts[i]);
  }
  writer.u32(uint32_t(mine.sums.size()));
  for (uint64_t sum : mine.sums) writer.u64(sum);
  for (const auto* list : {&mine.receives, &mine.sends}) {
    writer.u32(uint32_t(list->size()));
    for (const auto& entry : *list)
      for (int32_t value : entry) writer.i32(value);
  }
  return writer.take();
}

Result<Publication> decode(std::string_view message, int rank, size_t tensors) {
  bytes::Reader reader(message);
  Publication theirs;
  bool ok = reader.expect(kExchangeMagic) && reader.u32() == kExchangeVersion;
  theirs.local_error = std::string(reader.blob(1 << 16));
  const uint32_t rows = reader.u32();
  ok = ok && reader.ok() && rows <= kMaxEntries;
  for (uint32_t i = 0; ok && i < rows; ++i) {
    theirs.slots.push_back(reader.i32());
    theirs.experts.push_back(reader.i32());
    ok = reader.ok();
  }
  const uint32_t sums = reader.u32();
  ok = ok && reader.ok() && sums == rows * tensors && reader.remaining() >= uint64_t(sums) * 8;
  for (uint32_t i = 0; ok && i < sums; ++i) theirs.sums.push_back(reader.u64());
  for (auto* list : {&theirs.receives, &theirs.sends}) {
    const uint32_t count = reader.u32();
    ok = ok && reader.ok() && count <= kMaxEntries && reader.remaining() >= uint64_t(count) * 16;
    for (uint32_t i = 0; ok && i < count; ++i)
      list->push_back({reader.i32(), reader.i32(), reader.i32(), reader.i32()});
  }
  if (!ok || !reader.at_end())
    return error(Code::Mismatch, fmt::format("rank {} published a malformed exchange ({} bytes, bad at byte {})",
                                             rank, message.size(), reader.position()))
        .with_peer(rank);
  return theirs;
}

// Every receive has the matching send and the reverse: (source, destination,
// source slot, expert), counted on both sides (a sender need not know the
// slot a row lands in).
Status check_pairing(const std::vector<Publication>& all, int layer) {
  using Key = std::tuple<int, int, int, int>;
  std::map<Key, int> wanted, offered;
  for (size_t r = 0; r < all.size(); ++r) {
    for (const auto& [source, slot, expert, destination_slot] : all[r].receives) ++wanted[{source, int(r), slot, expert}];
    for (const auto& [destination, slot, expert, destination_slot] : all[r].sends)
      ++offered[{int(r), destination, slot, expert}];
  }
  for (const auto& [key, count] : wanted) {
    const auto& [source, destination, slot, expert] = key;
    if (offered[key] != count)
      return error(Code::Mismatch, fmt::format("layer {}: rank {} expects expert {} from rank {} (its slot {}) {} "
                                               "time(s), but rank {} queued {} such send(s); nothing was transferred",
                                               layer, destination, expert, source, slot, count, source, offered[key]))
          .with_peer(source);
  }
  for (const auto& [key, count] : offered) {
    const auto& [source, destination, slot, expert] = key;
    if (count && wanted[key] != count)
      return error(Code::Mismatch, fmt::format("layer {}: rank {} queued a send of expert {} to rank {}, which "
                                               "queued no such receive; nothing was transferred",
                                               layer, source, expert, destination))
          .with_peer(destination);
  }
  return Status::ok();
}

// Both sides of a pair in one order without the destination slot, which a
// sender need not know: receives by (source, source slot, expert), sends by
// (destination, source slot, expert).
LayerTransfers canonical(const LayerExchange& exchange) {
  LayerTransfers out{exchange.layer, exchange.receives, exchange.sends};
  std::stable_sort(out.receives.begin(), out.receives.end(), [](const RowReceive& a, const RowReceive& b) {
    return std::tie(a.source_rank, a.source_slot, a.expert) < std::tie(b.source_rank, b.source_slot, b.expert);
  });
  std::stable_sort(out.sends.begin(), out.sends.end(), [&](const RowSend& a, const RowSend& b) {
    return std::tie(a.destination_rank, a.from.local_slot, a.expert) <
           std::tie(b.destination_rank, b.from.local_slot, b.expert);
  });
  return out;
}

Publication publication(Migrator::State& state, const LayerExchange& exchange, Status* local) {
  Publication mine;
  mine.local_error = exchange.local_error;
  const int first = state.store->first_slot();
  std::map<int, int> rows;  // sent slot -> expert
  for (const RowSend& send : exchange.sends) {
    rows.emplace(send.from.local_slot + first, send.expert);
    mine.sends.push_back({send.destination_rank, send.from.local_slot + first, send.expert, send.destination_slot});
  }
  for (const RowReceive& receive : exchange.receives)
    mine.receives.push_back({receive.source_rank, receive.source_slot, receive.expert, receive.to.local_slot + first});
  std::vector<RowRef> refs;
  for (auto [slot, expert] : rows) {
    mine.slots.push_back(slot);
    mine.experts.push_back(expert);
    refs.push_back({exchange.layer, slot - first, RowBuffer::Primary});
  }
  if (!refs.empty() && mine.local_error.empty()) {
    auto sums = state.plane->digest(refs);
    if (sums) mine.sums = std::move(sums).value();
    else *local = sums.status();
  }
  if (!local->is_ok()) mine.local_error = local->to_string();
  if (!mine.local_error.empty()) mine.slots.clear(), mine.experts.clear(), mine.sums.clear();
  return mine;
}

}  // namespace

// Decodes the gathered publications; Ok with *nothing set when no rank has
// anything to move.
Result<std::vector<Publication>> gather_exchange(Migrator::State& state, const LayerExchange& exchange,
                                                 const std::vector<std::string>& gathered) {
  std::vector<Publication> all;
  const size_t tensors = state.store->layout().layers[size_t(exchange.layer)].size();
  for (size_t r = 0; r < gathered.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(Publication theirs, decode(gathered[r], int(r), tensors));
    if (!theirs.local_error.empty())
      return error(Code::Aborted, fmt::format("rank {}: {}. Nothing was transferred", r, theirs.local_error))
          .with_peer(int(r));
    all.push_back(std::move(theirs));
  }
  EPLB_TRY(check_pairing(all, exchange.layer));
  return all;
}

}  // namespace migrate

RoundReport Migrator::exchange(const LayerExchange& exchange) {
  using namespace migrate;
  RoundReport report;
  Stopwatch clock;
  State& state = *state_;
  if (exchange.layer < 0 || exchange.layer >= state.topology.num_layers) {
    report.status = error(Code::InvalidArgument, fmt::format("exchange: layer {} is outside [0, {})", exchange.layer,
                                                             state.topology.num_layers));
    return report;
  }
  Status local;
  const std::string message = encode(publication(state, exchange, &local));
  const Deadline deadline = Deadline::after_seconds(derive_deadlines(options_, 0).collective_seconds);
  auto gathered = with_progress(*state.plane, [&] { return state.group->allgather(message, deadline); });
  auto all = gathered ? gather_exchange(state, exchange, *gathered) : Result<std::vector<Publication>>(gathered.status());
  report.failed_layer = exchange.layer;
  report.operation = "publishing the layer's rows";
  if (!all) {
    report.status = all.status().with_context(fmt::format("layer {} on rank {}", exchange.layer, state.me()));
    return report;
  }
  PublishedSums published;
  uint64_t most_rows = 0;
  bool any = false;
  for (const Publication& theirs : *all) {
    published.sums.push_back(theirs.sums);
    published.experts.push_back(theirs.experts);
    published.index.emplace_back();
    for (size_t i = 0; i < theirs.slots.size(); ++i) published.index.back()[theirs.slots[i]] = i;
    most_rows = std::max<uint64_t>(most_rows, theirs.receives.size());
    any = any || !theirs.receives.empty();
  }
  published.live.assign(all->size(), 0);
  published.seconds = clock.seconds();
  report.failed_layer = -1;
  report.operation.clear();
  if (!any) {
    report.seconds = clock.seconds();
    return report;  // nothing queued on any rank
  }
  const std::vector<int> none;
  LayerRun run(state, options_, exchange.layer, none, nullptr);
  LayerTransfers given = canonical(exchange);
  report.status = run.run_exchange(given, published,
                                   most_rows * state.store->layout().bytes_per_expert(exchange.layer));
  if (!report.status.is_ok()) {
    report.failed_layer = exchange.layer;
    report.operation = run.operation();
  }
  LayerReport& layer = run.report();
  layer.plane = state.plane->name();
  layer.seconds = clock.seconds();
  report.layers.push_back(std::move(layer));
  report.seconds = clock.seconds();
  return report;
}

}  // namespace eplb
