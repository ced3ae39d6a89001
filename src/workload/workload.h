// A synthetic multi-turn chat workload shaped like ShareGPT, deterministic from a seed: the same
// conversations, turn texts, output lengths and think times for every system under test. Shared
// by `bench multiturn` (in process) and `bench serve` (over HTTP).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mnemo {

struct WorkloadConfig {
  uint64_t seed = 1;               // everything below is a function of the seed
  int conversations = 24;          // conversations in the run
  double mean_turns = 5.56;        // mean user turns per conversation (geometric, capped)
  int max_turns = 12;              // cap on turns per conversation
  double input_median = 48;        // user message length in tokens: lognormal median
  double input_sigma = 0.8;        // lognormal sigma of the user message length
  double output_median = 96;       // reply length in tokens: lognormal median
  double output_sigma = 0.6;       // lognormal sigma of the reply length
  int min_len = 4;                 // shortest message / reply, tokens
  int max_len = 512;               // longest message / reply, tokens
  int system_tokens = 48;          // system prompt length (tokens, approximate in words)
  double think_mean_s = 1.0;       // mean think time between a reply and the next message (exponential)
};

struct TurnPlan {
  std::string user_text;    // the user's message
  int user_tokens = 0;      // its planned length in tokens (the text has about that many words)
  int output_tokens = 0;    // forced reply length
  double think_s = 0;       // pause before sending this message (0 for the first)
};

struct ConversationPlan {
  int index = 0;            // position in the run
  std::string system_text;  // the system prompt
  std::vector<TurnPlan> turns;
};

std::vector<ConversationPlan> MakeWorkload(const WorkloadConfig& cfg);

// Deterministic English-like text of about n words.
std::string SyntheticText(uint64_t seed, int n_words);

}  // namespace mnemo
