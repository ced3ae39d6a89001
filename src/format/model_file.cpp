#include "format/model_file.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <cctype>
#include <cinttypes>
#include <cstring>

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

}  // namespace

const char* ModelFormatName(ModelFormat f) { return f == ModelFormat::kGguf ? "gguf" : "llama2.c"; }

uint64_t VocabFingerprint(const Vocab& v) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add_string = [&](const std::string& s) {
    const uint64_t n = s.size();
    XXH3_64bits_update(st, &n, sizeof n);  // length-prefixed: {"ab","c"} != {"a","bc"}
    XXH3_64bits_update(st, s.data(), s.size());
  };
  add_string(v.model);
  add_string(v.pre);
  for (const auto& t : v.tokens) add_string(t);
  XXH3_64bits_update(st, v.types.data(), v.types.size() * sizeof(int32_t));
  const int32_t special[4] = {v.bos, v.eos, v.unk, v.pad};
  XXH3_64bits_update(st, special, sizeof special);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

uint64_t ModelFile::Fingerprint() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  if (gguf_) {
    for (const auto& t : gguf_->tensors()) {
      XXH3_64bits_update(st, t.name.data(), t.name.size() + 1);  // with its NUL: names are delimited
      XXH3_64bits_update(st, t.dims.data(), t.dims.size() * sizeof(int64_t));
      XXH3_64bits_update(st, &t.type, sizeof t.type);
      XXH3_64bits_update(st, t.data, t.nbytes);
    }
  } else {
    XXH3_64bits_update(st, map_.data(), map_.size());  // the whole checkpoint: header and weights
  }
  const uint64_t vocab = VocabFingerprint(vocab_);
  XXH3_64bits_update(st, &vocab, sizeof vocab);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

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
  ModelConfig& c = m.config_;
  c.arch = Arch::kLlama;
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
  FillUniformLayers(c);
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
  ModelWeights& w = m.weights_;
  w.tok_embd = ref(o_emb, vocab, dim);
  w.output_norm = ref(o_fin, 1, dim);
  w.output = ref(o_cls, vocab, dim);
  w.layers.resize(L);
  for (int64_t l = 0; l < L; l++) {
    LayerWeights& y = w.layers[l];
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
