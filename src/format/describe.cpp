#include "format/describe.h"

#include <cinttypes>
#include <cstdarg>
#include <cstring>
#include <map>

#include "format/mapped_file.h"

namespace mnemo {
namespace {

void Appendf(std::string* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Appendf(std::string* s, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) s->append(buf, std::min<size_t>(size_t(n), sizeof buf - 1));
}

std::string Bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1 << 30));
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1 << 20));
  else if (b >= (1 << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  return buf;
}

std::string Count(int64_t n) {
  char buf[32];
  if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.2fB", double(n) / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.2fM", double(n) / 1e6);
  else if (n >= 1000) std::snprintf(buf, sizeof buf, "%.1fK", double(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%" PRId64, n);
  return buf;
}

std::string TokenDesc(const Vocab& v, int32_t id) {
  if (id < 0) return "none";
  std::string s = std::to_string(id);
  if (size_t(id) < v.tokens.size()) {
    s += " \"";
    for (char c : v.tokens[size_t(id)].substr(0, 24)) s += c == '\n' ? std::string("\\n") : std::string(1, c);
    s += "\"";
  }
  return s;
}

struct TypeTotal {
  int tensors = 0;
  uint64_t bytes = 0;
};

void TensorSummary(std::string* s, const std::map<std::string, TypeTotal>& by_type) {
  int n = 0;
  uint64_t total = 0;
  for (const auto& [name, t] : by_type) n += t.tensors, total += t.bytes;
  Appendf(s, "tensors:      %d, %s\n", n, Bytes(total).c_str());
  for (const auto& [name, t] : by_type) {
    Appendf(s, "  %-10s  %4d tensors  %s\n", name.c_str(), t.tensors, Bytes(t.bytes).c_str());
  }
}

}  // namespace

std::string DescribeModel(const ModelFile& m) {
  std::string s;
  const ModelConfig& c = m.config();
  Appendf(&s, "file:         %s\n", m.path().c_str());
  if (const gguf::GgufFile* g = m.gguf()) {
    Appendf(&s, "format:       gguf v%u (%s, %zu metadata keys)\n", g->version(), Bytes(g->file_size()).c_str(),
            g->metadata().size());
  } else {
    Appendf(&s, "format:       llama2.c checkpoint (f32)\n");
  }
  Appendf(&s, "name:         %s\n", m.name().c_str());
  Appendf(&s, "architecture: %s\n", ArchName(c.arch));
  Appendf(&s, "config:       dim %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d\n", c.dim,
          c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size);
  Appendf(&s, "              rope dims %d, rope theta %g, rms eps %g, context %d, output %s\n", c.rope_dims,
          double(c.rope_theta), double(c.rms_eps), c.context_length, c.tied_output ? "tied to embedding" : "separate");
  {
    const RopeConfig& r = c.layers.empty() ? RopeConfig{} : c.layers[0].rope;
    int windowed = 0;
    for (const LayerConfig& l : c.layers) windowed += l.sliding_window > 0;
    Appendf(&s, "features:     rope %s%s%s%s, qkv bias %s, qk norm %s, post norms %s, ffn %s\n", RopeStyleName(c.rope_style),
            r.freq_factors.empty() ? "" : " + frequency factors", r.freq_scale != 1.f ? " + linear scaling" : "",
            c.rope_factors_long.empty() ? "" : " + long factors", c.qkv_bias ? "yes" : "no", c.qk_norm ? "yes" : "no",
            c.post_norms ? "yes" : "no", c.ffn_act == FfnActivation::kSilu ? "swiglu" : "geglu-tanh");
    if (windowed > 0 || c.attn_softcap > 0 || c.final_softcap > 0 || c.embed_scale != 1.f) {
      Appendf(&s, "              sliding-window layers %d of %d, attn softcap %g, final softcap %g, embed scale %g\n",
              windowed, c.n_layers, double(c.attn_softcap), double(c.final_softcap), double(c.embed_scale));
    }
  }

  const ModelWeights& w = m.weights();
  std::map<std::string, TypeTotal> by_type;
  int64_t params = 0;
  auto add = [&](const TensorRef& t) {
    TypeTotal& tt = by_type[DTypeName(t.dtype)];
    tt.tensors++;
    tt.bytes += t.bytes();
    params += t.rows * t.cols;
  };
  add(w.tok_embd);
  add(w.output_norm);
  if (!c.tied_output) add(w.output);
  for (const auto& l : w.layers) {
    for (const TensorRef* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wqkv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm,
                               &l.wo, &l.attn_post_norm, &l.ffn_norm, &l.gate, &l.up, &l.down, &l.ffn_post_norm}) {
      if (t->present()) add(*t);
    }
  }
  Appendf(&s, "parameters:   %s (%" PRId64 ")\n", Count(params).c_str(), params);

  const Vocab& v = m.vocab();
  Appendf(&s, "tokenizer:    %s (pre %s), %zu tokens, %zu merges\n", v.model.c_str(), v.pre.c_str(), v.tokens.size(),
          v.merges.size());
  Appendf(&s, "              bos %s, eos %s, unk %s, pad %s\n", TokenDesc(v, v.bos).c_str(), TokenDesc(v, v.eos).c_str(),
          TokenDesc(v, v.unk).c_str(), TokenDesc(v, v.pad).c_str());
  Appendf(&s, "              add bos %s, add eos %s, space prefix %s, chat template %s\n", v.add_bos ? "yes" : "no",
          v.add_eos ? "yes" : "no", v.add_space_prefix ? "yes" : "no",
          v.chat_template.empty() ? "none" : (std::to_string(v.chat_template.size()) + " chars").c_str());
  TensorSummary(&s, by_type);
  return s;
}

std::string DescribeGguf(const gguf::GgufFile& f, bool list_tensors) {
  std::string s;
  Appendf(&s, "file:         %s\n", f.path().c_str());
  Appendf(&s, "format:       gguf v%u, %s, alignment %" PRIu64, f.version(), Bytes(f.file_size()).c_str(),
          f.alignment());
  if (!f.tensors().empty()) Appendf(&s, ", data at %" PRIu64, f.data_offset());
  s += '\n';
  Appendf(&s, "metadata:     %zu keys\n", f.metadata().size());
  for (const auto& kv : f.metadata()) {
    std::string val = kv.value.ToString(6);
    if (val.size() > 160) val = val.substr(0, 157) + "...";
    Appendf(&s, "  %-44.*s %s\n", int(kv.key.size()), kv.key.data(), val.c_str());
  }
  std::map<std::string, TypeTotal> by_type;
  for (const auto& t : f.tensors()) {
    auto info = gguf::GgmlType(t.type);
    TypeTotal& tt = by_type[info ? info->name : "?"];
    tt.tensors++;
    tt.bytes += t.nbytes;
  }
  TensorSummary(&s, by_type);
  if (list_tensors) {
    for (const auto& t : f.tensors()) {
      std::string dims;
      for (int64_t d : t.dims) {
        if (!dims.empty()) dims += ", ";
        dims += std::to_string(d);
      }
      auto info = gguf::GgmlType(t.type);
      Appendf(&s, "  %-32s %-6s [%s]\n", t.name.c_str(), info ? info->name : "?", dims.c_str());
    }
  }
  return s;
}

Result<std::string> DescribeFile(const std::string& path, const std::string& tokenizer_path) {
  auto m = ModelFile::Open(path, tokenizer_path);
  if (m) return DescribeModel(*m);
  auto g = gguf::GgufFile::Open(path);
  if (!g) return m.error();  // not a GGUF: the model error says why
  std::string s = DescribeGguf(*g, false);
  s += "not loadable as a model: " + m.error().message + "\n";
  return s;
}

}  // namespace mnemo
