// random.h - the sim module's own pseudo-random numbers (private).
//
// splitmix64 for seeding and mixing, xoshiro256** for streams, and normal
// and Poisson samplers written out here so that the output never depends on
// a standard library's distribution implementation.
#pragma once

#include <cmath>
#include <cstdint>

namespace eplb::sim {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The splitmix64 finalizer: a bijection on 64-bit words with good avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& word : state_) {
      seed += kGolden;
      word = mix64(seed);
    }
  }

  uint64_t next() {
    uint64_t result = rotl(state_[1] * 5, 7) * 9;
    uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1), 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1].
  double uniform_open_zero() { return double((next() >> 11) + 1) * 0x1.0p-53; }

  // Standard normal (Box-Muller, one value per call).
  double normal() {
    double radius = std::sqrt(-2.0 * std::log(uniform_open_zero()));
    return radius * std::cos(6.283185307179586 * uniform());
  }

  // Poisson-distributed count with the given mean: exact (Knuth) below 30,
  // a rounded normal approximation above.
  double poisson(double mean) {
    if (!(mean > 0)) return 0;
    if (mean < 30) {
      double limit = std::exp(-mean), product = 1;
      int count = -1;
      do {
        ++count;
        product *= uniform();
      } while (product > limit);
      return count;
    }
    double sample = std::floor(mean + std::sqrt(mean) * normal() + 0.5);
    return sample < 0 ? 0 : sample;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

}  // namespace eplb::sim
