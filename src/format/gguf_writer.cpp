#include "format/gguf_writer.h"

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace mnemo::gguf {

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    error_ = MakeError("GGUF alignment %" PRIu64 " is not a power of two", alignment);
    alignment_ = 32;
  }
}

GgufWriter::~GgufWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

template <class T>
void GgufWriter::Put(T v) {
  size_t n = kv_bytes_.size();
  kv_bytes_.resize(n + sizeof(T));
  std::memcpy(kv_bytes_.data() + n, &v, sizeof(T));
}

void GgufWriter::PutString(std::string_view s) {
  Put<uint64_t>(s.size());
  kv_bytes_.insert(kv_bytes_.end(), s.begin(), s.end());
}

void GgufWriter::Key(const std::string& key, ValueType t) {
  if (!keys_.insert(key).second && error_.message.empty()) {
    error_ = MakeError("GGUF writer: duplicate metadata key '%s'", key.c_str());
  }
  n_kv_++;
  PutString(key);
  Put<uint32_t>(uint32_t(t));
}

void GgufWriter::AddU32(const std::string& key, uint32_t v) { Key(key, ValueType::kU32); Put(v); }
void GgufWriter::AddI32(const std::string& key, int32_t v) { Key(key, ValueType::kI32); Put(v); }
void GgufWriter::AddU64(const std::string& key, uint64_t v) { Key(key, ValueType::kU64); Put(v); }
void GgufWriter::AddF32(const std::string& key, float v) { Key(key, ValueType::kF32); Put(v); }
void GgufWriter::AddBool(const std::string& key, bool v) { Key(key, ValueType::kBool); Put<uint8_t>(v ? 1 : 0); }
void GgufWriter::AddString(const std::string& key, const std::string& v) {
  Key(key, ValueType::kString);
  PutString(v);
}
void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  Key(key, ValueType::kArray);
  Put<uint32_t>(uint32_t(ValueType::kString));
  Put<uint64_t>(v.size());
  for (const auto& s : v) PutString(s);
}
void GgufWriter::AddF32Array(const std::string& key, const std::vector<float>& v) {
  Key(key, ValueType::kArray);
  Put<uint32_t>(uint32_t(ValueType::kF32));
  Put<uint64_t>(v.size());
  for (float x : v) Put(x);
}
void GgufWriter::AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
  Key(key, ValueType::kArray);
  Put<uint32_t>(uint32_t(ValueType::kI32));
  Put<uint64_t>(v.size());
  for (int32_t x : v) Put(x);
}

void GgufWriter::PutValue(const Value& v, bool with_type) {
  if (with_type) Put<uint32_t>(uint32_t(v.type));
  switch (v.type) {
    case ValueType::kU8: Put<uint8_t>(uint8_t(v.u)); return;
    case ValueType::kI8: Put<int8_t>(int8_t(v.i)); return;
    case ValueType::kU16: Put<uint16_t>(uint16_t(v.u)); return;
    case ValueType::kI16: Put<int16_t>(int16_t(v.i)); return;
    case ValueType::kU32: Put<uint32_t>(uint32_t(v.u)); return;
    case ValueType::kI32: Put<int32_t>(int32_t(v.i)); return;
    case ValueType::kU64: Put<uint64_t>(v.u); return;
    case ValueType::kI64: Put<int64_t>(v.i); return;
    case ValueType::kF32: Put<float>(float(v.f)); return;
    case ValueType::kF64: Put<double>(v.f); return;
    case ValueType::kBool: Put<uint8_t>(v.u ? 1 : 0); return;
    case ValueType::kString: PutString(v.str); return;
    case ValueType::kArray: {
      Put<uint32_t>(uint32_t(v.elem));
      Put<uint64_t>(v.count);
      if (v.elem == ValueType::kString) {
        for (auto s : v.strings) PutString(s);
      } else if (v.elem == ValueType::kArray) {
        for (const auto& a : v.arrays) PutValue(a, false);
      } else {
        kv_bytes_.insert(kv_bytes_.end(), v.raw, v.raw + v.count * ValueTypeSize(v.elem));
      }
      return;
    }
  }
}

void GgufWriter::AddValue(const std::string& key, const Value& v) {
  Key(key, v.type);
  PutValue(v, false);
}

void GgufWriter::AddTensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t ggml_type) {
  auto info = GgmlType(ggml_type);
  if (!info) {
    Fail(MakeError("GGUF writer: tensor '%s' has unknown ggml type %u", name.c_str(), ggml_type));
    return;
  }
  if (dims.empty() || dims.size() > 4 || dims[0] % info->block_elems != 0) {
    Fail(MakeError("GGUF writer: tensor '%s' has invalid dims for %s", name.c_str(), info->name));
    return;
  }
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) {
      Fail(MakeError("GGUF writer: tensor '%s' has a negative dimension", name.c_str()));
      return;
    }
    n *= d;
  }
  uint64_t nbytes = uint64_t(n / info->block_elems * info->block_bytes);
  tensors_.push_back({name, dims, ggml_type, nbytes, data_bytes_});
  data_bytes_ += (nbytes + alignment_ - 1) / alignment_ * alignment_;
}

Error GgufWriter::Fail(Error e) {
  if (error_.message.empty()) error_ = std::move(e);
  return error_;
}

Status GgufWriter::Write(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, file_) != n) {
    return Fail(MakeError("cannot write '%s': %s", tmp_path_.c_str(), std::strerror(errno)));
  }
  return Status::Ok();
}

Status GgufWriter::Begin(const std::string& path) {
  if (!error_.message.empty()) return error_;
  if (file_) return Fail(MakeError("GGUF writer: Begin called twice"));
  path_ = path;
  tmp_path_ = path + ".tmp";
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_) return Fail(MakeError("cannot create '%s': %s", tmp_path_.c_str(), std::strerror(errno)));
  std::vector<uint8_t> head;
  auto put = [&head](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    head.insert(head.end(), b, b + n);
  };
  uint32_t version = 3;
  uint64_t n_tensors = tensors_.size();
  put("GGUF", 4);
  put(&version, 4);
  put(&n_tensors, 8);
  put(&n_kv_, 8);
  head.insert(head.end(), kv_bytes_.begin(), kv_bytes_.end());
  for (const auto& t : tensors_) {
    uint64_t len = t.name.size();
    uint32_t n_dims = uint32_t(t.dims.size());
    put(&len, 8);
    put(t.name.data(), len);
    put(&n_dims, 4);
    for (int64_t d : t.dims) put(&d, 8);
    put(&t.type, 4);
    put(&t.offset, 8);
  }
  head.resize((head.size() + alignment_ - 1) / alignment_ * alignment_, 0);
  kv_bytes_.clear();
  kv_bytes_.shrink_to_fit();
  cur_ = 0;
  cur_written_ = 0;
  return Write(head.data(), head.size());
}

Status GgufWriter::Append(const void* data, size_t n) {
  if (!error_.message.empty()) return error_;
  if (!file_) return Fail(MakeError("GGUF writer: Append before Begin"));
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (cur_ >= tensors_.size()) return Fail(MakeError("GGUF writer: more tensor data than declared"));
    const PendingTensor& t = tensors_[cur_];
    uint64_t take = std::min<uint64_t>(n, t.nbytes - cur_written_);
    MNEMO_TRY(Write(p, take));
    p += take;
    n -= take;
    cur_written_ += take;
    if (cur_written_ == t.nbytes) {
      static const uint8_t zeros[256] = {};
      uint64_t pad = (alignment_ - t.nbytes % alignment_) % alignment_;
      for (; pad > 0; pad -= std::min<uint64_t>(pad, sizeof zeros)) {
        MNEMO_TRY(Write(zeros, std::min<uint64_t>(pad, sizeof zeros)));
      }
      cur_++;
      cur_written_ = 0;
      // Zero-sized tensors that follow are complete already.
      while (cur_ < tensors_.size() && tensors_[cur_].nbytes == 0) cur_++;
    }
  }
  return Status::Ok();
}

uint64_t GgufWriter::remaining_bytes() const {
  uint64_t r = 0;
  for (size_t k = cur_; k < tensors_.size(); k++) r += tensors_[k].nbytes;
  return r - (cur_ < tensors_.size() ? cur_written_ : 0);
}

Status GgufWriter::Finish() {
  if (!error_.message.empty()) return error_;
  if (!file_) return Fail(MakeError("GGUF writer: Finish before Begin"));
  while (cur_ < tensors_.size() && tensors_[cur_].nbytes == 0) cur_++;
  if (cur_ < tensors_.size()) {
    return Fail(MakeError("GGUF writer: tensor '%s' is incomplete (%" PRIu64 " of %" PRIu64 " bytes written)",
                          tensors_[cur_].name.c_str(), cur_written_, tensors_[cur_].nbytes));
  }
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    std::remove(tmp_path_.c_str());
    return Fail(MakeError("cannot write '%s': %s", tmp_path_.c_str(), std::strerror(errno)));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_path_.c_str());
    return Fail(MakeError("cannot rename '%s' to '%s': %s", tmp_path_.c_str(), path_.c_str(), std::strerror(errno)));
  }
  return Status::Ok();
}

}  // namespace mnemo::gguf
