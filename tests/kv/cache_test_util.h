// Helpers shared by the CacheManager tests: a policy with a fixed cost model, and admissions and
// turns driven as the engine's steps drive them (upkeep and transfers completing in between).
#pragma once

#include <memory>

#include "kv/cache_manager.h"
#include "kv/eviction.h"

namespace mnemo::kvtest {

inline std::unique_ptr<EvictionPolicy> Policy(const char* name) {
  CostModel cost{1000.0, 10.0};
  return std::move(MakeEvictionPolicy(name, cost).value());
}

// Completes every queued transfer (as a transfer engine would).
inline void Drain(CacheManager& cm, bool ok = true) {
  for (int round = 0; round < 8; round++) {
    auto ops = cm.TakeTransfers();
    if (ops.empty()) break;
    for (const auto& op : ops) cm.OnTransferDone(op.id, ok);
  }
}

// Acquires as the engine's steps do: while it answers kLater, upkeep makes room and copies land.
inline Admission Admit(CacheManager& cm, SessionId s, int n_tokens, double now, CacheManager::Acquired* a) {
  Admission r = cm.Acquire(s, n_tokens, now, a);
  for (int i = 0; i < 8 && r == Admission::kLater; i++) {
    cm.Maintain(0, now);
    Drain(cm);
    r = cm.Acquire(s, n_tokens, now, a);
  }
  return r;
}

// A turn: acquire n_tokens, complete its swap-ins, release.
inline Admission Turn(CacheManager& cm, SessionId s, int n_tokens, double now, CacheManager::Acquired* a = nullptr) {
  CacheManager::Acquired local;
  if (!a) a = &local;
  Admission r = Admit(cm, s, n_tokens, now, a);
  if (r != Admission::kOk) return r;
  for (const auto& op : a->swap_ins) cm.OnTransferDone(op.id, true);
  cm.Release(s, n_tokens, now);
  return r;
}

}  // namespace mnemo::kvtest
