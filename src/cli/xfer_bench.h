// xfer_bench.h - the parts of `eplb xfer-bench` (cmd_xfer_bench.cpp) that
// the initiator and the target share: the options, the control-socket wire
// (length-prefixed messages, every blocking read and write bounded), the
// --check content, the transport and buffer setup, CPU pinning, and the
// target's serve loop. Contract: nothing here talks to UCX except through
// xfer::Agent; every wait on a socket has a deadline.
#pragma once

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
  int listen_port = 0;
  double listen_timeout_seconds = 600;  // how long --listen waits for its --peer
  int serve_fd = -1;
  bool check = false;
  bool json = false;
  bool yield = true;
  bool reuse_request = false;  // make one request per block size and repost it
  bool target_spin = false;    // the target progresses continuously even when the peer does not need it
  int target_poll_ms = 100;    // otherwise it sleeps on its control socket this long between progress calls
  int cpu = -1;                // pin this process to this CPU (-1: no pinning)
  int target_cpu = -1;         // pin the forked target to this CPU (-1: no pinning)
  double timeout_seconds = 30;
};

// --- control socket (xfer_bench_wire.cpp) --------------------------------------
// Message: [u8 type][u64 length][payload], payload <= 16 MiB.

bool send_message(int fd, char type, const std::vector<uint8_t>& payload);
bool receive_message(int fd, char* type, std::vector<uint8_t>* payload);
// Bounds every blocking read and write on `fd` to `seconds` (then they fail).
void set_io_timeout(int fd, double seconds);
void put_u64(std::vector<uint8_t>& out, uint64_t value);
uint64_t get_u64(const std::vector<uint8_t>& in, size_t offset);  // 0 past the end
// Connects to HOST:PORT.
Result<int> connect_to(const std::string& peer);
// Waits up to `timeout_seconds` for one connection on `port`.
Result<int> accept_one(int port, double timeout_seconds);

// --- content for --check ----------------------------------------------------------

uint8_t pattern_byte(uint64_t i);
void fill_pattern(uint8_t* data, size_t length, uint64_t salt);
uint64_t fnv1a(const uint8_t* data, size_t length);

// --- setup and the target (xfer_bench_target.cpp) -----------------------------

// shm, tcp or env -> UCX_TLS / UCX_NET_DEVICES.
Status apply_transport(const std::string& transport);
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

// Serves one initiator on `fd` until 'Q' or EOF: sends [u64 buffer address]
// [u64 buffer bytes][metadata], then answers 'H' (hash a range).
Status serve(const BenchOptions& options, int fd, uint64_t buffer_bytes);

}  // namespace eplb::cli::xfer_bench
