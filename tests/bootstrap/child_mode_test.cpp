// Child mode: the launcher and MPI tests re-execute this test binary with
// --gtest_filter=BootstrapChildMode.Run and EPLB_TEST_CHILD_MODE set; the
// "test" then plays one rank and exits with a code the parent checks (and,
// when EPLB_TEST_RESULT_DIR is set, writes its verdict to <dir>/<rank>).
// Run normally, it skips.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "eplb/bootstrap.h"
#include "test_support.h"

namespace eplb {
namespace {

using testing::contribution;

void write_verdict(int rank, const std::string& text) {
  const char* dir = std::getenv("EPLB_TEST_RESULT_DIR");
  if (!dir) return;
  std::ofstream(std::string(dir) + "/" + std::to_string(rank)) << text;
}

// The exit code convention of the eplb CLI: 4 timeout, 5 peer lost, 1 other.
int exit_code_for(const Status& status) {
  if (status.is_ok()) return 0;
  if (status.code() == Code::Timeout) return 4;
  if (status.code() == Code::RemoteDisconnect) return 5;
  return 1;
}

// Allgather of varied sizes, a barrier, and a vote with one "no".
Status exercise(ProcessGroup& group) {
  const int size = group.size();
  const int rank = group.rank();
  for (int round = 0; round < 3; ++round) {
    auto length = [&](int r) { return static_cast<size_t>((r * 1000 + round * 77) % 4000); };
    EPLB_ASSIGN_OR_RETURN(auto all, group.allgather(contribution(rank, round, length(rank)), Deadline::after_seconds(20)));
    for (int r = 0; r < size; ++r)
      if (all[r] != contribution(r, round, length(r)))
        return error(Code::Mismatch, "allgather content from rank " + std::to_string(r));
  }
  EPLB_TRY(group.barrier(Deadline::after_seconds(20)));
  std::vector<std::string> reasons;
  EPLB_ASSIGN_OR_RETURN(bool yes, group.vote(rank != size - 1, rank == size - 1 ? "last rank says no" : "",
                                            Deadline::after_seconds(20), &reasons));
  if (yes || reasons.size() != static_cast<size_t>(size) || reasons[size - 1] != "last rank says no")
    return error(Code::Mismatch, "vote result");
  return Status::ok();
}

int run_local(const std::string& mode) {
  auto options = local_group_options_from_env();
  if (!options.is_ok()) {
    std::fprintf(stderr, "child: %s\n", options.status().to_string().c_str());
    return 2;
  }
  auto group = make_local_group(*options);
  if (!group.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", options->rank, group.status().to_string().c_str());
    return exit_code_for(group.status());
  }
  ProcessGroup& g = **group;
  if (mode == "local_exercise") {
    Status status = exercise(g);
    if (!status.is_ok()) std::fprintf(stderr, "rank %d: %s\n", g.rank(), status.to_string().c_str());
    return exit_code_for(status);
  }
  if (mode == "local_kill") {  // the last rank dies; the others report it and exit 5
    if (!g.barrier(Deadline::after_seconds(20)).is_ok()) return 1;
    if (g.rank() == g.size() - 1) ::raise(SIGKILL);
    Status status = g.allgather("x", Deadline::after_seconds(10)).status();
    std::fprintf(stderr, "rank %d: %s\n", g.rank(), status.to_string().c_str());
    return exit_code_for(status);
  }
  return 2;
}

int run_mpi(const std::string& mode) {
  auto group = make_mpi_group(30);
  if (!group.is_ok()) {
    std::fprintf(stderr, "mpi child: %s\n", group.status().to_string().c_str());
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    write_verdict(world_rank ? std::atoi(world_rank) : 0, group.status().to_string());
    return exit_code_for(group.status());
  }
  ProcessGroup& g = **group;
  Status status;
  if (mode == "mpi_exercise") {
    status = exercise(g);
  } else if (mode == "mpi_kill") {  // the last rank dies after a barrier
    status = g.barrier(Deadline::after_seconds(20));
    if (status.is_ok()) {
      if (g.rank() == g.size() - 1) ::raise(SIGKILL);
      status = g.allgather("x", Deadline::after_seconds(10)).status();
    }
  } else if (mode == "mpi_timeout") {  // the last rank is late: the others time out naming it
    status = g.barrier(Deadline::after_seconds(20));
    if (status.is_ok()) {
      if (g.rank() == g.size() - 1) {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        write_verdict(g.rank(), "late rank slept");
        // Not through MPI_Finalize: the others left without it (their
        // group is broken), and a finalize waiting for them could outlast
        // mpirun's teardown (once, under tsan, the job took 90 s to end).
        std::fflush(nullptr);
        ::_exit(0);
      }
      status = g.allgather("x", Deadline::after_seconds(1)).status();
      write_verdict(g.rank(), status.to_string());
      // mpirun stops the job when the first rank exits non-zero: give the
      // others time to reach their own deadline and write their verdicts.
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  write_verdict(g.rank(), status.is_ok() ? std::string("ok on ") + host : status.to_string());
  if (!status.is_ok()) std::fprintf(stderr, "rank %d: %s\n", g.rank(), status.to_string().c_str());
  return exit_code_for(status);
}

TEST(BootstrapChildMode, Run) {
  const char* mode = std::getenv("EPLB_TEST_CHILD_MODE");
  if (!mode) GTEST_SKIP() << "only runs as a child of the launcher/MPI tests (EPLB_TEST_CHILD_MODE)";
  std::string text(mode);
  int code = text.starts_with("mpi") ? run_mpi(text) : run_local(text);
  std::fflush(nullptr);
  // exit() rather than _exit(): MPI_Finalize runs from atexit.
  std::exit(code);
}

}  // namespace
}  // namespace eplb
