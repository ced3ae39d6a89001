// GGUF v3 writer that streams tensor data: declare metadata and tensors, Begin() writes the header,
// then Append() the tensor bytes in declaration order (in any chunk sizes), then Finish(). Only the
// header is held in memory, so multi-GB models can be written with bounded memory.
//
// The file is written to "<path>.tmp" and renamed to path by Finish(), so a failed or interrupted
// write never leaves a truncated model under the final name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "format/gguf.h"

namespace mnemo::gguf {

class GgufWriter {
 public:
  // alignment: data alignment in bytes (a power of two); when it is not 32 the caller must also
  // add general.alignment (the reader's default is 32).
  explicit GgufWriter(uint64_t alignment = 32);
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;
  ~GgufWriter();

  // Metadata, written in call order. Errors (duplicate keys) are reported by Begin().
  void AddU32(const std::string& key, uint32_t v);
  void AddI32(const std::string& key, int32_t v);
  void AddU64(const std::string& key, uint64_t v);
  void AddF32(const std::string& key, float v);
  void AddBool(const std::string& key, bool v);
  void AddString(const std::string& key, const std::string& v);
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  void AddF32Array(const std::string& key, const std::vector<float>& v);
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v);
  // Copies a value read from another GGUF file (any type, nested arrays included).
  void AddValue(const std::string& key, const Value& v);

  // Declares a tensor: dims in GGUF order (ne[0] fastest), ggml type id. Its data follows the
  // previous tensor's, padded to the alignment.
  void AddTensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t ggml_type);

  // Opens path.tmp and writes the header, metadata and tensor infos.
  Status Begin(const std::string& path);
  // Writes the next n bytes of tensor data; a tensor's padding is added when its last byte is in.
  Status Append(const void* data, size_t n);
  // Checks that all tensor data was written, closes the file and renames it to path.
  Status Finish();

  // Bytes of tensor data still expected by Append (all tensors).
  uint64_t remaining_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;
    uint64_t nbytes;  // data bytes
    uint64_t offset;  // from the start of the data section
  };
  void Key(const std::string& key, ValueType t);
  void PutValue(const Value& v, bool with_type);
  void PutString(std::string_view s);
  template <class T>
  void Put(T v);
  Status Write(const void* p, size_t n);
  Error Fail(Error e);  // records the first error and returns it

  uint64_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_bytes_;        // serialised metadata
  std::set<std::string> keys_;
  std::vector<PendingTensor> tensors_;
  uint64_t data_bytes_ = 0;              // data section size so far (padded)
  Error error_;                          // first error, sticky
  std::string path_, tmp_path_;
  FILE* file_ = nullptr;
  size_t cur_ = 0;                       // tensor being appended
  uint64_t cur_written_ = 0;             // bytes of it written
};

}  // namespace mnemo::gguf
