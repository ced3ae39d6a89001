// Test helper: builds GGUF files byte by byte, including malformed ones.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace mnemo::test {

struct GgufBytes {
  std::vector<uint8_t> b;

  template <class T>
  GgufBytes& Put(T v) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  GgufBytes& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return Put(version).Put(n_tensors).Put(n_kv);
  }
  GgufBytes& KvU32(const std::string& k, uint32_t v) { return Str(k).Put<uint32_t>(4).Put(v); }
  GgufBytes& KvStr(const std::string& k, const std::string& v) { return Str(k).Put<uint32_t>(8).Str(v); }
  // Tensor info: name, dims (ne[0] first), ggml type, offset.
  GgufBytes& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    Str(name).Put<uint32_t>(dims.size());
    for (uint64_t d : dims) Put(d);
    return Put(type).Put(offset);
  }
  GgufBytes& Align(size_t a) {
    while (b.size() % a) b.push_back(0);
    return *this;
  }
  GgufBytes& Zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

}  // namespace mnemo::test
