#include "workload/workload.h"

#include <algorithm>
#include <cmath>

#include "base/rng.h"

namespace mnemo {
namespace {

// A small fixed word list; the texts only need to be plausible input for a tokenizer.
const char* const kWords[] = {
    "the", "a", "little", "dog", "cat", "house", "garden", "tree", "sun", "rain", "happy", "sad", "big",
    "small", "red", "blue", "green", "friend", "mother", "father", "girl", "boy", "play", "run", "jump",
    "look", "see", "find", "make", "help", "want", "like", "go", "come", "home", "park", "school", "day",
    "night", "time", "story", "tell", "ask", "answer", "question", "why", "how", "what", "when", "where",
    "please", "explain", "write", "code", "function", "list", "number", "simple", "example", "with",
    "and", "but", "because", "then", "after", "before", "very", "good", "bad", "new", "old", "water",
    "ball", "book", "toy", "car", "bird", "fish", "flower", "sky", "road", "river", "hill", "light"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

int LogNormal(Rng& rng, double median, double sigma, int lo, int hi) {
  double v = median * std::exp(sigma * rng.Normal());
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

}  // namespace

std::string SyntheticText(uint64_t seed, int n_words) {
  Rng rng(seed);
  std::string s;
  for (int i = 0; i < n_words; i++) {
    const char* w = kWords[rng.Next() % kNumWords];
    if (i > 0) s += (i % 11 == 0) ? ". " : " ";
    if (i % 11 == 0) {
      s += static_cast<char>(std::toupper(w[0]));
      s += w + 1;
    } else {
      s += w;
    }
  }
  if (n_words > 0) s += ".";
  return s;
}

std::vector<ConversationPlan> MakeWorkload(const WorkloadConfig& cfg) {
  Rng rng(cfg.seed);
  std::vector<ConversationPlan> out;
  const double p = 1.0 / std::max(1.0, cfg.mean_turns);  // geometric turn count with this mean
  for (int c = 0; c < cfg.conversations; c++) {
    ConversationPlan conv;
    conv.index = c;
    conv.system_text = "You are a helpful assistant. " + SyntheticText(rng.Next(), cfg.system_tokens);
    int turns = 1;
    while (turns < cfg.max_turns && rng.UniformDouble() > p) turns++;
    for (int t = 0; t < turns; t++) {
      TurnPlan tp;
      tp.user_tokens = LogNormal(rng, cfg.input_median, cfg.input_sigma, cfg.min_len, cfg.max_len);
      tp.user_text = SyntheticText(rng.Next(), tp.user_tokens);
      tp.output_tokens = LogNormal(rng, cfg.output_median, cfg.output_sigma, cfg.min_len, cfg.max_len);
      tp.think_s = t == 0 ? 0 : -cfg.think_mean_s * std::log(1.0 - rng.UniformDouble());
      conv.turns.push_back(std::move(tp));
    }
    out.push_back(std::move(conv));
  }
  return out;
}

}  // namespace mnemo
