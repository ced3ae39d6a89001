// mnemo bench convkv --eval: selective context measured by answers on a labelled evaluation set
// (the recall model's eval.jsonl), served through the same Service and Engine path as `mnemo
// serve` (bench_convkv_eval.cpp has the protocol).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"

namespace mnemo::app {

struct ConvkvEvalConfig {
  std::string model;                       // model file
  std::string eval;                        // JSONL: turns, question_turn, fact_turn, answer
  int limit = 0;                           // first N conversations; 0 = all
  std::vector<double> budgets{0.3, 0.5, 0.7};  // shares of the history tokens
  std::vector<std::string> modes{"exact", "reuse"};
  std::vector<std::string> methods{"3-factor", "relevance", "recency", "recent-only", "random"};
  std::string preset = "default";          // 3-factor weights
  std::string relevance = "keyword";       // relevance factor (context::ParseRelevanceKind)
  double relevance_temperature = 0.1;      // keyword sharpening (context::ScoringOptions)
  uint64_t seed = 1;                       // random baseline
  int max_tokens = 12;                     // generated per answer (the answer is its first line)
  int keep_last = 1;                       // newest turns always kept
  int hidden_layer = -1;                   // ServiceConfig::hidden_layer (relevance hidden)
  int attention_layers = 0;                // ServiceConfig::attention_layers (relevance attention)
  std::string dump_turns;                  // JSONL: every conversation's turn sizes and scores
  bool verbose = false;                    // per-conversation lines on stderr
  bool json = false;
  RuntimeFlags runtime;
};

// Runs the evaluation and prints the table (or one JSON object). Returns the exit code.
int RunConvkvEval(const ConvkvEvalConfig& c);

}  // namespace mnemo::app
