// Deterministic random numbers (xoshiro256**, seeded by splitmix64): same seed, same stream on
// every platform, unlike std::distributions.
#pragma once

#include <cstdint>

namespace mnemo {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t Next();
  // Uniform in [0, 1) with 24 bits (float) or 53 bits (double).
  float Uniform();
  double UniformDouble();
  // Standard normal (Box-Muller).
  double Normal();

 private:
  uint64_t s_[4];
};

}  // namespace mnemo
