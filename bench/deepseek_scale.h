// deepseek_scale.h - the load of issue 16, a heap meter, and the scale
// table of `deepseek_bench --scale` (bench/deepseek.sh --scale).
//
// Included by deepseek_bench.cpp only: it replaces the global operator new
// and delete to count allocations and the peak of live heap bytes.
//
// The scale table times deepseek_placement (1 and 2 threads, median and
// range of REPS calls after one warm-up) while one factor of the shape
// grows from the DeepSeek-V3 shape (L=58 E=256 R=288 G=8 N=4 P=32), and
// prints the growth per factor: the time ratio to the previous row of the
// series and its exponent log(time ratio) / log(factor ratio) (1.0 is
// linear). Memory: the peak of live heap bytes during one call beyond what
// was live before it, split into the returned placement and the rest
// (scratch), the rest also per L*R*4 bytes.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "eplb/common.h"
#include "keep_freed_memory.h"
#include "eplb/policy.h"

namespace eplb::bench {

inline std::atomic<uint64_t> g_allocations{0}, g_allocated_bytes{0};
inline std::atomic<int64_t> g_live_bytes{0}, g_peak_live_bytes{0};

inline void note_allocation(void* p) {
  const int64_t size = int64_t(malloc_usable_size(p));
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  g_allocated_bytes.fetch_add(uint64_t(size), std::memory_order_relaxed);
  const int64_t live = g_live_bytes.fetch_add(size, std::memory_order_relaxed) + size;
  int64_t peak = g_peak_live_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_live_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

struct HeapUse {
  uint64_t allocations = 0, bytes = 0;
  int64_t peak_extra = 0;  // peak live bytes during the measurement beyond the live bytes at its start
};

class HeapMeter {
 public:
  HeapMeter()
      : allocations_(g_allocations.load()), bytes_(g_allocated_bytes.load()), live_(g_live_bytes.load()) {
    g_peak_live_bytes.store(live_);
  }
  HeapUse read() const {
    return {g_allocations.load() - allocations_, g_allocated_bytes.load() - bytes_, g_peak_live_bytes.load() - live_};
  }

 private:
  uint64_t allocations_, bytes_;
  int64_t live_;
};

// The load of issue 16: round(u^4 * 1000) + 1 with u uniform in [0, 1).
inline LoadMatrix issue_load(int layers, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  LoadMatrix load(layers, experts);
  for (double& value : load.values) value = std::nearbyint(std::pow(uniform(rng), 4) * 1000.0) + 1.0;
  return load;
}

struct ScaleRow {
  const char* series;  // the factor that grows
  Topology topology;
  double factor;  // its value
};

struct Timing {
  double median = 0, low = 0, high = 0;
};

inline Timing time_calls(const LoadMatrix& load, const Topology& topology, int threads, int reps) {
  std::vector<double> seconds;
  (void)deepseek_placement(load, topology, threads);  // warm-up
  for (int i = 0; i < reps; ++i) {
    Stopwatch watch;
    auto placement = deepseek_placement(load, topology, threads);
    seconds.push_back(watch.seconds());
    if (!placement.is_ok()) {
      std::fprintf(stderr, "deepseek_bench: %s\n", placement.status().to_string().c_str());
      std::exit(1);
    }
  }
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], seconds.front(), seconds.back()};
}

inline std::vector<ScaleRow> scale_rows() {
  auto shape = [](int layers, int experts, int slots, int ranks) {
    return Topology{layers, experts, slots, 8, 4, ranks};
  };
  return {
      {"base", shape(58, 256, 288, 32), 1},
      {"L", shape(116, 256, 288, 32), 116},     {"L", shape(256, 256, 288, 32), 256},
      {"E,R", shape(58, 512, 576, 32), 512},    {"E,R", shape(58, 1024, 1152, 32), 1024},
      {"R", shape(58, 256, 576, 32), 576},      {"R", shape(58, 256, 1152, 32), 1152},
      {"P", shape(58, 1024, 1152, 64), 64},     {"P", shape(58, 1024, 1152, 128), 128},
      {"L,E,R,P", shape(256, 1024, 1152, 128), 1}, {"L,E,R,P", shape(256, 1024, 1280, 256), 1},
  };
}

// The previous row of the same series (for "P", the E=1024 R=1152 P=32 row;
// for the first row of a series, the base).
inline const ScaleRow* previous_in_series(const std::vector<ScaleRow>& rows, size_t i) {
  for (size_t j = i; j-- > 0;)
    if (std::string(rows[j].series) == rows[i].series) return &rows[j];
  if (std::string(rows[i].series) == "P") return &rows[4];
  return &rows[0];
}

inline double base_factor(const ScaleRow& row, const std::string& series) {
  const Topology& t = row.topology;
  if (series == "L") return t.num_layers;
  if (series == "E,R") return t.num_experts;
  if (series == "R") return t.num_slots;
  if (series == "P") return t.num_ranks;
  return 1;
}

inline void print_scale_row(const ScaleRow& row, const Timing& one, const Timing& two, const ScaleRow* previous,
                            double previous_median, const HeapUse& heap, const Placement& placement) {
  const Topology& t = row.topology;
  const double output = double(placement.phy2log_data().size() + placement.log2phy_data().size() +
                               placement.logcnt_data().size()) * 4.0;
  const double scratch = double(heap.peak_extra) - output;
  const double lr_bytes = double(t.num_layers) * t.num_slots * 4.0;
  char growth[48] = "-";
  if (previous != nullptr) {
    const std::string series = row.series;
    const double ratio = one.median / previous_median;
    const double factor = base_factor(row, series) / base_factor(*previous, series);
    if (factor > 1) std::snprintf(growth, sizeof growth, "x%.2f (exp %.2f)", ratio, std::log(ratio) / std::log(factor));
  }
  std::printf("%-8s %4d %5d %5d %4d %2d | %9.3f [%7.3f-%8.3f] %9.3f %5.2fx | %-17s | %8.0f %8.0f %6.2f %3d\n",
              row.series, t.num_layers, t.num_experts, t.num_slots, t.num_ranks, t.num_nodes, one.median * 1e3,
              one.low * 1e3, one.high * 1e3, two.median * 1e3, one.median / two.median, growth, output / 1024,
              scratch / 1024, scratch / lr_bytes, placement.max_replicas());
}

inline int scale_table(int reps) {
  reps = std::max(reps, 3);
  const auto rows = scale_rows();
  std::printf("deepseek_placement scale table: median [min-max] of %d calls (ms); L layers, E experts, R slots,\n"
              "P ranks, N nodes, 8 groups; loads round(rand^4 * 1000) + 1. growth: time ratio to the previous row\n"
              "of the series and exponent log(time ratio)/log(factor ratio). Memory: peak live heap of one call\n"
              "beyond the input, as the returned placement (out) and the rest (scratch), KiB; scratch/LR4 = scratch\n"
              "per L*R*4 bytes. W = log2phy's width (largest replica count).\n\n",
              reps);
  std::printf("%-8s %4s %5s %5s %4s %2s | %9s %17s %9s %6s | %-17s | %8s %8s %6s %3s\n", "series", "L", "E", "R", "P",
              "N", "1 thread", "range", "2 threads", "speed", "growth (1 thread)", "out KiB", "scratch", "/LR4", "W");
  std::vector<double> medians;
  for (size_t i = 0; i < rows.size(); ++i) {
    const ScaleRow& row = rows[i];
    const LoadMatrix load = issue_load(row.topology.num_layers, row.topology.num_experts, 16);
    const Timing one = time_calls(load, row.topology, 1, reps);
    const Timing two = time_calls(load, row.topology, 2, reps);
    HeapMeter meter;
    const Placement placement = deepseek_placement(load, row.topology, 1).value();
    const HeapUse heap = meter.read();
    medians.push_back(one.median);
    const ScaleRow* previous = i == 0 || std::string(row.series) == "L,E,R,P" ? nullptr : previous_in_series(rows, i);
    const double previous_median = previous ? medians[size_t(previous - rows.data())] : 0;
    print_scale_row(row, one, two, previous, previous_median, heap, placement);
  }
  std::printf("\nR = 1152 is not a multiple of P = 256, so the largest row uses R = 1280 (5 slots per rank).\n");
  return 0;
}

}  // namespace eplb::bench

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t size) {
  if (void* p = std::malloc(size ? size : 1)) {
    eplb::bench::note_allocation(p);
    return p;
  }
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  eplb::bench::g_live_bytes.fetch_sub(int64_t(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }
#pragma GCC diagnostic pop
