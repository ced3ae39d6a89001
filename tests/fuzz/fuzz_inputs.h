// What the fuzz gtests feed their bodies: the committed seed corpus (tests/fuzz/corpus/<name>,
// MNEMO_FUZZ_CORPUS_DIR) and byte-level mutations of it, in the spirit of libFuzzer's, from a
// fixed seed (so a failure reproduces). MNEMO_FUZZ_ITERS sets the number of mutations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/rng.h"

namespace mnemo::test {

struct Seed {
  std::string name;
  std::string bytes;
};

inline std::vector<Seed> Corpus(const std::string& name) {
  std::vector<Seed> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(MNEMO_FUZZ_CORPUS_DIR) + "/" + name)) {
    std::ifstream f(e.path(), std::ios::binary);
    out.push_back({e.path().filename().string(), std::string(std::istreambuf_iterator<char>(f), {})});
  }
  std::sort(out.begin(), out.end(), [](const Seed& a, const Seed& b) { return a.name < b.name; });
  return out;
}

inline int FuzzIters(int fallback) {
  const char* env = std::getenv("MNEMO_FUZZ_ITERS");
  return env ? std::max(1, std::atoi(env)) : fallback;
}

// 1 to 4 edits of `s`: a random byte, a byte flip, a deleted run, a duplicated run, a token from
// `dict` inserted or written over, a piece of `other` spliced in, a cut.
inline std::string Mutate(std::string s, const std::string& other, const std::vector<std::string>& dict, Rng& rng) {
  const int n = 1 + int(rng.Next() % 4);
  for (int k = 0; k < n; k++) {
    const size_t pos = s.empty() ? 0 : rng.Next() % (s.size() + 1);
    const size_t len = 1 + rng.Next() % 16;
    switch (rng.Next() % 7) {
      case 0:
        if (pos < s.size()) s[pos] = char(rng.Next());
        break;
      case 1:
        if (pos < s.size()) s[pos] = char(s[pos] ^ (1 << (rng.Next() % 8)));
        break;
      case 2:
        s.erase(std::min(pos, s.size()), len);
        break;
      case 3:
        s.insert(pos, s.substr(std::min(pos, s.size()), len));
        break;
      case 4:
        s.insert(pos, dict[rng.Next() % dict.size()]);
        break;
      case 5: {
        const std::string& d = dict[rng.Next() % dict.size()];
        s.replace(std::min(pos, s.size()), d.size(), d);
        break;
      }
      case 6: {
        const size_t from = other.empty() ? 0 : rng.Next() % other.size();
        s.insert(pos, other.substr(from, len * 4));
        break;
      }
    }
  }
  if (rng.Next() % 16 == 0 && !s.empty()) s.resize(rng.Next() % s.size());
  return s;
}

}  // namespace mnemo::test
