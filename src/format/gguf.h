// GGUF reader (versions 2 and 3, little-endian): metadata key/values, tensor infos, and the tensor
// data in place in a read-only memory map.
//
// Every count, length and offset is checked against the file size before it is used, so a truncated
// or hostile file yields an Error, never a crash or an allocation larger than the file itself.
// Strings and arrays point into the mapped file: they stay valid as long as the GgufFile lives
// (moving the GgufFile keeps them valid; the map does not move).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "format/mapped_file.h"

namespace mnemo::gguf {

enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* ValueTypeName(ValueType t);
// Bytes of one scalar of type t in the file; 0 for string and array (variable size).
size_t ValueTypeSize(ValueType t);

// ggml tensor type ids used in GGUF tensor infos (the ones mnemo computes with).
constexpr uint32_t kGgmlF32 = 0;
constexpr uint32_t kGgmlF16 = 1;
constexpr uint32_t kGgmlQ8_0 = 8;
constexpr uint32_t kGgmlBF16 = 30;

// Layout of a ggml type: elements per block and bytes per block. nullopt for ids ggml does not
// define (or that were removed from it).
struct GgmlTypeInfo {
  const char* name;     // "q4_K", ...
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
};
std::optional<GgmlTypeInfo> GgmlType(uint32_t type);
// The DType for a ggml type mnemo supports (every DType: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
// q5_1, q2_K .. q6_K, iq4_nl, iq4_xs), else nullopt; DTypeToGgml is its inverse.
std::optional<DType> GgmlToDType(uint32_t type);
uint32_t DTypeToGgml(DType t);

// One metadata value. Scalars live in u/i/f/str; arrays keep their raw little-endian bytes
// (numeric), their strings (string arrays) or their nested arrays.
struct Value {
  ValueType type = ValueType::kU8;
  uint64_t u = 0;              // unsigned integers and bool (0/1)
  int64_t i = 0;               // signed integers
  double f = 0;                // f32 / f64
  std::string_view str;        // kString (points into the file)
  ValueType elem = ValueType::kU8;         // kArray: element type
  uint64_t count = 0;                      // kArray: number of elements
  const uint8_t* raw = nullptr;            // kArray of numbers/bools: count * ValueTypeSize(elem) bytes
  std::vector<std::string_view> strings;   // kArray of strings: [count]
  std::vector<Value> arrays;               // kArray of arrays: [count]

  bool IsInteger() const;  // any integer scalar type (not bool)
  bool IsFloat() const;    // f32 or f64 scalar
  // Integer value as int64 / uint64 if the scalar is an integer that fits, else nullopt.
  std::optional<int64_t> AsInt() const;
  std::optional<uint64_t> AsUint() const;
  // Array element k as a number (numeric arrays only; k < count).
  double NumberAt(uint64_t k) const;
  // Human-readable rendering (arrays abbreviated), for inspect output and errors.
  std::string ToString(size_t max_items = 8) const;
};

struct KeyValue {
  std::string_view key;  // points into the file
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;     // GGUF order: dims[0] (ne[0]) varies fastest
  uint32_t type = 0;             // ggml type id
  std::optional<DType> dtype;    // set when mnemo supports the type
  uint64_t offset = 0;           // bytes from the start of the data section
  uint64_t nbytes = 0;           // bytes of data
  int64_t n_elements = 0;        // product of dims
  const void* data = nullptr;    // into the map, aligned to the file's alignment
};

class GgufFile {
 public:
  // Maps and parses the file at path.
  static Result<GgufFile> Open(const std::string& path);
  // Parses a copy of bytes held in memory (tests and fuzzing).
  static Result<GgufFile> FromBytes(const void* data, size_t size);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

  const std::vector<KeyValue>& metadata() const { return kvs_; }
  const Value* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters: an Error names the key when it is missing, has the wrong type, or does not
  // fit. Integer getters accept any integer type whose value fits; GetF32 accepts f32 and f64.
  Result<uint32_t> GetU32(std::string_view key) const;
  Result<uint64_t> GetU64(std::string_view key) const;
  Result<int64_t> GetI64(std::string_view key) const;
  Result<float> GetF32(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  // The same, with a default when the key is absent (a present key of the wrong type is an Error).
  Result<uint32_t> GetU32Or(std::string_view key, uint32_t def) const;
  Result<float> GetF32Or(std::string_view key, float def) const;
  Result<bool> GetBoolOr(std::string_view key, bool def) const;
  Result<std::string> GetStringOr(std::string_view key, std::string def) const;

  // Array getters (the whole array, converted): strings; f32/f64 as float; integers as int32
  // (values must fit); the array length.
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  Result<std::vector<float>> GetF32Array(std::string_view key) const;
  Result<std::vector<int32_t>> GetI32Array(std::string_view key) const;
  Result<uint64_t> GetArrayLength(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  static Result<GgufFile> Parse(GgufFile f);
  const Value* FindTyped(std::string_view key, Error* err) const;

  MappedFile map_;                               // when opened from a path
  std::unique_ptr<std::vector<uint8_t>> owned_;  // when parsed from bytes
  const uint8_t* base_ = nullptr;                // start of the file bytes
  uint64_t size_ = 0;                            // file bytes
  std::string path_;                             // or "<memory>"
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kvs_;                               // in file order
  std::unordered_map<std::string_view, size_t> kv_index_;   // key -> index in kvs_
  std::vector<TensorInfo> tensors_;                         // in file order
  std::unordered_map<std::string_view, size_t> tensor_index_;  // name -> index in tensors_
};

}  // namespace mnemo::gguf
