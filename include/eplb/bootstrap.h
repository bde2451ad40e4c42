// eplb/bootstrap.h - the process group of the ranks of one eplb run.
//
// Contract: rank(), size(), and collectives over byte strings: allgather,
// barrier, and a unanimous vote. Every collective takes a Deadline; a dead,
// stuck or diverging rank makes the others fail with a Status naming that
// rank (Timeout or RemoteDisconnect), never a hang. Every message received
// is untrusted: framed with a magic, a version, a kind, a sequence number
// and an explicit length, and bounds-checked (ParseError/Mismatch otherwise).
// Collectives must be called in the same order on every rank.
//
// Backends:
//  local  ranks on one machine, wired over Unix-domain sockets by a launcher
//         (`eplb run --ranks N` starts N processes); no external service.
//  mpi    ranks started by mpirun (OpenMPI); collectives over MPI, with the
//         deadline enforced by polling non-blocking operations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "eplb/common.h"
#include "eplb/status.h"

namespace eplb {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;

  // Every rank contributes `mine`; returns all contributions indexed by rank.
  virtual Result<std::vector<std::string>> allgather(const std::string& mine, Deadline deadline) = 0;
  virtual Status barrier(Deadline deadline) = 0;
  // True when every rank voted yes; the Status fails when a rank is lost.
  // `reasons` (optional) receives each rank's reason string (empty for yes).
  virtual Result<bool> vote(bool yes, const std::string& reason, Deadline deadline,
                            std::vector<std::string>* reasons = nullptr) = 0;
};

// Local bootstrap: how a launched rank finds its group. The launcher passes
// these through the environment (EPLB_RANK, EPLB_SIZE, EPLB_BOOTSTRAP_DIR).
struct LocalGroupOptions {
  int rank = 0;
  int size = 1;
  std::string rendezvous_dir;  // a directory private to this run (Unix sockets live here)
  double connect_timeout_seconds = 30;
};
Result<std::unique_ptr<ProcessGroup>> make_local_group(const LocalGroupOptions& options);
// Reads LocalGroupOptions from the environment; NotFound if not launched.
Result<LocalGroupOptions> local_group_options_from_env();

// In-process group: `size` ranks that are threads of this process (tests,
// single-process simulations over the loopback transfer backend). Each
// returned group is used by one thread.
std::vector<std::unique_ptr<ProcessGroup>> make_thread_groups(int size);

// MPI bootstrap (MPI_Init on first use). Unsupported when built without MPI.
Result<std::unique_ptr<ProcessGroup>> make_mpi_group(double connect_timeout_seconds = 30);
// True when this process looks like it was started by mpirun.
bool launched_by_mpirun();

// Launches `size` copies of `argv` (argv[0] an executable path, or a name
// looked up in PATH) with the local bootstrap environment set (EPLB_RANK,
// EPLB_SIZE, EPLB_BOOTSTRAP_DIR = a fresh private directory, removed at the
// end); the ranks write straight to the inherited stdout/stderr. Waits
// bounded by `deadline` (then kills every rank: Timeout); `grace` seconds
// after the first failing rank, SIGKILLs the survivors. SIGINT/SIGTERM
// received meanwhile are forwarded to the ranks (Canceled).
// Returns the first non-zero exit as a Status naming the rank (of ranks
// found dead within 0.5 s of the first, a signalled rank before one that
// exited with an error, before one that reported a timeout or a lost peer,
// since those usually report another rank's failure); its code
// follows the eplb CLI exit codes (4 -> Timeout, 5 or a signal ->
// RemoteDisconnect, 2 -> InvalidArgument, 3 -> ParseError, else Aborted).
// `outcome`, when given, receives the exit codes whether or not it failed.
struct LaunchResult {
  std::vector<int> exit_codes;  // per rank; 128+signal for signalled ranks
};
Result<LaunchResult> launch_local_ranks(int size, const std::vector<std::string>& argv, Deadline deadline,
                                        double grace_seconds = 5, LaunchResult* outcome = nullptr);

}  // namespace eplb
