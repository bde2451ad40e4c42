// eplb/bootstrap.h - the process group of the ranks of one eplb run.
//
// Contract: rank(), size(), and collectives over byte strings: allgather,
// barrier, a unanimous vote, and check_fingerprint (do all ranks agree on
// these named fields?). A group implements ONE primitive, exchange(): every
// rank contributes bytes to the collective and receives every rank's bytes.
// The base class builds allgather, barrier and vote on it, so a group that
// lives outside this library (a binding over torch.distributed, say) only
// implements exchange(). Every collective takes a Deadline; a dead, stuck or
// diverging rank makes the others fail with a Status naming that rank
// (Timeout, RemoteDisconnect or Mismatch), never a hang. Every message
// received is untrusted: framed, versioned, length-checked (ParseError or
// Mismatch otherwise). Collectives must be called in the same order on every
// rank.
//
// Groups:
//  local   ranks on one machine, wired over Unix-domain sockets in a private
//          rendezvous directory; launch_local_ranks() starts such ranks.
//  thread  ranks that are threads of one process (tests, simulations).
//  mpi     ranks started by mpirun (OpenMPI); the deadline is enforced by
//          polling non-blocking operations.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eplb/common.h"
#include "eplb/status.h"

namespace eplb {

enum class Collective : uint8_t { Allgather = 1, Barrier = 2, Vote = 3 };
// "allgather", "barrier", "vote".
std::string_view collective_name(Collective kind);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;

  // The primitive: collective number n of this group, of kind `kind`, on
  // every rank. Returns the contributions indexed by rank (size() entries;
  // empty strings for a barrier). Must fail naming the rank when one does
  // not arrive by the deadline (Timeout), is gone (RemoteDisconnect) or is in
  // another collective (Mismatch).
  virtual Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) = 0;

  // Every rank contributes `mine`; returns all contributions indexed by rank.
  Result<std::vector<std::string>> allgather(std::string mine, Deadline deadline);
  Status barrier(Deadline deadline);
  // True when every rank voted yes; the Status fails when a rank is lost or
  // sent a malformed vote. `reasons` (optional) receives each rank's reason
  // (empty for yes).
  Result<bool> vote(bool yes, const std::string& reason, Deadline deadline,
                    std::vector<std::string>* reasons = nullptr);
};

// Named values every rank must agree on before anything happens (topology,
// policy, options, layout, input identity...).
struct FingerprintField {
  std::string name;
  std::string value;
};
// Collective. Mismatch naming the first rank and field (and both values,
// shortened) that differ from rank 0's.
Status check_fingerprint(ProcessGroup& group, const std::vector<FingerprintField>& fields, Deadline deadline);

// A fresh 256-bit secret as 64 lowercase hex digits (getrandom), the kind
// the launcher gives its ranks; run_secret_bytes turns one back into its 32
// raw bytes ("" stays "", anything but 64 hex digits is InvalidArgument).
// Applications that guard a socket of their own (xfer-bench) use the same.
Result<std::string> make_run_secret();
Result<std::string> run_secret_bytes(const std::string& hex);

// Local group: how a launched rank finds its group. launch_local_ranks passes
// these through the environment (EPLB_RANK, EPLB_SIZE, EPLB_BOOTSTRAP_DIR,
// EPLB_RUN_SECRET, EPLB_LAUNCHER_PID).
//
// Who may join: rank 0 (the hub) accepts a connection only from a process
// of its own user (SO_PEERCRED) and, when `launcher_pid` is rank 0's parent,
// only from another child of that launcher; and a hello only with the run's
// secret (when rank 0 has one). Anything else (a forged, malformed or
// foreign hello) is dropped, reported through `on_dropped`, and the group
// keeps forming; the listening socket is gone once it formed (a late hello
// finds nobody).
struct LocalGroupOptions {
  int rank = 0;
  int size = 1;
  std::string rendezvous_dir;  // a directory private to this run (Unix sockets live here)
  double connect_timeout_seconds = 30;
  std::string secret;          // 64 hex digits (256 bits) shared by the run's ranks, or empty
  int launcher_pid = 0;        // the launcher that started the ranks, or 0
  // Hub only: one line per dropped connection or hello (the caller logs it).
  std::function<void(const std::string&)> on_dropped;
};
// `channel` empty: the run's group. A name ([a-z0-9-], up to 32): another
// group of the same ranks with its own collective sequence (its hub listens
// on <rendezvous_dir>/<channel>.sock), formed after the first one.
Result<std::unique_ptr<ProcessGroup>> make_local_group(const LocalGroupOptions& options,
                                                       const std::string& channel = "");
// Reads LocalGroupOptions from the environment (and EPLB_BOOTSTRAP_TIMEOUT);
// NotFound if this process was not launched.
Result<LocalGroupOptions> local_group_options_from_env();

// In-process group: `size` ranks that are threads of this process. Each
// returned group is used by one thread; destroying one makes the others'
// collectives fail with RemoteDisconnect naming its rank.
std::vector<std::unique_ptr<ProcessGroup>> make_thread_groups(int size);

// MPI group (MPI_Init on first use). Unsupported when built without MPI.
// MPI_Init itself cannot be given a deadline: when it has not returned after
// connect_timeout_seconds, a watchdog says so on stderr and ends the process
// with `stuck_init_exit_code` (the application's "timed out" code).
Result<std::unique_ptr<ProcessGroup>> make_mpi_group(double connect_timeout_seconds = 30,
                                                     int stuck_init_exit_code = 1);
// True when this process looks like it was started by mpirun.
bool launched_by_mpirun();

// launch_local_ranks starts `size` copies of `argv` (argv[0] an executable
// path, or a name looked up in PATH) with the local group's environment set
// (EPLB_RANK, EPLB_SIZE, EPLB_BOOTSTRAP_DIR = a fresh private directory,
// EPLB_RUN_SECRET = 256 random bits, EPLB_LAUNCHER_PID, and UCX_POSIX_DIR =
// a private directory under /dev/shm unless the caller set one); both
// directories are removed however the launch ends, and those of launchers
// that were SIGKILLed (owner process gone) are swept at the next launch.
// The ranks write to the inherited stdout/stderr. It
// waits until `deadline` (then kills every rank), SIGKILLs the survivors
// `grace_seconds` after the first rank fails, and forwards SIGINT/SIGTERM
// received meanwhile to the ranks.
struct LaunchOptions {
  int size = 1;
  std::vector<std::string> argv;
  Deadline deadline = Deadline::after_seconds(60);
  double grace_seconds = 5;
  // Exit codes with which a rank usually reports another rank's failure
  // (an application's "timed out" or "peer lost" codes), most likely echo
  // last. Of the ranks found dead within 0.5 s of the first, the one named
  // is a signalled rank, then one with any other non-zero code, then these
  // in this order.
  std::vector<int> echo_exit_codes;
};
struct LaunchResult {
  // Ok when every rank exited 0. Otherwise: Timeout (the deadline passed),
  // Canceled (a signal was forwarded), NotFound/IoError (a rank could not be
  // started), or Aborted naming the failed rank, its exit code or signal,
  // when, and which survivors were killed.
  Status status;
  std::vector<int> exit_codes;  // per rank; 128 + signal for signalled ranks, -1 if never started
  int failed_rank = -1;         // the rank named in `status`, or -1
  bool failed_rank_signalled = false;
  int forwarded_signal = 0;     // SIGINT / SIGTERM received and forwarded (status Canceled), or 0
  std::vector<int> pids;        // per rank: the process id it had, -1 if never started
};
LaunchResult launch_local_ranks(const LaunchOptions& options);

}  // namespace eplb
