// Walks through automata shared by the grammar, JSON Schema and pattern tests: per-element masks
// against whole walks (automaton.h), random walks over a real vocabulary.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/rng.h"
#include "grammar/automaton.h"
#include "grammar/json_schema.h"

namespace mnemo::test {

// Walks `walks` random paths through two automata of one grammar, `a` with per-element masks and
// `whole` walking every new state whole (set_split_masks(false)), picking uniformly among the
// allowed tokens other than end of generation, and requires equal masks at every step. A walk's
// budget is budget(walk, TokensToEnd of the start) (INT_MAX: unbounded, then at most
// `unbounded_steps` steps); `what` names the grammar in failures.
void ExpectSplitMasksEqual(const std::shared_ptr<grammar::Automaton>& a, const std::shared_ptr<grammar::Automaton>& whole, int walks,
                           const std::function<int(int walk, int cost)>& budget, int unbounded_steps, Rng& rng,
                           const std::string& what);

// The same for a JSON Schema: its grammar compiled, `a` prepared as the server prepares it
// (Automaton::Prepare) against an unprepared whole-walk automaton; returns `a` (null when the
// schema does not compile: a test failure).
std::shared_ptr<grammar::Automaton> ExpectSchemaSplitMasksEqual(const grammar::OrderedJson& schema,
                                                                const std::shared_ptr<const grammar::TokenIndex>& idx, int walks,
                                                                const std::function<int(int walk, int cost)>& budget,
                                                                int unbounded_steps, Rng& rng);

// The token index of a vocabulary under shared/models (e.g. "vocab/ggml-vocab-llama-spm.gguf"), or
// null when it cannot be read.
std::shared_ptr<const grammar::TokenIndex> LoadIndex(const std::string& file);

// Walks from the start by picking uniformly among allowed tokens (end of generation with
// probability 1/2 when allowed) with a budget of `budget` tokens; returns the text and sets
// *ended when the grammar accepts it.
std::string RandomWalk(const std::shared_ptr<grammar::Automaton>& a, Rng& rng, int budget, bool* ended);

}  // namespace mnemo::test
