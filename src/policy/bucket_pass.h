// bucket_pass.h - one stable counting-sort pass over 64-bit keys (internal
// to src/policy/): the building block of the radix sort of deepseek's keys
// and of the split of a layer's sorted experts by node.
//
// Contract: stable_bucket_pass(from, to, count, buckets, digit) writes the
// keys of from[0, count) to to[0, count) ordered by digit(key) in
// [0, buckets), keys with equal digits in their input order. buckets <=
// kMaxBuckets. The keys are read as kStreams consecutive runs taken in
// turn, each run with its own counters: keys landing in one bucket one after
// the other then update different counters instead of each waiting for the
// previous increment (a store-to-load chain).
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

namespace eplb::deepseek_detail {

constexpr int kStreams = 4;
constexpr int kMaxBuckets = 256;

template <class Digit>
void stable_bucket_pass(const uint64_t* from, uint64_t* to, int count, int buckets, Digit digit) {
  int start[kStreams + 1];
  for (int s = 0; s <= kStreams; ++s) start[s] = s * count / kStreams;
  const int rounds = start[1];  // the shortest run: runs differ in length by at most one
  uint32_t next[kStreams][kMaxBuckets];
  for (int s = 0; s < kStreams; ++s) std::memset(next[s], 0, sizeof(uint32_t) * size_t(buckets));
  for (int i = 0; i < rounds; ++i)
    for (int s = 0; s < kStreams; ++s) ++next[s][digit(from[start[s] + i])];
  for (int s = 0; s < kStreams; ++s)
    for (int i = start[s] + rounds; i < start[s + 1]; ++i) ++next[s][digit(from[i])];
  uint32_t offset = 0;  // bucket-major, runs in order inside a bucket: stable
  for (int b = 0; b < buckets; ++b)
    for (int s = 0; s < kStreams; ++s) offset += std::exchange(next[s][b], offset);
  for (int i = 0; i < rounds; ++i)
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t key = from[start[s] + i];
      to[next[s][digit(key)]++] = key;
    }
  for (int s = 0; s < kStreams; ++s)
    for (int i = start[s] + rounds; i < start[s + 1]; ++i) to[next[s][digit(from[i])]++] = from[i];
}

}  // namespace eplb::deepseek_detail
