// Per-element masks against whole walks (automaton.h): the check shared by the grammar and JSON
// Schema tests.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/rng.h"
#include "grammar/automaton.h"

namespace mnemo::test {

// Walks `walks` random paths through two automata of one grammar, `a` with per-element masks and
// `whole` walking every new state whole (set_split_masks(false)), picking uniformly among the
// allowed tokens other than end of generation, and requires equal masks at every step. A walk's
// budget is budget(walk, TokensToEnd of the start) (INT_MAX: unbounded, then at most
// `unbounded_steps` steps); `what` names the grammar in failures.
void ExpectSplitMasksEqual(const std::shared_ptr<grammar::Automaton>& a, const std::shared_ptr<grammar::Automaton>& whole, int walks,
                           const std::function<int(int walk, int cost)>& budget, int unbounded_steps, Rng& rng,
                           const std::string& what);

}  // namespace mnemo::test
