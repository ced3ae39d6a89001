#include "format/gguf_vocab.h"

#include <algorithm>

namespace mnemo::gguf {
namespace {

// Token texts llama.cpp treats as end of generation whatever their declared type (llama-vocab.cpp
// keeps the same list, as it says, until converters declare such tokens in metadata).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["};

// Fills v.eog_ids: eos, the declared eot/eom ids, and tokens spelled as in kEogTexts. Sorted, unique.
Status ReadEogIds(const GgufFile& f, Vocab& v) {
  std::vector<int32_t> ids;
  if (v.eos >= 0) ids.push_back(v.eos);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (!f.Has(key)) continue;
    auto id = f.GetI64(key);
    if (!id) return id.error();
    if (*id >= 0 && uint64_t(*id) < v.tokens.size()) ids.push_back(int32_t(*id));
  }
  for (size_t i = 0; i < v.tokens.size(); i++) {
    for (const char* t : kEogTexts) {
      if (v.tokens[i] == t) ids.push_back(int32_t(i));
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  v.eog_ids = std::move(ids);
  return Status::Ok();
}

}  // namespace

Result<Vocab> ReadVocab(const GgufFile& f) {
  Vocab v;
  auto model = f.GetStringOr("tokenizer.ggml.model", "llama");
  if (!model) return model.error();
  v.model = *model;
  bool spm = v.model == "llama";
  bool bpe = v.model == "gpt2";
  if (!spm && !bpe) {
    return MakeError("tokenizer model '%s' is not supported (only \"llama\" SPM and \"gpt2\" BPE)", v.model.c_str());
  }
  auto pre = f.GetStringOr("tokenizer.ggml.pre", "default");
  if (!pre) return pre.error();
  v.pre = *pre;

  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error();
  v.tokens = std::move(tokens).value();
  size_t n = v.tokens.size();
  if (n == 0) return MakeError("tokenizer.ggml.tokens is empty");

  if (f.Has("tokenizer.ggml.scores")) {
    auto s = f.GetF32Array("tokenizer.ggml.scores");
    if (!s) return s.error();
    if (s->size() != n) return MakeError("tokenizer.ggml.scores has %zu entries for %zu tokens", s->size(), n);
    v.scores = std::move(s).value();
  }
  if (f.Has("tokenizer.ggml.token_type")) {
    auto t = f.GetI32Array("tokenizer.ggml.token_type");
    if (!t) return t.error();
    if (t->size() != n) return MakeError("tokenizer.ggml.token_type has %zu entries for %zu tokens", t->size(), n);
    v.types = std::move(t).value();
  }
  if (f.Has("tokenizer.ggml.merges")) {
    auto m = f.GetStringArray("tokenizer.ggml.merges");
    if (!m) return m.error();
    v.merges = std::move(m).value();
  }
  if (bpe && v.merges.empty()) return MakeError("BPE tokenizer without tokenizer.ggml.merges");

  // Defaults as llama.cpp sets them per tokenizer type.
  if (spm) {
    v.bos = 1, v.eos = 2, v.unk = 0, v.pad = -1;
    v.add_bos = true, v.add_eos = false, v.add_space_prefix = true;
  } else {
    v.bos = 11, v.eos = 11, v.unk = -1, v.pad = -1;
    v.add_bos = v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3";
    v.add_eos = false, v.add_space_prefix = false;
  }
  struct IdKey {
    const char* key;
    int32_t* dst;
  };
  for (IdKey k : {IdKey{"tokenizer.ggml.bos_token_id", &v.bos}, IdKey{"tokenizer.ggml.eos_token_id", &v.eos},
                  IdKey{"tokenizer.ggml.unknown_token_id", &v.unk},
                  IdKey{"tokenizer.ggml.padding_token_id", &v.pad}}) {
    if (f.Has(k.key)) {
      auto id = f.GetI64(k.key);
      if (!id) return id.error();
      *k.dst = *id >= 0 && uint64_t(*id) < n ? int32_t(*id) : -1;
    } else if (*k.dst >= int64_t(n)) {
      *k.dst = -1;
    }
  }
  struct FlagKey {
    const char* key;
    bool* dst;
  };
  for (FlagKey k : {FlagKey{"tokenizer.ggml.add_bos_token", &v.add_bos},
                    FlagKey{"tokenizer.ggml.add_eos_token", &v.add_eos},
                    FlagKey{"tokenizer.ggml.add_space_prefix", &v.add_space_prefix}}) {
    auto b = f.GetBoolOr(k.key, *k.dst);
    if (!b) return b.error();
    *k.dst = *b;
  }
  MNEMO_TRY(ReadEogIds(f, v));
  auto tmpl = f.GetStringOr("tokenizer.chat_template", "");
  if (!tmpl) return tmpl.error();
  v.chat_template = *tmpl;
  return v;
}

}  // namespace mnemo::gguf
