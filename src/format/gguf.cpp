#include "format/gguf.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <limits>

namespace mnemo::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;        // nested arrays deeper than this are rejected
constexpr uint64_t kMaxAlignment = 1 << 20;

// ggml type table, indexed by type id (name, block elements, block bytes). Removed ids have
// block_elems 0.
struct TypeRow {
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};
constexpr TypeRow kTypes[] = {
    {"f32", 1, 4},        {"f16", 1, 2},        {"q4_0", 32, 18},    {"q4_1", 32, 20},
    {"(4)", 0, 0},        {"(5)", 0, 0},        {"q5_0", 32, 22},    {"q5_1", 32, 24},
    {"q8_0", 32, 34},     {"q8_1", 32, 36},     {"q2_K", 256, 84},   {"q3_K", 256, 110},
    {"q4_K", 256, 144},   {"q5_K", 256, 176},   {"q6_K", 256, 210},  {"q8_K", 256, 292},
    {"iq2_xxs", 256, 66}, {"iq2_xs", 256, 74},  {"iq3_xxs", 256, 98}, {"iq1_s", 256, 50},
    {"iq4_nl", 32, 18},   {"iq3_s", 256, 110},  {"iq2_s", 256, 82},  {"iq4_xs", 256, 136},
    {"i8", 1, 1},         {"i16", 1, 2},        {"i32", 1, 4},       {"i64", 1, 8},
    {"f64", 1, 8},        {"iq1_m", 256, 56},   {"bf16", 1, 2},      {"(31)", 0, 0},
    {"(32)", 0, 0},       {"(33)", 0, 0},       {"tq1_0", 256, 54},  {"tq2_0", 256, 66},
    {"(36)", 0, 0},       {"(37)", 0, 0},       {"(38)", 0, 0},      {"mxfp4", 32, 17},
};

// Bounds-checked little-endian cursor over the file bytes. Every read checks the remaining size
// first; after a failure err holds the message and later reads fail too.
class Reader {
 public:
  Reader(const uint8_t* p, uint64_t size) : p_(p), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  bool Bytes(void* dst, uint64_t n, const char* what) {
    if (!Need(n, what)) return false;
    std::memcpy(dst, p_ + pos_, n);
    pos_ += n;
    return true;
  }
  template <class T>
  bool Read(T* v, const char* what) {
    return Bytes(v, sizeof(T), what);
  }
  // A GGUF string: u64 length then bytes (not NUL-terminated). Points into the file.
  bool String(std::string_view* s, const char* what) {
    uint64_t n;
    if (!Read(&n, what)) return false;
    if (n > remaining()) {
      return Fail(MakeError("%s: string length %" PRIu64 " at offset %" PRIu64
                            " runs past the end of the file (%" PRIu64 " bytes left)",
                            what, n, pos_ - 8, remaining()));
    }
    *s = std::string_view(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return true;
  }
  const uint8_t* Here() const { return p_ + pos_; }
  bool Skip(uint64_t n, const char* what) {
    if (!Need(n, what)) return false;
    pos_ += n;
    return true;
  }
  bool Fail(Error e) {
    if (err.message.empty()) err = std::move(e);
    return false;
  }
  Error err;

 private:
  bool Need(uint64_t n, const char* what) {
    if (!err.message.empty()) return false;
    if (n > remaining()) {
      return Fail(MakeError("file truncated: %s needs %" PRIu64 " bytes at offset %" PRIu64
                            ", only %" PRIu64 " left",
                            what, n, pos_, remaining()));
    }
    return true;
  }
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool ValidType(uint32_t t) { return t <= uint32_t(ValueType::kF64); }

bool ReadValue(Reader& r, ValueType type, Value* v, int depth, const char* what);

bool ReadArray(Reader& r, Value* v, int depth, const char* what) {
  if (depth >= kMaxArrayDepth) return r.Fail(MakeError("%s: arrays nested deeper than %d", what, kMaxArrayDepth));
  uint32_t et;
  uint64_t n;
  if (!r.Read(&et, what) || !r.Read(&n, what)) return false;
  if (!ValidType(et)) return r.Fail(MakeError("%s: unknown array element type %u", what, et));
  v->elem = ValueType(et);
  v->count = n;
  size_t esize = ValueTypeSize(v->elem);
  if (esize > 0) {
    if (n > r.remaining() / esize) {
      return r.Fail(MakeError("%s: array of %" PRIu64 " %s runs past the end of the file", what, n,
                              ValueTypeName(v->elem)));
    }
    v->raw = r.Here();
    if (v->elem == ValueType::kBool) {
      for (uint64_t k = 0; k < n; k++) {
        if (v->raw[k] > 1) return r.Fail(MakeError("%s: bool array element %" PRIu64 " is %u", what, k, v->raw[k]));
      }
    }
    return r.Skip(n * esize, what);
  }
  // Strings take at least 8 bytes each, arrays at least 12: bound the count before reserving.
  uint64_t min_size = v->elem == ValueType::kString ? 8 : 12;
  if (n > r.remaining() / min_size) {
    return r.Fail(MakeError("%s: array of %" PRIu64 " %s runs past the end of the file", what, n,
                            ValueTypeName(v->elem)));
  }
  if (v->elem == ValueType::kString) {
    v->strings.resize(n);
    for (uint64_t k = 0; k < n; k++) {
      if (!r.String(&v->strings[k], what)) return false;
    }
  } else {
    v->arrays.resize(n);
    for (uint64_t k = 0; k < n; k++) {
      if (!ReadValue(r, ValueType::kArray, &v->arrays[k], depth + 1, what)) return false;
    }
  }
  return true;
}

bool ReadValue(Reader& r, ValueType type, Value* v, int depth, const char* what) {
  v->type = type;
  switch (type) {
    case ValueType::kU8: { uint8_t x; if (!r.Read(&x, what)) return false; v->u = x; v->i = x; return true; }
    case ValueType::kI8: { int8_t x; if (!r.Read(&x, what)) return false; v->i = x; return true; }
    case ValueType::kU16: { uint16_t x; if (!r.Read(&x, what)) return false; v->u = x; v->i = x; return true; }
    case ValueType::kI16: { int16_t x; if (!r.Read(&x, what)) return false; v->i = x; return true; }
    case ValueType::kU32: { uint32_t x; if (!r.Read(&x, what)) return false; v->u = x; v->i = x; return true; }
    case ValueType::kI32: { int32_t x; if (!r.Read(&x, what)) return false; v->i = x; return true; }
    case ValueType::kU64: { uint64_t x; if (!r.Read(&x, what)) return false; v->u = x; v->i = int64_t(x); return true; }
    case ValueType::kI64: { int64_t x; if (!r.Read(&x, what)) return false; v->i = x; return true; }
    case ValueType::kF32: { float x; if (!r.Read(&x, what)) return false; v->f = x; return true; }
    case ValueType::kF64: { double x; if (!r.Read(&x, what)) return false; v->f = x; return true; }
    case ValueType::kBool: {
      uint8_t x;
      if (!r.Read(&x, what)) return false;
      if (x > 1) return r.Fail(MakeError("%s: bool value is %u", what, x));
      v->u = x;
      return true;
    }
    case ValueType::kString: return r.String(&v->str, what);
    case ValueType::kArray: return ReadArray(r, v, depth, what);
  }
  return r.Fail(MakeError("%s: unknown value type %u", what, uint32_t(type)));
}

std::string Printable(std::string_view s, size_t max_len = 60) {
  std::string out;
  for (char c : s.substr(0, max_len)) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (uint8_t(c) < 0x20) out += '?';
    else out += c;
  }
  if (s.size() > max_len) out += "...";
  return out;
}

}  // namespace

const char* ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kU8: return "u8";
    case ValueType::kI8: return "i8";
    case ValueType::kU16: return "u16";
    case ValueType::kI16: return "i16";
    case ValueType::kU32: return "u32";
    case ValueType::kI32: return "i32";
    case ValueType::kF32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kU64: return "u64";
    case ValueType::kI64: return "i64";
    case ValueType::kF64: return "f64";
  }
  return "?";
}

size_t ValueTypeSize(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    case ValueType::kString: case ValueType::kArray: return 0;
  }
  return 0;
}

std::optional<GgmlTypeInfo> GgmlType(uint32_t type) {
  if (type >= std::size(kTypes) || kTypes[type].block_elems == 0) return std::nullopt;
  return GgmlTypeInfo{kTypes[type].name, kTypes[type].block_elems, kTypes[type].block_bytes};
}

namespace {
// DType <-> ggml type id (ggml.h's enum ggml_type, a fact of the format).
struct DTypeId {
  DType dtype;
  uint32_t ggml;
};
constexpr DTypeId kDTypeIds[] = {
    {DType::F32, kGgmlF32},   {DType::F16, kGgmlF16},   {DType::BF16, kGgmlBF16}, {DType::Q8_0, kGgmlQ8_0},
    {DType::Q4_0, 2},         {DType::Q4_1, 3},         {DType::Q5_0, 6},         {DType::Q5_1, 7},
    {DType::Q2_K, 10},        {DType::Q3_K, 11},        {DType::Q4_K, 12},        {DType::Q5_K, 13},
    {DType::Q6_K, 14},        {DType::IQ4_NL, 20},      {DType::IQ4_XS, 23},
};
static_assert(std::size(kDTypeIds) == std::size(kAllDTypes));
}  // namespace

std::optional<DType> GgmlToDType(uint32_t type) {
  for (const DTypeId& e : kDTypeIds) {
    if (e.ggml == type) return e.dtype;
  }
  return std::nullopt;
}

uint32_t DTypeToGgml(DType t) {
  for (const DTypeId& e : kDTypeIds) {
    if (e.dtype == t) return e.ggml;
  }
  MNEMO_CHECK_MSG(false, std::string("DTypeToGgml: unmapped dtype ") + DTypeName(t));
  return kGgmlF32;
}

bool Value::IsInteger() const {
  switch (type) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kU16: case ValueType::kI16:
    case ValueType::kU32: case ValueType::kI32: case ValueType::kU64: case ValueType::kI64: return true;
    default: return false;
  }
}

bool Value::IsFloat() const { return type == ValueType::kF32 || type == ValueType::kF64; }

std::optional<int64_t> Value::AsInt() const {
  if (!IsInteger()) return std::nullopt;
  if (type == ValueType::kU64 && u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return i;
}

std::optional<uint64_t> Value::AsUint() const {
  if (!IsInteger()) return std::nullopt;
  if (type == ValueType::kU64) return u;
  if (i < 0) return std::nullopt;
  return uint64_t(i);
}

double Value::NumberAt(uint64_t k) const {
  const uint8_t* p = raw + k * ValueTypeSize(elem);
  auto get = [p](auto x) { std::memcpy(&x, p, sizeof(x)); return x; };
  switch (elem) {
    case ValueType::kU8: return get(uint8_t());
    case ValueType::kI8: return get(int8_t());
    case ValueType::kBool: return get(uint8_t());
    case ValueType::kU16: return get(uint16_t());
    case ValueType::kI16: return get(int16_t());
    case ValueType::kU32: return get(uint32_t());
    case ValueType::kI32: return get(int32_t());
    case ValueType::kF32: return get(float());
    case ValueType::kU64: return double(get(uint64_t()));
    case ValueType::kI64: return double(get(int64_t()));
    case ValueType::kF64: return get(double());
    default: return 0;
  }
}

std::string Value::ToString(size_t max_items) const {
  char buf[64];
  switch (type) {
    case ValueType::kString: {
      std::string s = "\"";
      s += Printable(str);
      s += '"';
      return s;
    }
    case ValueType::kBool: return u ? "true" : "false";
    case ValueType::kF32:
    case ValueType::kF64: std::snprintf(buf, sizeof buf, "%g", f); return buf;
    case ValueType::kU64: std::snprintf(buf, sizeof buf, "%" PRIu64, u); return buf;
    case ValueType::kArray: {
      std::string s = std::string("[") + ValueTypeName(elem) + " x " + std::to_string(count) + ": ";
      for (uint64_t k = 0; k < count && k < max_items; k++) {
        if (k) s += ", ";
        if (elem == ValueType::kString) {
          s += '"';
          s += Printable(strings[k], 20);
          s += '"';
        }
        else if (elem == ValueType::kArray) s += arrays[k].ToString(2);
        else { std::snprintf(buf, sizeof buf, "%g", NumberAt(k)); s += buf; }
      }
      if (count > max_items) s += ", ...";
      return s + "]";
    }
    default: std::snprintf(buf, sizeof buf, "%" PRId64, i); return buf;
  }
}

Result<GgufFile> GgufFile::Open(const std::string& path) {
  auto map = MappedFile::Open(path);
  if (!map) return map.error();
  GgufFile f;
  f.map_ = std::move(map).value();
  f.base_ = f.map_.data();
  f.size_ = f.map_.size();
  f.path_ = path;
  auto r = Parse(std::move(f));
  if (!r) return MakeError("%s: %s", path.c_str(), r.error().message.c_str());
  return r;
}

Result<GgufFile> GgufFile::FromBytes(const void* data, size_t size) {
  GgufFile f;
  auto* p = static_cast<const uint8_t*>(data);
  f.owned_ = std::make_unique<std::vector<uint8_t>>(p, p + size);
  f.base_ = f.owned_->data();
  f.size_ = size;
  f.path_ = "<memory>";
  return Parse(std::move(f));
}

Result<GgufFile> GgufFile::Parse(GgufFile f) {
  Reader r(f.base_, f.size_);
  uint32_t magic = 0;
  if (!r.Read(&magic, "magic")) return MakeError("not a GGUF file: %" PRIu64 " bytes, too short", f.size_);
  if (magic != kMagic) return MakeError("not a GGUF file (magic 0x%08x, expected \"GGUF\")", magic);
  if (!r.Read(&f.version_, "version")) return r.err;
  if (f.version_ == 1) return MakeError("GGUF version 1 is not supported (only 2 and 3)");
  if (f.version_ != 2 && f.version_ != 3) {
    if ((f.version_ & 0xffff) == 0 && f.version_ != 0) {
      return MakeError("big-endian GGUF is not supported (version field 0x%08x)", f.version_);
    }
    return MakeError("unsupported GGUF version %u (only 2 and 3)", f.version_);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!r.Read(&n_tensors, "tensor count") || !r.Read(&n_kv, "metadata count")) return r.err;
  // Minimal sizes: a key/value takes >= 8 + 4 + 1 bytes, a tensor info >= 8 + 4 + 4 + 8.
  if (n_kv > r.remaining() / 13) {
    return MakeError("metadata count %" PRIu64 " is impossible for a %" PRIu64 "-byte file", n_kv, f.size_);
  }
  if (n_tensors > r.remaining() / 24) {
    return MakeError("tensor count %" PRIu64 " is impossible for a %" PRIu64 "-byte file", n_tensors, f.size_);
  }

  f.kvs_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; k++) {
    KeyValue kv;
    if (!r.String(&kv.key, "metadata key")) return r.err;
    uint32_t type;
    if (!r.Read(&type, "metadata value type")) return r.err;
    std::string what = "metadata '" + Printable(kv.key) + "'";
    if (!ValidType(type)) return MakeError("%s: unknown value type %u", what.c_str(), type);
    if (!ReadValue(r, ValueType(type), &kv.value, 0, what.c_str())) return r.err;
    if (!f.kv_index_.emplace(kv.key, f.kvs_.size()).second) {
      return MakeError("duplicate metadata key '%s'", Printable(kv.key).c_str());
    }
    f.kvs_.push_back(std::move(kv));
  }

  if (const Value* a = f.Find("general.alignment")) {
    auto v = a->AsUint();
    if (!v || *v == 0 || (*v & (*v - 1)) != 0 || *v > kMaxAlignment) {
      return MakeError("general.alignment must be a power of two <= %" PRIu64 ", got %s", kMaxAlignment,
                       a->ToString().c_str());
    }
    f.alignment_ = *v;
  }

  f.tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; k++) {
    TensorInfo t;
    std::string_view name;
    if (!r.String(&name, "tensor name")) return r.err;
    t.name = std::string(name);
    std::string pn = Printable(name);
    uint32_t n_dims;
    if (!r.Read(&n_dims, "tensor dimension count")) return r.err;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return MakeError("tensor '%s': %u dimensions (must be 1..%d)", pn.c_str(), n_dims, kMaxDims);
    }
    t.dims.resize(n_dims);
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
      uint64_t ne;
      if (!r.Read(&ne, "tensor dimension")) return r.err;
      if (ne > uint64_t(std::numeric_limits<int64_t>::max()) || (ne != 0 && uint64_t(n) > uint64_t(INT64_MAX) / ne)) {
        return MakeError("tensor '%s': element count overflows", pn.c_str());
      }
      t.dims[d] = int64_t(ne);
      n *= int64_t(ne);
    }
    t.n_elements = n;
    if (!r.Read(&t.type, "tensor type") || !r.Read(&t.offset, "tensor offset")) return r.err;
    auto ti = GgmlType(t.type);
    if (!ti) return MakeError("tensor '%s': unknown ggml type %u", pn.c_str(), t.type);
    t.dtype = GgmlToDType(t.type);
    if (t.dims[0] % ti->block_elems != 0) {
      return MakeError("tensor '%s': first dimension %" PRId64 " is not a multiple of the %s block size %" PRId64,
                       pn.c_str(), t.dims[0], ti->name, ti->block_elems);
    }
    uint64_t blocks = uint64_t(n / ti->block_elems);
    if (blocks > f.size_ / uint64_t(ti->block_bytes)) {
      return MakeError("tensor '%s': %" PRId64 " elements of %s do not fit in a %" PRIu64 "-byte file",
                       pn.c_str(), n, ti->name, f.size_);
    }
    t.nbytes = blocks * uint64_t(ti->block_bytes);
    if (t.offset % f.alignment_ != 0) {
      return MakeError("tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, pn.c_str(),
                       t.offset, f.alignment_);
    }
    f.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment. A file without tensors may
  // end before it (vocab-only files do).
  uint64_t end = r.pos();
  f.data_offset_ = (end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (!f.tensors_.empty() && f.data_offset_ > f.size_) {
    return MakeError("file truncated: data section would start at %" PRIu64 ", file has %" PRIu64 " bytes",
                     f.data_offset_, f.size_);
  }
  uint64_t data_size = f.data_offset_ <= f.size_ ? f.size_ - f.data_offset_ : 0;

  // Check that every tensor lies inside the data section and that none overlap.
  std::vector<size_t> order(f.tensors_.size());
  for (size_t k = 0; k < order.size(); k++) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  uint64_t prev_end = 0;
  const TensorInfo* prev = nullptr;
  for (size_t k : order) {
    TensorInfo& t = f.tensors_[k];
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return MakeError("tensor '%s': data [%" PRIu64 ", +%" PRIu64 ") runs past the end of the file "
                       "(data section holds %" PRIu64 " bytes)",
                       Printable(t.name).c_str(), t.offset, t.nbytes, data_size);
    }
    if (prev && t.offset < prev_end) {
      return MakeError("tensors '%s' and '%s' overlap", Printable(prev->name).c_str(), Printable(t.name).c_str());
    }
    prev_end = t.offset + t.nbytes;
    prev = &t;
    t.data = f.base_ + f.data_offset_ + t.offset;
  }
  for (size_t k = 0; k < f.tensors_.size(); k++) {
    if (!f.tensor_index_.emplace(f.tensors_[k].name, k).second) {
      return MakeError("duplicate tensor name '%s'", Printable(f.tensors_[k].name).c_str());
    }
  }
  return f;
}

const Value* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Error Missing(std::string_view key) {
  return MakeError("metadata key '%.*s' is missing", int(key.size()), key.data());
}
Error WrongType(std::string_view key, const Value& v, const char* want) {
  return MakeError("metadata key '%.*s' has type %s, expected %s", int(key.size()), key.data(),
                   ValueTypeName(v.type), want);
}
Error WrongArray(std::string_view key, const Value& v, const char* want) {
  if (v.type != ValueType::kArray) return WrongType(key, v, want);
  return MakeError("metadata key '%.*s' is an array of %s, expected %s", int(key.size()), key.data(),
                   ValueTypeName(v.elem), want);
}
}  // namespace

Result<uint64_t> GgufFile::GetU64(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  auto x = v->AsUint();
  if (!x) {
    if (!v->IsInteger()) return WrongType(key, *v, "an unsigned integer");
    return MakeError("metadata key '%.*s' is negative (%s)", int(key.size()), key.data(), v->ToString().c_str());
  }
  return *x;
}

Result<uint32_t> GgufFile::GetU32(std::string_view key) const {
  auto x = GetU64(key);
  if (!x) return x.error();
  if (*x > UINT32_MAX) return MakeError("metadata key '%.*s' = %" PRIu64 " does not fit in 32 bits", int(key.size()), key.data(), *x);
  return uint32_t(*x);
}

Result<int64_t> GgufFile::GetI64(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  auto x = v->AsInt();
  if (!x) {
    if (!v->IsInteger()) return WrongType(key, *v, "an integer");
    return MakeError("metadata key '%.*s' = %s does not fit in 64 bits", int(key.size()), key.data(), v->ToString().c_str());
  }
  return *x;
}

Result<float> GgufFile::GetF32(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  if (!v->IsFloat()) return WrongType(key, *v, "f32");
  return float(v->f);
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != ValueType::kBool) return WrongType(key, *v, "bool");
  return v->u != 0;
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != ValueType::kString) return WrongType(key, *v, "string");
  return std::string(v->str);
}

Result<uint32_t> GgufFile::GetU32Or(std::string_view key, uint32_t def) const {
  return Has(key) ? GetU32(key) : Result<uint32_t>(def);
}
Result<float> GgufFile::GetF32Or(std::string_view key, float def) const {
  return Has(key) ? GetF32(key) : Result<float>(def);
}
Result<bool> GgufFile::GetBoolOr(std::string_view key, bool def) const {
  return Has(key) ? GetBool(key) : Result<bool>(def);
}
Result<std::string> GgufFile::GetStringOr(std::string_view key, std::string def) const {
  return Has(key) ? GetString(key) : Result<std::string>(std::move(def));
}

Result<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != ValueType::kArray || v->elem != ValueType::kString) return WrongArray(key, *v, "an array of strings");
  return std::vector<std::string>(v->strings.begin(), v->strings.end());
}

Result<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != ValueType::kArray || (v->elem != ValueType::kF32 && v->elem != ValueType::kF64)) {
    return WrongArray(key, *v, "an array of f32");
  }
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; k++) out[k] = float(v->NumberAt(k));
  return out;
}

Result<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  Value probe;
  probe.type = v->elem;
  if (v->type != ValueType::kArray || !probe.IsInteger()) return WrongArray(key, *v, "an array of integers");
  std::vector<int32_t> out(v->count);
  for (uint64_t k = 0; k < v->count; k++) {
    double x = v->NumberAt(k);  // exact for every value that fits in int32
    if (x < INT32_MIN || x > INT32_MAX) {
      return MakeError("metadata key '%.*s': element %" PRIu64 " does not fit in int32", int(key.size()), key.data(), k);
    }
    out[k] = int32_t(x);
  }
  return out;
}

Result<uint64_t> GgufFile::GetArrayLength(std::string_view key) const {
  const Value* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != ValueType::kArray) return WrongType(key, *v, "an array");
  return v->count;
}

}  // namespace mnemo::gguf
