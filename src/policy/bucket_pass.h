// bucket_pass.h - one stable counting-sort pass over 64-bit keys (internal
// to src/policy/): the building block of the radix sort of deepseek's keys
// and of the split of a layer's sorted experts by node.
//
// Contract: stable_bucket_pass<S>(from, to, count, buckets, digit) writes the
// keys of from[0, count) to to[0, count) ordered by digit(key) in
// [0, buckets), keys with equal digits in their input order. buckets <=
// kMaxBuckets. The keys are read as S consecutive runs taken in turn, each
// run with its own counters: keys landing in one bucket one after the other
// then update different counters instead of each waiting for the previous
// increment (a store-to-load chain). S = 1 suits short inputs, where the
// counters' set-up and prefix sums cost more than such chains.
#pragma once

#include <cstdint>
#include <cstring>

namespace eplb::deepseek_detail {

constexpr int kStreams = 4;
constexpr int kMaxBuckets = 256;

// Turns per-run counts into each run's first output index, bucket-major and
// runs in order inside a bucket (stable). Only the bucket totals form a
// serial chain; the loops over runs vectorize.
template <int S>
void counts_to_offsets(uint32_t (&next)[S][kMaxBuckets], int buckets) {
  uint32_t base[kMaxBuckets];
  for (int b = 0; b < buckets; ++b) {
    uint32_t total = 0;
    for (int s = 0; s < S; ++s) total += next[s][b];
    base[b] = total;
  }
  uint32_t offset = 0;
  for (int b = 0; b < buckets; ++b) {
    const uint32_t total = base[b];
    base[b] = offset;
    offset += total;
  }
  for (int s = 0; s < S; ++s)
    for (int b = 0; b < buckets; ++b) {
      const uint32_t count = next[s][b];
      next[s][b] = base[b];
      base[b] += count;
    }
}

template <int S = kStreams, class Digit>
void stable_bucket_pass(const uint64_t* from, uint64_t* to, int count, int buckets, Digit digit) {
  int start[S + 1];
  for (int s = 0; s <= S; ++s) start[s] = s * count / S;
  const int rounds = start[1];  // the shortest run: runs differ in length by at most one
  uint32_t next[S][kMaxBuckets];
  for (int s = 0; s < S; ++s) std::memset(next[s], 0, sizeof(uint32_t) * size_t(buckets));
  for (int i = 0; i < rounds; ++i)
    for (int s = 0; s < S; ++s) ++next[s][digit(from[start[s] + i])];
  for (int s = 0; s < S; ++s)
    for (int i = start[s] + rounds; i < start[s + 1]; ++i) ++next[s][digit(from[i])];
  counts_to_offsets<S>(next, buckets);
  for (int i = 0; i < rounds; ++i)
    for (int s = 0; s < S; ++s) {
      const uint64_t key = from[start[s] + i];
      to[next[s][digit(key)]++] = key;
    }
  for (int s = 0; s < S; ++s)
    for (int i = start[s] + rounds; i < start[s + 1]; ++i) to[next[s][digit(from[i])]++] = from[i];
}

}  // namespace eplb::deepseek_detail
