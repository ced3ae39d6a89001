#include "format/model_file.h"

#include <sys/stat.h>

#include <cctype>
#include <cinttypes>
#include <cstring>

#include "format/gguf_vocab.h"

namespace mnemo {
namespace {

constexpr char kSpmSpace[] = "\xe2\x96\x81";  // U+2581, SentencePiece's spelling of a space

bool FileExists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string DirOf(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

std::string BaseName(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s;
  for (int64_t d : dims) {
    s += s.empty() ? "[" : ", ";
    s += std::to_string(d);
  }
  s += ']';
  return s;
}

// Checks the config's own consistency (both formats).
Status ValidateConfig(const LlamaConfig& c) {
  auto bad = [](const char* what, long v) { return MakeError("invalid model config: %s = %ld", what, v); };
  if (c.dim <= 0) return bad("dim", c.dim);
  if (c.n_layers <= 0) return bad("n_layers", c.n_layers);
  if (c.n_heads <= 0) return bad("n_heads", c.n_heads);
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    return MakeError("invalid model config: n_kv_heads = %d must divide n_heads = %d", c.n_kv_heads, c.n_heads);
  }
  if (c.head_dim <= 0) return bad("head_dim", c.head_dim);
  if (c.ffn_dim <= 0) return bad("ffn_dim", c.ffn_dim);
  if (c.vocab_size <= 0) return bad("vocab_size", c.vocab_size);
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    return MakeError("invalid model config: rope_dims = %d must be even and <= head_dim = %d", c.rope_dims,
                     c.head_dim);
  }
  if (!(c.rope_theta > 0)) return MakeError("invalid model config: rope_theta = %g", c.rope_theta);
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) return MakeError("invalid model config: rms_eps = %g", c.rms_eps);
  if (c.context_length <= 0) return bad("context_length", c.context_length);
  return Status::Ok();
}

// ---- GGUF ----

// Looks up a GGUF tensor and checks it is a [rows, cols] matrix (GGUF dims [cols, rows]) of a
// supported dtype (f32 only for norms).
Result<TensorRef> GgufTensor(const gguf::GgufFile& f, const std::string& name, int64_t rows, int64_t cols,
                             bool is_norm) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (!t) return MakeError("tensor '%s' is missing", name.c_str());
  std::vector<int64_t> want = is_norm ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
  if (t->dims != want) {
    return MakeError("tensor '%s' has GGUF dims %s, expected %s (row-major [%" PRId64 ", %" PRId64 "])", name.c_str(),
                     DimsString(t->dims).c_str(), DimsString(want).c_str(), rows, cols);
  }
  auto type = gguf::GgmlType(t->type);
  const char* tname = type ? type->name : "?";
  if (!t->dtype) {
    return MakeError("tensor '%s' has type %s, which mnemo does not support (f32, f16, bf16, q8_0)", name.c_str(), tname);
  }
  if (is_norm && *t->dtype != DType::F32) {
    return MakeError("norm tensor '%s' has type %s; norms must be f32", name.c_str(), tname);
  }
  return TensorRef{*t->dtype, t->data, rows, cols};
}

Result<int> GgufInt(const gguf::GgufFile& f, const char* key, std::optional<int> def = std::nullopt) {
  if (!f.Has(key)) {
    if (def) return *def;
    return MakeError("metadata key '%s' is missing", key);
  }
  const gguf::Value* v = f.Find(key);
  if (v->type == gguf::ValueType::kArray) {
    return MakeError("metadata key '%s' is an array (per-layer values are not supported)", key);
  }
  auto x = f.GetU32(key);
  if (!x) return x.error();
  if (*x > (1u << 30)) return MakeError("metadata key '%s' = %u is too large", key, *x);
  return int(*x);
}

}  // namespace

const char* ModelFormatName(ModelFormat f) { return f == ModelFormat::kGguf ? "gguf" : "llama2.c"; }

Result<ModelFile> ModelFile::Open(const std::string& model_path, const std::string& tokenizer_path) {
  auto map = MappedFile::Open(model_path);
  if (!map) return map.error();
  if (map->size() >= 4 && std::memcmp(map->data(), "GGUF", 4) == 0) {
    if (!tokenizer_path.empty()) {
      return MakeError("%s: a separate tokenizer file is only used with llama2.c checkpoints", model_path.c_str());
    }
    auto g = gguf::GgufFile::Open(model_path);
    if (!g) return g.error();
    return FromGguf(std::move(g).value());
  }
  return OpenLlama2c(std::move(map).value(), model_path, tokenizer_path);
}

Result<ModelFile> ModelFile::FromGguf(gguf::GgufFile g) {
  ModelFile m;
  m.format_ = ModelFormat::kGguf;
  m.path_ = g.path();
  const std::string& path = m.path_;
  m.gguf_ = std::make_unique<gguf::GgufFile>(std::move(g));
  const gguf::GgufFile& f = *m.gguf_;
  auto fail = [&](const Error& e) { return MakeError("%s: %s", path.c_str(), e.message.c_str()); };

  auto arch = f.GetString("general.architecture");
  if (!arch) return fail(arch.error());
  if (*arch != "llama") {
    return MakeError("%s: architecture '%s' is not supported (only 'llama')", path.c_str(), arch->c_str());
  }
  auto name = f.GetStringOr("general.name", BaseName(path));
  if (!name) return fail(name.error());
  m.name_ = *name;
  auto experts = GgufInt(f, "llama.expert_count", 0);
  if (!experts) return fail(experts.error());
  if (*experts > 0) return MakeError("%s: mixture-of-experts llama models are not supported", path.c_str());
  if (f.Has("llama.rope.scaling.type")) {
    auto t = f.GetString("llama.rope.scaling.type");
    if (!t) return fail(t.error());
    if (*t != "none") return MakeError("%s: RoPE scaling '%s' is not supported", path.c_str(), t->c_str());
  }
  if (f.FindTensor("rope_freqs.weight")) {
    return MakeError("%s: per-dimension RoPE frequency factors (rope_freqs.weight) are not supported", path.c_str());
  }

  auto vocab = gguf::ReadVocab(f);
  if (!vocab) return fail(vocab.error());
  m.vocab_ = std::move(vocab).value();

  LlamaConfig& c = m.config_;
  struct IntKey {
    const char* key;
    int* dst;
    std::optional<int> def;
  };
  for (const IntKey& k : {IntKey{"llama.embedding_length", &c.dim, {}}, IntKey{"llama.block_count", &c.n_layers, {}},
                          IntKey{"llama.attention.head_count", &c.n_heads, {}},
                          IntKey{"llama.feed_forward_length", &c.ffn_dim, {}},
                          IntKey{"llama.context_length", &c.context_length, {}}}) {
    auto v = GgufInt(f, k.key, k.def);
    if (!v) return fail(v.error());
    *k.dst = *v;
  }
  if (c.n_heads <= 0) return MakeError("%s: llama.attention.head_count is 0", path.c_str());
  auto kv = GgufInt(f, "llama.attention.head_count_kv", c.n_heads);
  if (!kv) return fail(kv.error());
  c.n_kv_heads = *kv;
  auto hd = GgufInt(f, "llama.attention.key_length", c.dim / c.n_heads);
  if (!hd) return fail(hd.error());
  c.head_dim = *hd;
  auto vd = GgufInt(f, "llama.attention.value_length", c.head_dim);
  if (!vd) return fail(vd.error());
  if (*vd != c.head_dim) {
    return MakeError("%s: value_length %d != key_length %d is not supported", path.c_str(), *vd, c.head_dim);
  }
  if (!f.Has("llama.attention.key_length") && c.dim % c.n_heads != 0) {
    return MakeError("%s: embedding_length %d is not a multiple of head_count %d", path.c_str(), c.dim, c.n_heads);
  }
  auto rd = GgufInt(f, "llama.rope.dimension_count", c.head_dim);
  if (!rd) return fail(rd.error());
  c.rope_dims = *rd;
  auto theta = f.GetF32Or("llama.rope.freq_base", 10000.f);
  if (!theta) return fail(theta.error());
  c.rope_theta = *theta;
  auto eps = f.GetF32Or("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return fail(eps.error());
  c.rms_eps = *eps;
  auto nv = GgufInt(f, "llama.vocab_size", int(m.vocab_.tokens.size()));
  if (!nv) return fail(nv.error());
  c.vocab_size = *nv;
  if (size_t(c.vocab_size) != m.vocab_.tokens.size()) {
    return MakeError("%s: llama.vocab_size %d differs from the %zu tokenizer tokens", path.c_str(), c.vocab_size,
                     m.vocab_.tokens.size());
  }
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  if (Status st = ValidateConfig(c); !st.ok()) return fail(st.error());

  LlamaWeights& w = m.weights_;
  const int64_t dim = c.dim, q_dim = int64_t(c.n_heads) * c.head_dim, kv_dim = int64_t(c.n_kv_heads) * c.head_dim;
  auto get = [&](const std::string& n, int64_t rows, int64_t cols, bool norm, TensorRef* out) -> Status {
    auto t = GgufTensor(f, n, rows, cols, norm);
    if (!t) return fail(t.error());
    *out = *t;
    return Status::Ok();
  };
  MNEMO_TRY(get("token_embd.weight", c.vocab_size, dim, false, &w.tok_embd));
  MNEMO_TRY(get("output_norm.weight", 1, dim, true, &w.output_norm));
  if (c.tied_output) {
    w.output = w.tok_embd;
  } else {
    MNEMO_TRY(get("output.weight", c.vocab_size, dim, false, &w.output));
  }
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; l++) {
    LlamaLayerWeights& L = w.layers[l];
    std::string p = "blk." + std::to_string(l) + ".";
    MNEMO_TRY(get(p + "attn_norm.weight", 1, dim, true, &L.attn_norm));
    MNEMO_TRY(get(p + "attn_q.weight", q_dim, dim, false, &L.wq));
    MNEMO_TRY(get(p + "attn_k.weight", kv_dim, dim, false, &L.wk));
    MNEMO_TRY(get(p + "attn_v.weight", kv_dim, dim, false, &L.wv));
    MNEMO_TRY(get(p + "attn_output.weight", dim, q_dim, false, &L.wo));
    MNEMO_TRY(get(p + "ffn_norm.weight", 1, dim, true, &L.ffn_norm));
    MNEMO_TRY(get(p + "ffn_gate.weight", c.ffn_dim, dim, false, &L.gate));
    MNEMO_TRY(get(p + "ffn_up.weight", c.ffn_dim, dim, false, &L.up));
    MNEMO_TRY(get(p + "ffn_down.weight", dim, c.ffn_dim, false, &L.down));
  }
  return m;
}

// ---- llama2.c ----

Result<ModelFile> ModelFile::OpenLlama2c(MappedFile map, const std::string& path, const std::string& tokenizer_path) {
  const uint64_t size = map.size();
  if (size >= 8) {
    uint32_t magic;
    std::memcpy(&magic, map.data(), 4);
    if (magic == 0x616b3432) {  // "ak42": llama2.c export versions 1 and 2
      int32_t version;
      std::memcpy(&version, map.data() + 4, 4);
      return MakeError("%s: llama2.c export version %d is not supported (only the legacy f32 format)", path.c_str(),
                       version);
    }
  }
  if (size < 28) return MakeError("%s: not a GGUF file or llama2.c checkpoint (%" PRIu64 " bytes)", path.c_str(), size);
  int32_t h[7];  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
  std::memcpy(h, map.data(), sizeof h);
  const int64_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4], seq_len = h[6];
  const bool shared = h[5] > 0;  // positive vocab_size: the classifier is the token embedding
  const int64_t vocab = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -int64_t(h[5]) : h[5]);
  // Bounds that keep all the size arithmetic below far from overflow.
  bool plausible = dim > 0 && dim <= (1 << 16) && hidden > 0 && hidden <= (1 << 18) && n_layers > 0 &&
                   n_layers <= 1024 && n_heads > 0 && n_heads <= dim && n_kv > 0 && n_kv <= n_heads && vocab > 0 &&
                   vocab <= (1 << 22) && seq_len > 0 && seq_len <= (1 << 24);
  if (!plausible) {
    return MakeError("%s: not a GGUF file or llama2.c checkpoint (header dim=%d hidden_dim=%d n_layers=%d n_heads=%d "
                     "n_kv_heads=%d vocab_size=%d seq_len=%d)",
                     path.c_str(), h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
  }
  if (dim % n_heads != 0 || n_heads % n_kv != 0) {
    return MakeError("%s: llama2.c header: dim %" PRId64 ", n_heads %" PRId64 ", n_kv_heads %" PRId64
                     " are inconsistent",
                     path.c_str(), dim, n_heads, n_kv);
  }
  const int64_t head_dim = dim / n_heads, kv_dim = n_kv * head_dim;
  ModelFile m;
  m.format_ = ModelFormat::kLlama2c;
  m.path_ = path;
  m.name_ = BaseName(path);
  LlamaConfig& c = m.config_;
  c.dim = int(dim);
  c.n_layers = int(n_layers);
  c.n_heads = int(n_heads);
  c.n_kv_heads = int(n_kv);
  c.head_dim = int(head_dim);
  c.ffn_dim = int(hidden);
  c.vocab_size = int(vocab);
  c.rope_dims = int(head_dim);
  c.rope_theta = 10000.f;
  c.rms_eps = 1e-5f;
  c.context_length = int(seq_len);
  c.tied_output = shared;
  if (Status st = ValidateConfig(c); !st.ok()) return MakeError("%s: %s", path.c_str(), st.error().message.c_str());

  // Float offsets of each array, in file order (all layers of one kind are contiguous).
  const int64_t L = n_layers;
  int64_t off = 0;
  auto take = [&off](int64_t n) { int64_t o = off; off += n; return o; };
  const int64_t o_emb = take(vocab * dim), o_att = take(L * dim), o_wq = take(L * dim * dim),
                o_wk = take(L * dim * kv_dim), o_wv = take(L * dim * kv_dim), o_wo = take(L * dim * dim),
                o_ffn = take(L * dim), o_w1 = take(L * hidden * dim), o_w2 = take(L * dim * hidden),
                o_w3 = take(L * hidden * dim), o_fin = take(dim);
  take(seq_len * head_dim);  // freq_cis_real [seq_len, head_dim / 2], then imag: unused
  const int64_t o_cls = shared ? o_emb : take(vocab * dim);
  const uint64_t want = 28 + 4 * uint64_t(off);
  if (size != want) {
    return MakeError("%s: llama2.c checkpoint is %" PRIu64 " bytes, but its header (dim=%d hidden_dim=%d n_layers=%d "
                     "n_heads=%d n_kv_heads=%d vocab_size=%d seq_len=%d) implies %" PRIu64,
                     path.c_str(), size, h[0], h[1], h[2], h[3], h[4], h[5], h[6], want);
  }
  const float* base = reinterpret_cast<const float*>(map.data() + 28);
  auto ref = [base](int64_t o, int64_t rows, int64_t cols) { return TensorRef{DType::F32, base + o, rows, cols}; };
  LlamaWeights& w = m.weights_;
  w.tok_embd = ref(o_emb, vocab, dim);
  w.output_norm = ref(o_fin, 1, dim);
  w.output = ref(o_cls, vocab, dim);
  w.layers.resize(L);
  for (int64_t l = 0; l < L; l++) {
    LlamaLayerWeights& y = w.layers[l];
    y.attn_norm = ref(o_att + l * dim, 1, dim);
    y.wq = ref(o_wq + l * dim * dim, dim, dim);
    y.wk = ref(o_wk + l * kv_dim * dim, kv_dim, dim);
    y.wv = ref(o_wv + l * kv_dim * dim, kv_dim, dim);
    y.wo = ref(o_wo + l * dim * dim, dim, dim);
    y.ffn_norm = ref(o_ffn + l * dim, 1, dim);
    y.gate = ref(o_w1 + l * hidden * dim, hidden, dim);
    y.down = ref(o_w2 + l * dim * hidden, dim, hidden);
    y.up = ref(o_w3 + l * hidden * dim, hidden, dim);
  }
  m.map_ = std::move(map);

  std::string tok = tokenizer_path;
  if (tok.empty()) {
    std::string dir = DirOf(path);
    for (std::string cand : {dir + "/tokenizer.bin", dir + "/tok" + std::to_string(vocab) + ".bin"}) {
      if (FileExists(cand)) {
        tok = cand;
        break;
      }
    }
    if (tok.empty()) {
      return MakeError("%s: no tokenizer given, and neither tokenizer.bin nor tok%" PRId64 ".bin is next to it",
                       path.c_str(), vocab);
    }
  }
  auto v = ReadLlama2cVocab(tok, int(vocab));
  if (!v) return v.error();
  m.vocab_ = std::move(v).value();
  return m;
}

Result<Vocab> ReadLlama2cVocab(const std::string& path, int n_vocab) {
  auto map = MappedFile::Open(path);
  if (!map) return map.error();
  const uint8_t* p = map->data();
  const uint64_t size = map->size();
  uint64_t pos = 0;
  auto read = [&](void* dst, uint64_t n) {
    if (n > size - pos) return false;
    std::memcpy(dst, p + pos, n);
    pos += n;
    return true;
  };
  int32_t max_len;
  if (!read(&max_len, 4) || max_len <= 0) return MakeError("%s: not a llama2.c tokenizer file", path.c_str());
  if (n_vocab <= 0 || uint64_t(n_vocab) > (size - pos) / 8) {
    return MakeError("%s: too short for %d tokens (%" PRIu64 " bytes)", path.c_str(), n_vocab, size);
  }
  Vocab v;
  v.model = "llama";
  v.pre = "default";
  v.tokens.resize(n_vocab);
  v.scores.resize(n_vocab);
  v.types.resize(n_vocab, int32_t(TokenType::kNormal));
  for (int id = 0; id < n_vocab; id++) {
    int32_t len;
    if (!read(&v.scores[id], 4) || !read(&len, 4)) {
      return MakeError("%s: truncated at token %d of %d", path.c_str(), id, n_vocab);
    }
    if (len < 0 || uint64_t(len) > size - pos) {
      return MakeError("%s: token %d has length %d past the end of the file", path.c_str(), id, len);
    }
    std::string s(reinterpret_cast<const char*>(p + pos), size_t(len));
    pos += uint64_t(len);
    if (s == "\n<s>\n") s = "<s>";
    if (s == "\n</s>\n") s = "</s>";
    std::string t;
    for (char ch : s) {
      if (ch == ' ') t += kSpmSpace;
      else t += ch;
    }
    bool byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(uint8_t(t[3])) &&
                std::isxdigit(uint8_t(t[4]));
    if (id == 0) v.types[id] = int32_t(TokenType::kUnknown);
    else if (id == 1 || id == 2) v.types[id] = int32_t(TokenType::kControl);
    else if (byte) v.types[id] = int32_t(TokenType::kByte);
    v.tokens[id] = std::move(t);
  }
  if (pos != size) {
    return MakeError("%s: %" PRIu64 " bytes left after %d tokens (does the vocabulary size match?)", path.c_str(),
                     size - pos, n_vocab);
  }
  v.bos = n_vocab > 1 ? 1 : -1;
  v.eos = n_vocab > 2 ? 2 : -1;
  v.unk = 0;
  v.pad = -1;
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = true;
  return v;
}

}  // namespace mnemo
