// xfer_bench.h - the parts of `eplb xfer-bench` (cmd_xfer_bench.cpp) that
// the initiator and the target share: the options, the control-socket wire
// (length-prefixed messages, every blocking read and write bounded), the
// --check content, the transport and buffer setup, CPU pinning, and the
// target's serve loop. Contract: nothing here talks to UCX except through
// xfer::Agent; every wait on a socket has a deadline.
#pragma once

#include <fmt/format.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "eplb/common.h"
#include "eplb/xfer.h"

namespace eplb::cli::xfer_bench {

struct BenchOptions {
  std::string op = "read";
  std::string block_sizes = "4K..64M";
  int batch = 1;
  int iterations = 0;  // 0: automatic
  int warmup = 3;
  std::string transport = "shm";
  std::string backend = "ucx";
  std::string memory = "ucx";  // ucx: Agent::allocate_memory; user: heap + register_memory
  std::string peer;
  int listen_port = 0;                  // 0: fork a target (--listen takes 1-65535)
  std::string bind_address = "127.0.0.1";  // where --listen binds
  double listen_timeout_seconds = 600;  // how long --listen waits for its --peer
  int serve_fd = -1;
  bool check = false;
  bool json = false;
  bool yield = true;
  bool reuse_request = false;  // make one request per block size and repost it
  bool through_ucx = false;    // AgentConfig::copy_mapped_memory = false
  bool target_spin = false;    // the target progresses continuously even when the peer does not need it
  int target_poll_ms = 100;    // otherwise it sleeps on its control socket this long between progress calls
  int cpu = -1;                // pin this process to this CPU (-1: no pinning)
  int target_cpu = -1;         // pin the forked target to this CPU (-1: no pinning)
  double timeout_seconds = 30;
};

// --- control socket (xfer_bench_wire.cpp) --------------------------------------
// Message: [u8 type][u64 length, little-endian][payload], payload <= 16 MiB.

bool send_message(int fd, char type, const std::vector<uint8_t>& payload);
bool receive_message(int fd, char* type, std::vector<uint8_t>* payload);
// Bounds every blocking read and write on `fd` to `seconds` (then they fail).
void set_io_timeout(int fd, double seconds);
// Message fields are little-endian (common/bytes.h).
// InvalidArgument unless `peer` is HOST:PORT (PORT 1-65535).
Status check_peer(const std::string& peer);
// Connects to HOST:PORT (checked as check_peer does).
Result<int> connect_to(const std::string& peer);
// Waits up to `timeout_seconds` for one connection on `bind_address`:`port`.
Result<int> accept_one(const std::string& bind_address, int port, double timeout_seconds);

// --- who may use a --listen target ----------------------------------------------
// A --listen target serves only an initiator whose first message is 'A' with
// the 32 raw bytes of the secret EPLB_XFER_BENCH_SECRET (64 hex digits). The
// target takes it from its environment or, when unset, makes a fresh one and
// prints it on stderr; the --peer side must have it set. A forked target
// (a private socketpair) needs none.
Result<std::string> listen_secret();
Result<std::string> peer_secret();
bool send_secret(int fd, const std::string& raw_secret);
// NotAllowed (nothing is sent) unless the next message is 'A' with the
// secret; Timeout when nothing comes within `timeout_seconds`.
Status check_secret(int fd, const std::string& raw_secret, double timeout_seconds);

// --- content for --check ----------------------------------------------------------

uint8_t pattern_byte(uint64_t i);
void fill_pattern(uint8_t* data, size_t length, uint64_t salt);

// --- setup and the target (xfer_bench_target.cpp) -----------------------------

// shm, tcp or env (UCX's own choice / the environment) -> the agent's
// transports and devices (a UCX_TLS or UCX_NET_DEVICES in the environment wins).
Status check_transport(const std::string& transport);
Result<std::unique_ptr<xfer::Agent>> make_agent(const BenchOptions& options, const std::string& name);

// A registered buffer: allocated by the backend (--memory ucx) or on the heap
// and registered (--memory user).
struct Buffer {
  std::vector<uint8_t> heap;
  uint8_t* data = nullptr;
  size_t size = 0;
};
Result<Buffer> make_buffer(const BenchOptions& options, xfer::Agent& agent, size_t bytes);

// A CPU number given to --cpu / --target-cpu (`what`): -1 or an existing CPU.
Status check_cpu(int cpu, const char* what);
// Pins the calling process to one CPU (`what` names it in the error).
Status pin_to_cpu(int cpu, const char* what);

// Serves one initiator on `fd` until 'Q' or EOF: checks its secret (when
// `raw_secret` is not empty), sends [u64 buffer address][u64 buffer bytes]
// [metadata], then answers 'H' (the XXH3 of a range).
Status serve(const BenchOptions& options, int fd, uint64_t buffer_bytes, const std::string& raw_secret = {});

// --- the initiator's rows (xfer_bench_row.cpp) ------------------------------------

// The target as the initiator sees it.
struct Target {
  int fd = -1;
  pid_t pid = -1;  // forked child, if any
  uint64_t address = 0;
  uint64_t bytes = 0;
  std::string name;
};

// One block size's measurement.
struct Row {
  uint64_t block = 0;
  int batch = 0;
  int iterations = 0;
  double gigabytes_per_second = 0;
  double average_latency_us = 0;
  double median_latency_us = 0;  // p50 of prepare + post + completion, every 16th request
  double prepare_us = 0, prepare_p99_us = 0;
  double post_us = 0, post_p99_us = 0;
  double completion_us = 0, completion_p99_us = 0;
  std::string check = "-";
  double memcpy_gigabytes_per_second = 0;  // reference: local memcpy of the same bytes
};

// "4K", "1M", "64M", "1G", "1000".
std::string size_label(uint64_t bytes);
Result<Row> run_row(const BenchOptions& options, xfer::Agent& agent, Target& target, xfer::Operation op,
                    uint64_t block, uint8_t* local);

}  // namespace eplb::cli::xfer_bench
