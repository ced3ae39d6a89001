// Selective context, reuse mode: composing a session from another's cached KV (engine thread).
#include <cstring>

#include "engine/engine.h"
#include "kernels/cpu/ops.h"

namespace mnemo {

Result<CacheManager::Acquired> Engine::AcquireNow(SessionId s, int n) {
  CacheManager::Acquired a;
  for (int tries = 0;; tries++) {
    PollTransfers();
    Admission ad = cache_->Acquire(s, n, Now(), &a);
    if (ad == Admission::kOk) break;
    if (ad == Admission::kImpossible || tries > 100) {
      return MakeError("the KV of %d positions cannot be brought into the compute tier now", n);
    }
    cache_->Maintain(0, Now());  // makes the room Acquire asked for, starts its disk loads
    SubmitTransfers();
    transfer_->WaitIdle();
  }
  if (!a.swap_ins.empty()) transfer_->SubmitSwapIns(a.swap_ins)->WaitLayer(t0_->shape().n_layers - 1);
  return a;
}

Result<SessionId> Engine::ComposeSession(SessionId src, std::vector<int32_t> tokens, const std::vector<KvRun>& runs) {
  Result<SessionId> out = MakeError("unknown session %lld", static_cast<long long>(src));
  Call([&] {
    auto it = sessions_.find(src);
    if (it == sessions_.end()) return;
    if (it->second.busy) {
      out = MakeError("session %lld has a turn in progress", static_cast<long long>(src));
      return;
    }
    const int n = static_cast<int>(tokens.size());
    if (n == 0 || n >= max_context_) {
      out = MakeError("a composed context must hold 1 to %d tokens", max_context_ - 1);
      return;
    }
    const int src_kv = cache_->kv_tokens(src);
    auto a = AcquireNow(src, src_kv);
    if (!a.ok()) {
      out = a.error();
      return;
    }
    std::vector<bool> src_valid(src_kv, true);  // positions whose KV is really there
    for (int c : a->recompute) {
      for (int p = c * kBlockTokens; p < std::min(src_kv, (c + 1) * kBlockTokens); p++) src_valid[p] = false;
    }
    const SessionId dst = next_session_++;
    Session& d = sessions_[dst];
    d.id = dst;
    d.tokens = std::move(tokens);
    d.turns.push_back(Turn{0, n, n});
    d.created = d.last_active = Now();
    cache_->AddSession(dst, d.last_active);
    auto b = AcquireNow(dst, n);
    if (!b.ok()) {
      cache_->Release(src, src_kv, Now());
      for (int c : a->recompute) cache_->Invalidate(src, c);
      cache_->RemoveSession(dst);
      sessions_.erase(dst);
      out = b.error();
      return;
    }
    // Copy K (re-rotated) and V rows, layer by layer, head by head.
    const KvShape& shape = t0_->shape();
    const size_t row = DTypeBytes(shape.dtype, shape.head_dim);
    std::vector<float> k(shape.head_dim);
    std::vector<bool> filled(n, false);
    for (const KvRun& run : runs) {
      for (int i = 0; i < run.len; i++) {
        const int o = run.src_pos + i, p = run.dst_pos + i;
        if (o < 0 || o >= src_kv || !src_valid[o] || p < 0 || p >= n) continue;
        const int32_t delta = p - o;
        for (int l = 0; l < shape.n_layers; l++) {
          auto* from = static_cast<char*>(t0_->block(l, a->block_table[o / kBlockTokens]));
          auto* to = static_cast<char*>(t0_->block(l, b->block_table[p / kBlockTokens]));
          for (int h = 0; h < shape.n_kv_heads; h++) {
            const size_t k_off = row * ((size_t(h) * kBlockTokens) + o % kBlockTokens);
            const size_t k_dst = row * ((size_t(h) * kBlockTokens) + p % kBlockTokens);
            const size_t v_base = row * size_t(shape.n_kv_heads) * kBlockTokens;
            ToF32(shape.dtype, from + k_off, k.data(), shape.head_dim);
            model_.ReRotateKeys(l, k.data(), 1, delta);
            FromF32(shape.dtype, k.data(), to + k_dst, shape.head_dim);
            std::memcpy(to + v_base + k_dst, from + v_base + k_off, row);
          }
        }
        filled[p] = true;
      }
    }
    cache_->Release(src, src_kv, Now());
    for (int c : a->recompute) cache_->Invalidate(src, c);
    cache_->Release(dst, n, Now());
    for (int c = 0; c * kBlockTokens < n; c++) {
      for (int p = c * kBlockTokens; p < std::min(n, (c + 1) * kBlockTokens); p++) {
        if (!filled[p]) {
          cache_->Invalidate(dst, c);
          break;
        }
      }
    }
    out = dst;
  });
  return out;
}

}  // namespace mnemo
