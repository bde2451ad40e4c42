// eplb/data_plane.h - how the migration protocol moves and checks rows: a
// data plane behind one small interface (part of the migrate module).
//
// Contract:
// - The protocol (eplb/migrate.h: plan -> stage local copies -> transfer ->
//   verify -> vote -> commit or abort -> fence, retries, deadlines, the
//   async step gate) exists once and never touches row bytes itself: every
//   byte it moves, copies or digests goes through the rank's DataPlane.
// - A row is one expert's bytes of every tensor of a layer, in one of the
//   rank's buffers: Primary (the engine's tensors, or the store's arena),
//   Spare (the swap commit's second buffer), Staging (where an attempt's
//   rows land before the commit). Buffers are absolute: which of Primary and
//   Spare is live is the protocol's bookkeeping (ExpertStore::live_buffer).
// - post() starts one layer attempt's transfers: every receive of this rank
//   and, on two-sided planes (torch.distributed), every send; both lists
//   come in one canonical order that every rank derives from the same plan,
//   so sends and receives pair up. wait() returns Ok once every received
//   row has landed, or the failure (naming peers, experts, bytes, elapsed
//   time, the transport's own status) at the latest at the deadline.
//   abandon() releases what post() started, whatever happened.
// - digest() returns a 64-bit digest per (row, tensor) of the plane's
//   digest_kind() ("xxh3-64" for host rows; "eplb-dev64" for rows digested
//   on their device); every rank must use the same kind (checked at set-up).
// - copy() runs before/after the transfers (staging local copies), commit()
//   writes committed rows into the live buffer at the agreed step (on a
//   device, on the engine's stream, ordered after the transfers).
// - broken(): a non-empty reason once the plane cannot be used again (a
//   timed-out NCCL communicator, a gloo pair closed by a deadline).
// - Planes here: UcxPlane (one-sided READs through the xfer Agent, host
//   memory; make_ucx_plane). The Python package adds torch, staged and nixl
//   planes, implemented in Python and called through this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eplb/common.h"
#include "eplb/status.h"

namespace eplb {

class ExpertStore;
namespace xfer {
class Agent;
}

enum class RowBuffer : uint8_t { Primary = 0, Spare = 1, Staging = 2 };
std::string_view row_buffer_name(RowBuffer buffer);  // "primary", "spare", "staging"

// One expert's rows (every tensor of `layer`) in one of this rank's buffers.
struct RowRef {
  int layer = 0;
  int local_slot = 0;
  RowBuffer buffer = RowBuffer::Primary;
  bool operator==(const RowRef&) const = default;
};

struct RowCopy {
  RowRef from, to;
};

// A row this rank receives: `source_rank`'s global slot in its buffer
// `source_buffer` (Primary or Spare: the one it published live), into `to`.
struct RowReceive {
  int source_rank = 0;
  int source_slot = 0;
  RowBuffer source_buffer = RowBuffer::Primary;
  RowRef to;
  int expert = 0;
};

// A row this rank sends (two-sided planes): `from` to `destination_rank`,
// which lands it in its global slot `destination_slot`.
struct RowSend {
  int destination_rank = 0;
  RowRef from;
  int destination_slot = 0;
  int expert = 0;
};

// One layer attempt's transfers, in the canonical order: receives by
// (source rank, destination slot), sends by (destination rank, destination
// slot); a send of rank s to rank d and d's receive from s of the same slot
// hold the same position among s->d pairs.
struct LayerTransfers {
  int layer = 0;
  std::vector<RowReceive> receives;
  std::vector<RowSend> sends;
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual std::string name() const = 0;
  virtual std::string digest_kind() const = 0;

  // Set-up, collective (Migrator::create exchanges the blobs): what this
  // rank's plane tells the others, then every rank's blob, indexed by rank.
  virtual Result<std::string> describe() = 0;
  virtual Status connect(const std::vector<std::string>& blobs, int me) = 0;

  // out[i * tensors + t]: the digest of tensor t of rows[i] (all rows of one layer).
  virtual Result<std::vector<uint64_t>> digest(std::span<const RowRef> rows) = 0;
  virtual Status copy(std::span<const RowCopy> copies) = 0;
  virtual Status commit(std::span<const RowCopy> copies) = 0;

  virtual Status post(const LayerTransfers& transfers, Deadline deadline) = 0;
  virtual Status wait(Deadline deadline) = 0;
  // Digests the plane computed as the rows landed, [receive * tensors + t]
  // (nullopt where it did not: the protocol digests those rows itself).
  virtual std::vector<std::optional<uint64_t>> landed_digests() { return {}; }
  virtual void abandon() = 0;

  // Drives the plane while the protocol waits in a collective (a one-sided
  // transport's source serves its peers' READs only while it progresses);
  // true when it handled events.
  virtual bool progress() { return false; }
  // Receivers pull (READs): sends are ignored, and a layer's receives may
  // be posted in several parts (the transfer schedule). false: sends and
  // receives pair up in one post.
  virtual bool one_sided() const { return true; }
  virtual std::string broken() const { return {}; }
};

// One-sided READs through `agent` over `store`'s host memory (registered
// by connect()); XXH3-64 digests, memcpy copies. Both must outlive it.
std::unique_ptr<DataPlane> make_ucx_plane(xfer::Agent& agent, ExpertStore& store);

}  // namespace eplb
