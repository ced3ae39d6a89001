#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "format/gguf.h"
#include "format/gguf_vocab.h"

namespace mnemo::test {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double BestEncodeSeconds(const Tokenizer& tok, const std::string& text, bool add_special) {
  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    const double t0 = ThreadCpuSeconds();
    const size_t n = tok.Encode(text, add_special).size();
    best = std::min(best, ThreadCpuSeconds() - t0);
    EXPECT_GT(n, 0u);
  }
  return std::max(best, 1e-6);
}
}  // namespace

double EncodeCostRatio(const Tokenizer& tok, const std::string& small, const std::string& large, bool add_special) {
  return BestEncodeSeconds(tok, large, add_special) / BestEncodeSeconds(tok, small, add_special);
}

std::vector<std::string> ReadVocabStrings(const std::string& name) {
  const std::string inp = ReadFile(kVocabDir + name + ".inp");
  const std::string sep = "__ggml_vocab_test__\n";
  std::vector<std::string> strings;
  size_t pos = 0;
  for (size_t next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
    // Each string is followed by "\n" and the separator line.
    std::string s = inp.substr(pos, next - pos);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    strings.push_back(std::move(s));
  }
  return strings;
}

std::vector<VocabVector> ReadVocabVectors(const std::string& name) {
  const std::vector<std::string> strings = ReadVocabStrings(name);
  std::istringstream out(ReadFile(kVocabDir + name + ".out"));
  std::vector<VocabVector> vectors;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    if (i >= strings.size()) return {};
    VocabVector v{strings[i], {}};
    std::istringstream ls(line);
    for (int32_t id; ls >> id;) v.ids.push_back(id);
    vectors.push_back(std::move(v));
  }
  if (vectors.size() != strings.size()) return {};
  return vectors;
}

bool ReadTok512(const std::string& path, Vocab* vocab) {
  const std::string data = ReadFile(path);
  size_t pos = 0;
  const auto read = [&](void* dst, size_t n) {
    if (pos + n > data.size()) return false;
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
    return true;
  };
  int32_t max_len = 0;
  if (!read(&max_len, 4)) return false;
  *vocab = Vocab{};
  vocab->model = "llama";
  vocab->pre = "default";
  while (pos < data.size()) {
    float score;
    int32_t len;
    if (!read(&score, 4) || !read(&len, 4) || len < 0 || len > max_len + 8) return false;
    std::string raw(static_cast<size_t>(len), '\0');
    if (!read(raw.data(), raw.size())) return false;
    std::string text;
    if (raw == "\n<s>\n") {
      text = "<s>";
    } else if (raw == "\n</s>\n") {
      text = "</s>";
    } else {
      for (const char c : raw) text += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    }
    const int32_t id = static_cast<int32_t>(vocab->tokens.size());
    TokenType type = TokenType::kNormal;
    if (id == 0) type = TokenType::kUnknown;
    if (id == 1 || id == 2) type = TokenType::kControl;
    if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') type = TokenType::kByte;
    vocab->tokens.push_back(text);
    vocab->scores.push_back(score);
    vocab->types.push_back(static_cast<int32_t>(type));
  }
  vocab->unk = 0;
  vocab->bos = 1;
  vocab->eos = 2;
  vocab->add_bos = true;
  vocab->add_eos = false;
  vocab->add_space_prefix = true;
  return true;
}

std::unique_ptr<Tokenizer> LoadGgufTokenizer(const std::string& path) {
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) {
    ADD_FAILURE() << path << ": " << file.error().message;
    return nullptr;
  }
  auto vocab = gguf::ReadVocab(*file);
  if (!vocab.ok()) {
    ADD_FAILURE() << path << ": " << vocab.error().message;
    return nullptr;
  }
  auto tok = Tokenizer::Create(*vocab);
  if (!tok.ok()) {
    ADD_FAILURE() << path << ": " << tok.error().message;
    return nullptr;
  }
  return std::move(*tok);
}

NaiveSpm::NaiveSpm(const Vocab& vocab) : vocab_(vocab) {
  for (size_t i = 0; i < vocab.tokens.size(); ++i) lookup_[vocab.tokens[i]] = static_cast<int32_t>(i);
}

int32_t NaiveSpm::Find(const std::string& s) const {
  auto it = lookup_.find(s);
  return it == lookup_.end() ? -1 : it->second;
}

std::vector<int32_t> NaiveSpm::Encode(const std::string& text) const {
  const Vocab& vocab = vocab_;
  const auto find = [&](const std::string& s) { return Find(s); };
  std::string escaped;
  for (const char c : text) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  std::vector<int32_t> tokens;
  if (!text.empty()) tokens.push_back(find("\xE2\x96\x81"));
  for (size_t i = 0; i < escaped.size();) {
    size_t len = 1;  // run.c: a byte plus its continuation bytes, at most 4
    while (i + len < escaped.size() && len < 4 && (static_cast<uint8_t>(escaped[i + len]) & 0xC0) == 0x80) ++len;
    const std::string ch = escaped.substr(i, len);
    const int32_t id = find(ch);
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (const char c : ch) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "<0x%02X>", static_cast<uint8_t>(c));
        tokens.push_back(find(hex));
      }
    }
    i += len;
  }
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_idx = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int32_t id = find(vocab.tokens[tokens[i]] + vocab.tokens[tokens[i + 1]]);
      if (id >= 0 && vocab.scores[id] > best_score) {
        best_score = vocab.scores[id];
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  return tokens;
}

std::vector<std::string> NaiveBpeWord(const std::map<std::string, int>& ranks, const std::string& word) {
  std::vector<std::string> symbols;
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    while (i + len < word.size() && (static_cast<uint8_t>(word[i + len]) & 0xC0) == 0x80) ++len;
    symbols.push_back(word.substr(i, len));
    i += len;
  }
  while (symbols.size() > 1) {
    int best_rank = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = ranks.find(symbols[i] + " " + symbols[i + 1]);
      if (it != ranks.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank < 0) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return symbols;
}

}  // namespace mnemo::test
