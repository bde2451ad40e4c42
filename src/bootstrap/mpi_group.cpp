// The `mpi` process group: ranks started by mpirun (OpenMPI).
//
// Every collective first exchanges a 24-byte notice (sequence, kind, length)
// with every other rank by non-blocking point-to-point messages; that is the
// barrier, it tells exactly which ranks have not arrived when the deadline
// passes, and it catches ranks that diverge (Mismatch naming the rank).
// allgather and vote then move the bytes with MPI_Iallgatherv. Everything is
// polled with MPI_Test until the deadline.
//
// MPI's limits: a posted MPI operation cannot be cancelled, so after a
// timeout or mismatch the group is unusable (later calls return the first
// failure) and MPI_Finalize is skipped at exit (it could wait forever for the
// missing rank); mpirun then stops the remaining ranks. MPI_Init itself has no
// timeout, so a watchdog thread ends the process (with the caller's exit
// code) if it does not return within the connect timeout. A rank that dies is normally detected by
// mpirun itself, which then kills the job.
#include <cstdlib>
#include <string>

#include "eplb/bootstrap.h"

namespace eplb {

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* value = std::getenv(name); value && *value) return true;
  return false;
}

}  // namespace eplb

#ifndef EPLB_HAVE_MPI

namespace eplb {
Result<std::unique_ptr<ProcessGroup>> make_mpi_group(double, int) {
  return error(Code::Unsupported, "this eplb was built without MPI (install libopenmpi-dev and rebuild)");
}
}  // namespace eplb

#else

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "connection.h"
#include "message.h"

namespace eplb {
namespace {

using bootstrap::MessageKind;

constexpr int kNoticeTag = 0x4550;  // "EP"
std::atomic<bool> g_some_group_broken{false};
std::mutex g_init_mutex;
std::mutex g_mpi_calls;

// MPI is initialised MPI_THREAD_SERIALIZED: one thread at a time inside MPI.
// Groups may be used from different threads at once (`eplb run --async`:
// the migration's collectives on its progress thread, the serving loop's
// per-step barrier on the serving thread), so every MPI call on a group goes
// through this lock. The calls are non-blocking; waits sleep outside it.
template <class Call>
int serialized(Call&& call) {
  std::lock_guard lock(g_mpi_calls);
  return call();
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_some_group_broken.load()) {
    std::fprintf(stderr,
                 "eplb: not calling MPI_Finalize: a collective failed and MPI cannot cancel it "
                 "(mpirun stops the other ranks)\n");
    return;
  }
  MPI_Finalize();
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (serialized([&] { return MPI_Error_string(code, text, &length); }) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

Status ensure_initialized(double timeout_seconds, int stuck_exit_code) {
  std::lock_guard lock(g_init_mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return error(Code::NotAllowed, "MPI was already finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return Status::ok();
  // MPI_Init has no timeout of its own: a watchdog ends the process if it hangs.
  std::mutex watchdog_mutex;
  std::condition_variable watchdog_wake;
  bool init_returned = false;
  std::thread watchdog([&] {
    std::unique_lock watchdog_lock(watchdog_mutex);
    if (!watchdog_wake.wait_for(watchdog_lock, std::chrono::duration<double>(timeout_seconds),
                                [&] { return init_returned; })) {
      std::fprintf(stderr, "eplb: timeout: MPI_Init did not complete within %.1f s (are all ranks started?)\n",
                   timeout_seconds);
      std::fflush(stderr);
      ::_exit(stuck_exit_code);
    }
  });
  int provided = 0;
  int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  {
    std::lock_guard watchdog_lock(watchdog_mutex);
    init_returned = true;
  }
  watchdog_wake.notify_all();
  watchdog.join();
  if (code != MPI_SUCCESS) return error(Code::Backend, "MPI_Init_thread failed: " + mpi_error_text(code));
  if (provided < MPI_THREAD_SERIALIZED)
    return error(Code::Unsupported,
                 fmt::format("MPI provides thread level {}, eplb needs MPI_THREAD_SERIALIZED", provided));
  std::atexit(finalize_at_exit);
  return Status::ok();
}

// Polls `requests` until all are complete or the deadline passes; returns the
// indices still incomplete (empty when done).
Result<std::vector<size_t>> wait_requests(std::vector<MPI_Request>& requests, Deadline deadline) {
  Stopwatch waited;
  int tests = 0;
  while (true) {
    std::vector<size_t> pending;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      int code = serialized([&] { return MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE); });
      if (code != MPI_SUCCESS) return error(Code::Backend, "MPI_Test: " + mpi_error_text(code));
      if (!done) pending.push_back(i);
    }
    if (pending.empty() || deadline.expired()) return pending;
    // MPI progresses only inside MPI calls, so keep testing; but sleep between
    // tests after the first few so that oversubscribed ranks (more ranks than
    // cores) let each other run. After 50 ms, test every 0.5 ms.
    if (++tests > 100) std::this_thread::sleep_for(std::chrono::microseconds(waited.seconds() > 0.05 ? 500 : 20));
  }
}

std::string mpi_collective_name(MessageKind kind, uint64_t sequence) {
  return fmt::format("mpi {} #{}", bootstrap::kind_name(kind), sequence);
}

std::string ranks_phrase(const std::vector<size_t>& indices, const char* one, const char* many) {
  std::vector<int> ranks(indices.begin(), indices.end());
  return fmt::format("rank{} {} {}", ranks.size() > 1 ? "s" : "", bootstrap::rank_list(ranks),
                     ranks.size() > 1 ? many : one);
}

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && broken_.is_ok()) serialized([&] { return MPI_Comm_free(&comm_); });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }
  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) override;

 private:
  // Buffers of one collective; kept alive forever if MPI still owns them.
  struct Exchange {
    std::string what;  // "mpi allgather #3"
    Stopwatch elapsed;
    std::array<uint64_t, 3> notice{};
    std::vector<std::array<uint64_t, 3>> notices;
    std::vector<MPI_Request> receives, sends;
    std::string mine;
    std::vector<char> gathered;
    std::vector<int> counts, displacements;
    std::vector<MPI_Request> data;
  };

  // The failure that makes this group unusable; MPI may still write into `x`.
  Status fail(Status why, std::unique_ptr<Exchange>& x) {
    broken_ = why;
    g_some_group_broken.store(true);
    abandoned_.push_back(std::move(x));
    return why;
  }
  // The 24-byte notice exchange with every other rank: the barrier, and the
  // check that every rank is in the same collective.
  Status exchange_notices(Exchange& x, Deadline deadline);
  Status check_notices(const Exchange& x) const;
  // allgather and vote: the bytes themselves, with MPI_Iallgatherv.
  Result<std::vector<std::string>> gather_data(Exchange& x, Deadline deadline);

  MPI_Comm comm_;
  int rank_;
  int size_;
  uint64_t sequence_ = 0;
  Status broken_;
  std::vector<std::unique_ptr<Exchange>> abandoned_;
};

Status MpiGroup::exchange_notices(Exchange& x, Deadline deadline) {
  x.notices.assign(static_cast<size_t>(size_), {});
  x.notices[static_cast<size_t>(rank_)] = x.notice;
  x.receives.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  x.sends.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int code = serialized([&] {
      const int posted = MPI_Irecv(x.notices[r].data(), 3, MPI_UINT64_T, r, kNoticeTag, comm_, &x.receives[r]);
      if (posted != MPI_SUCCESS) return posted;
      return MPI_Isend(x.notice.data(), 3, MPI_UINT64_T, r, kNoticeTag, comm_, &x.sends[r]);
    });
    if (code != MPI_SUCCESS)
      return error(Code::Backend, fmt::format("{}: posting the notice exchange with rank {}: {}", x.what, r,
                                              mpi_error_text(code)));
  }
  auto missing_or = wait_requests(x.receives, deadline);
  if (!missing_or.is_ok()) return missing_or.status().with_context(x.what);
  const std::vector<size_t>& missing = *missing_or;
  if (!missing.empty())
    return error(Code::Timeout, fmt::format("{}: {} not arrived within {} (stuck, slow, or dead without mpirun "
                                            "noticing)",
                                            x.what, ranks_phrase(missing, "has", "have"),
                                            format_seconds(x.elapsed.seconds())))
        .with_peer(int(missing.front()));
  EPLB_TRY(check_notices(x));
  auto unsent = wait_requests(x.sends, deadline);
  if (!unsent.is_ok()) return unsent.status().with_context(x.what);
  if (!unsent->empty())
    return error(Code::Timeout, fmt::format("{}: the notice to ranks {} was not delivered within {}", x.what,
                                            bootstrap::rank_list(std::vector<int>(unsent->begin(), unsent->end())),
                                            format_seconds(x.elapsed.seconds())));
  return Status::ok();
}

Status MpiGroup::check_notices(const Exchange& x) const {
  for (int r = 0; r < size_; ++r) {
    const auto& theirs = x.notices[static_cast<size_t>(r)];
    if (theirs[0] == x.notice[0] && theirs[1] == x.notice[1]) continue;
    std::string their_kind = theirs[1] >= 1 && theirs[1] <= bootstrap::kLastMessageKind
                                 ? std::string(bootstrap::kind_name(static_cast<MessageKind>(theirs[1])))
                                 : fmt::format("unknown kind {}", theirs[1]);
    return error(Code::Mismatch, fmt::format("{}: rank {} is in {} #{} while rank {} is in {}: collectives must be "
                                             "called in the same order on every rank",
                                             x.what, r, their_kind, theirs[0], rank_, x.what));
  }
  return Status::ok();
}

Result<std::vector<std::string>> MpiGroup::gather_data(Exchange& x, Deadline deadline) {
  uint64_t total = 0;
  x.counts.resize(static_cast<size_t>(size_));
  x.displacements.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    x.displacements[r] = static_cast<int>(total);
    x.counts[r] = static_cast<int>(x.notices[r][2]);
    total += x.notices[r][2];
    if (x.notices[r][2] > static_cast<uint64_t>(INT32_MAX) || total > static_cast<uint64_t>(INT32_MAX))
      return error(Code::InvalidArgument, fmt::format("{}: {} bytes in all exceed MPI's int count (rank {} "
                                                      "contributes {})",
                                                      x.what, total, r, x.notices[r][2]));
  }
  x.gathered.resize(std::max<uint64_t>(total, 1));
  x.data.assign(1, MPI_REQUEST_NULL);
  const int code = serialized([&] {
    return MPI_Iallgatherv(x.mine.data(), static_cast<int>(x.mine.size()), MPI_BYTE, x.gathered.data(),
                           x.counts.data(), x.displacements.data(), MPI_BYTE, comm_, &x.data[0]);
  });
  if (code != MPI_SUCCESS)
    return error(Code::Backend, fmt::format("{}: MPI_Iallgatherv: {}", x.what, mpi_error_text(code)));
  auto unfinished = wait_requests(x.data, deadline);
  if (!unfinished.is_ok()) return unfinished.status().with_context(x.what);
  if (!unfinished->empty())
    return error(Code::Timeout, fmt::format("{}: every rank arrived, but the data exchange ({}) did not complete "
                                            "within {}; MPI cannot say which rank is behind in a collective",
                                            x.what, format_bytes(total), format_seconds(x.elapsed.seconds())));
  std::vector<std::string> result(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r)
    result[r].assign(x.gathered.data() + x.displacements[r], static_cast<size_t>(x.counts[r]));
  return result;
}

Result<std::vector<std::string>> MpiGroup::exchange(Collective collective, std::string mine, Deadline deadline) {
  const MessageKind kind = bootstrap::message_kind(collective);
  const uint64_t sequence = ++sequence_;
  auto x = std::make_unique<Exchange>();
  x->what = mpi_collective_name(kind, sequence);
  if (!broken_.is_ok())
    return error(broken_.code(),
                 fmt::format("{}: the group is unusable after an earlier failure: {}", x->what, broken_.message()));
  if (mine.size() > static_cast<size_t>(INT32_MAX))
    return error(Code::InvalidArgument, fmt::format("{}: {} exceeds MPI's int count", x->what, format_bytes(mine.size())));
  x->mine = std::move(mine);
  x->notice = {sequence, static_cast<uint64_t>(kind), x->mine.size()};
  if (Status noticed = exchange_notices(*x, deadline); !noticed.is_ok()) return fail(noticed, x);
  if (kind == MessageKind::Barrier) return std::vector<std::string>(static_cast<size_t>(size_));
  auto gathered = gather_data(*x, deadline);
  if (!gathered.is_ok()) return fail(gathered.status(), x);
  return gathered;
}

}  // namespace

Result<std::unique_ptr<ProcessGroup>> make_mpi_group(double connect_timeout_seconds, int stuck_init_exit_code) {
  if (!(connect_timeout_seconds > 0))
    return error(Code::InvalidArgument, "mpi group: connect timeout must be positive");
  EPLB_TRY(ensure_initialized(connect_timeout_seconds, stuck_init_exit_code));
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = serialized([&] {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request);
  });
  if (code != MPI_SUCCESS) return error(Code::Backend, "MPI_Comm_idup: " + mpi_error_text(code));
  std::vector<MPI_Request> requests{request};
  EPLB_ASSIGN_OR_RETURN(std::vector<size_t> pending,
                        wait_requests(requests, Deadline::after_seconds(connect_timeout_seconds)));
  if (!pending.empty()) {
    g_some_group_broken.store(true);
    return error(Code::Timeout, "mpi group: not every rank created its group within " +
                                    format_seconds(connect_timeout_seconds));
  }
  int rank = 0, size = 0;
  serialized([&] {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    return MPI_Comm_size(comm, &size);
  });
  return std::unique_ptr<ProcessGroup>(std::make_unique<MpiGroup>(comm, rank, size));
}

}  // namespace eplb

#endif  // EPLB_HAVE_MPI
