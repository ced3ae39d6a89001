// KvWrite and PagedAttention against a double-precision reference over contiguous K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/block.h"
#include "base/cpu.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "kernels/cpu/attention.h"

namespace mnemo::kernels {
namespace {

float RoundTrip(DType t, float v) {
  uint32_t raw = 0;
  FromF32(t, &v, &raw, 1);
  float r;
  ToF32(t, &raw, &r, 1);
  return r;
}

// A pool shared by several sequences, each with its own shuffled block table.
struct Pool {
  PagedKvLayer kv;
  std::vector<uint8_t> mem;  // [n_blocks, 2, n_kv_heads, 32, head_dim] of kv.dtype

  Pool(DType t, int n_blocks, int n_kv, int hd, Rng& rng) {
    kv = PagedKvLayer{nullptr, t, n_kv, hd};
    mem.resize(DTypeBytes(t, size_t(n_blocks) * 2 * n_kv * kBlockTokens * hd));
    // Garbage (including NaN bit patterns) where nothing is written: must never leak into results.
    for (auto& b : mem) b = uint8_t(rng.Next() | 0x80);
    kv.base = mem.data();
  }
};

struct Seq {
  std::vector<int32_t> table;  // [blocks] ids in the pool
  int n_ctx = 0;               // valid keys
  std::vector<float> k, v;     // [n_ctx, n_kv, hd], values as stored (rounded to the KV dtype)
  std::vector<int32_t> q_pos;  // [n_q]
  std::vector<float> q;        // [n_q, n_heads, hd]
};

// Writes n_ctx random tokens (in shuffled order, in a few KvWrite calls) through the table.
Seq MakeSeq(Pool& pool, std::vector<int32_t>& free_blocks, int n_ctx, int n_q, int n_heads,
            Rng& rng) {
  const PagedKvLayer& kv = pool.kv;
  const int row = kv.n_kv_heads * kv.head_dim;
  Seq s;
  s.n_ctx = n_ctx;
  const int n_blocks = (n_ctx + kBlockTokens - 1) / kBlockTokens;
  for (int b = 0; b < n_blocks; b++) {
    size_t pick = rng.Next() % free_blocks.size();
    s.table.push_back(free_blocks[pick]);
    free_blocks.erase(free_blocks.begin() + pick);
  }
  s.k.resize(size_t(n_ctx) * row);
  s.v.resize(size_t(n_ctx) * row);
  for (auto* buf : {&s.k, &s.v}) {
    for (float& x : *buf) x = float(rng.Normal());
  }
  std::vector<int32_t> order(n_ctx);
  std::iota(order.begin(), order.end(), 0);
  for (int i = n_ctx - 1; i > 0; i--) std::swap(order[i], order[rng.Next() % (i + 1)]);
  for (int start = 0; start < n_ctx;) {
    const int cnt = std::min(n_ctx - start, 1 + int(rng.Next() % 40));
    std::vector<float> kk, vv;
    for (int i = 0; i < cnt; i++) {
      const int p = order[start + i];
      kk.insert(kk.end(), s.k.begin() + size_t(p) * row, s.k.begin() + size_t(p + 1) * row);
      vv.insert(vv.end(), s.v.begin() + size_t(p) * row, s.v.begin() + size_t(p + 1) * row);
    }
    KvWrite(kv, s.table.data(), order.data() + start, cnt, kk.data(), vv.data());
    start += cnt;
  }
  for (auto* buf : {&s.k, &s.v}) {
    for (float& x : *buf) x = RoundTrip(kv.dtype, x);
  }
  // Query positions: distinct, shuffled, not contiguous; some beyond n_ctx - 1.
  std::vector<int32_t> cand(n_ctx + 3);
  std::iota(cand.begin(), cand.end(), 0);
  for (int i = int(cand.size()) - 1; i > 0; i--) std::swap(cand[i], cand[rng.Next() % (i + 1)]);
  s.q_pos.assign(cand.begin(), cand.begin() + std::min<size_t>(n_q, cand.size()));
  s.q.resize(s.q_pos.size() * size_t(n_heads) * kv.head_dim);
  for (float& x : s.q) x = float(rng.Normal());
  return s;
}

// First key visible to a query at p: positions in (p - window, p] (llama.cpp masks a key at
// p0 when p - p0 >= window).
int FirstKey(int p, int window) { return window > 0 ? std::max(0, p - window + 1) : 0; }

// out[r] for query r of s, in double. With BF16 K/V the scores use q * scale rounded to bf16
// (the kernels' contract, attention_internal.h), then exact products with the stored keys.
std::vector<double> RefAttention(const Seq& s, int n_heads, int n_kv, int hd, float scale, DType kv_dtype,
                                 const AttnOptions& opt) {
  const int group = n_heads / n_kv;
  std::vector<double> out(s.q.size());
  for (size_t r = 0; r < s.q_pos.size(); r++) {
    const int last = std::min(s.q_pos[r], s.n_ctx - 1);
    const int first = FirstKey(s.q_pos[r], opt.window);
    for (int h = 0; h < n_heads; h++) {
      const int g = h / group;
      const float* q = s.q.data() + (r * n_heads + h) * hd;
      std::vector<double> sc(last + 1);
      double mx = -INFINITY;
      for (int j = first; j <= last; j++) {
        const float* k = s.k.data() + (size_t(j) * n_kv + g) * hd;
        double dot = 0;
        if (kv_dtype == DType::BF16) {
          for (int d = 0; d < hd; d++) dot += double(Bf16ToF32(F32ToBf16(q[d] * scale))) * k[d];
          sc[j] = dot;
        } else {
          for (int d = 0; d < hd; d++) dot += double(q[d]) * k[d];
          sc[j] = dot * scale;
        }
        if (opt.softcap > 0) sc[j] = opt.softcap * std::tanh(sc[j] / opt.softcap);
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (int j = first; j <= last; j++) sum += (sc[j] = std::exp(sc[j] - mx));
      for (int d = 0; d < hd; d++) {
        double acc = 0;
        for (int j = first; j <= last; j++) acc += sc[j] * s.v[(size_t(j) * n_kv + g) * hd + d];
        out[(r * n_heads + h) * hd + d] = acc / sum;
      }
    }
  }
  return out;
}

// Runs PagedAttention over seqs in one batched call; returns out per sequence.
std::vector<std::vector<float>> RunBatch(const Pool& pool, const std::vector<Seq*>& seqs,
                                         int n_heads, float scale, const AttnOptions& opt = {}) {
  const int hd = pool.kv.head_dim;
  std::vector<float> q;
  std::vector<int32_t> pos;
  std::vector<AttnSeq> as;
  for (Seq* s : seqs) {
    as.push_back(AttnSeq{s->table.data(), s->n_ctx, int(pos.size()), int(s->q_pos.size())});
    q.insert(q.end(), s->q.begin(), s->q.end());
    pos.insert(pos.end(), s->q_pos.begin(), s->q_pos.end());
  }
  std::vector<float> out(q.size(), NAN);
  PagedAttention(q.data(), pos.data(), as.data(), int(as.size()), pool.kv, n_heads, scale, out.data(), opt);
  std::vector<std::vector<float>> res;
  for (size_t i = 0; i < seqs.size(); i++) {
    auto b = out.begin() + size_t(as[i].q_begin) * n_heads * hd;
    res.emplace_back(b, b + size_t(as[i].n_q) * n_heads * hd);
  }
  return res;
}

struct Config {
  DType dtype;
  int n_kv, group, hd;
};

// Points the table entries of blocks that hold no key visible to any query of s (outside every
// window) at a block of NaN: the kernels must skip such blocks without reading them.
void PoisonHiddenBlocks(Pool& pool, Seq& s, int32_t nan_block, int window) {
  for (size_t b = 0; b < s.table.size(); b++) {
    const int k0 = int(b) * kBlockTokens;
    bool seen = false;
    for (int p : s.q_pos) {
      const int last = std::min(p, s.n_ctx - 1);
      seen = seen || (FirstKey(p, window) < k0 + kBlockTokens && last >= k0);
    }
    if (!seen) s.table[b] = nan_block;
  }
  const size_t n = size_t(2) * pool.kv.n_kv_heads * kBlockTokens * pool.kv.head_dim;
  std::vector<float> nan(n, NAN);
  FromF32(pool.kv.dtype, nan.data(), pool.mem.data() + DTypeBytes(pool.kv.dtype, size_t(nan_block) * n), n);
}

void CheckConfig(const Config& c, const std::vector<std::pair<int, int>>& ctx_q, uint64_t seed,
                 const AttnOptions& opt = {}) {
  SCOPED_TRACE(testing::Message() << DTypeName(c.dtype) << " n_kv=" << c.n_kv << " group=" << c.group
                                  << " hd=" << c.hd << " window=" << opt.window << " softcap=" << opt.softcap);
  Rng rng(seed);
  const int n_heads = c.n_kv * c.group;
  int total_blocks = 0;
  for (auto [n_ctx, n_q] : ctx_q) total_blocks += (n_ctx + kBlockTokens - 1) / kBlockTokens;
  Pool pool(c.dtype, total_blocks + 7, c.n_kv, c.hd, rng);
  std::vector<int32_t> free_blocks(total_blocks + 7);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::vector<Seq> seqs;
  for (auto [n_ctx, n_q] : ctx_q) seqs.push_back(MakeSeq(pool, free_blocks, n_ctx, n_q, n_heads, rng));
  if (opt.window > 0) {
    for (Seq& s : seqs) PoisonHiddenBlocks(pool, s, free_blocks.back(), opt.window);
  }
  const float scale = 1.0f / std::sqrt(float(c.hd));
  std::vector<Seq*> ptrs;
  for (Seq& s : seqs) ptrs.push_back(&s);
  auto batch = RunBatch(pool, ptrs, n_heads, scale, opt);
  for (size_t i = 0; i < seqs.size(); i++) {
    SCOPED_TRACE(testing::Message() << "seq " << i << " n_ctx=" << seqs[i].n_ctx);
    std::vector<double> ref = RefAttention(seqs[i], n_heads, c.n_kv, c.hd, scale, c.dtype, opt);
    double worst = 0;
    for (size_t k = 0; k < ref.size(); k++) {
      worst = std::max(worst, std::isfinite(batch[i][k]) ? std::fabs(batch[i][k] - ref[k]) : INFINITY);
    }
    EXPECT_LT(worst, 2e-5);
    // A sequence alone gives bit-identical results to the same sequence in the batch.
    auto alone = RunBatch(pool, {&seqs[i]}, n_heads, scale, opt);
    EXPECT_EQ(alone[0], batch[i]);
  }
}

TEST(CpuKvWrite, StoresRoundedValuesAtTheirSlots) {
  Rng rng(1);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const int n_kv = 2, hd = 24, n_ctx = 70;
    Pool pool(t, 5, n_kv, hd, rng);
    std::vector<int32_t> free_blocks = {4, 0, 2, 3, 1};
    Seq s = MakeSeq(pool, free_blocks, n_ctx, 1, n_kv, rng);
    for (int p = 0; p < n_ctx; p++) {
      for (int g = 0; g < n_kv; g++) {
        for (int which = 0; which < 2; which++) {
          const size_t idx = ((size_t(s.table[p / kBlockTokens]) * 2 + which) * n_kv + g) * kBlockTokens +
                             p % kBlockTokens;
          std::vector<float> got(hd);
          ToF32(t, pool.mem.data() + DTypeBytes(t, idx * hd), got.data(), hd);
          const std::vector<float>& src = which == 0 ? s.k : s.v;
          for (int d = 0; d < hd; d++) ASSERT_EQ(got[d], src[(size_t(p) * n_kv + g) * hd + d]);
        }
      }
    }
  }
}

// Decode: one query per sequence, many sequences, contexts not multiples of 32.
TEST(CpuPagedAttention, DecodeBatch) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int group : {1, 2, 4}) {
      CheckConfig({t, 2, group, 64}, {{1, 1}, {31, 1}, {33, 1}, {100, 1}, {64, 1}, {257, 1}}, 10 + group);
    }
  }
}

// Prefill and mixed batches: many queries at shuffled positions, several sequences per call.
TEST(CpuPagedAttention, PrefillAndMixed) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int group : {1, 2, 4}) {
      CheckConfig({t, 2, group, 64}, {{150, 150}, {45, 7}, {300, 1}, {70, 33}}, 20 + group);
    }
  }
}

// Head sizes outside the AVX-512 kernel's (portable path), and other supported ones.
TEST(CpuPagedAttention, OtherHeadDims) {
  CheckConfig({DType::F32, 2, 2, 8}, {{40, 40}, {9, 1}}, 30);
  CheckConfig({DType::BF16, 1, 3, 24}, {{70, 20}, {33, 1}}, 31);
  CheckConfig({DType::F16, 2, 4, 16}, {{50, 50}, {5, 1}}, 32);
  CheckConfig({DType::F32, 1, 4, 128}, {{90, 90}, {200, 1}}, 33);
}

// Sliding windows: shorter than, equal to and longer than a block, 1 (self only), and longer than
// every context (same as none). Blocks outside every window are NaN and must not be read.
TEST(CpuPagedAttention, SlidingWindow) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int window : {1, 5, 32, 33, 100, 1000}) {
      for (int group : {1, 4}) {
        CheckConfig({t, 2, group, 64}, {{1, 1}, {257, 1}, {100, 1}, {64, 1}}, 50 + window + group, {window, 0});
        CheckConfig({t, 2, group, 64}, {{150, 150}, {45, 7}, {300, 1}, {200, 33}, {130, 3}}, 60 + window + group,
                    {window, 0});
      }
    }
  }
  CheckConfig({DType::F32, 2, 2, 8}, {{90, 90}, {70, 1}}, 70, {17, 0});     // portable kernel only
  CheckConfig({DType::BF16, 1, 3, 24}, {{170, 20}, {65, 1}}, 71, {40, 0});  // portable kernel only
  CheckConfig({DType::F32, 1, 2, 256}, {{150, 40}, {100, 1}}, 72, {32, 0});  // wide kernel for decode
}

// Attention-logit soft-caps small enough to change most scores (scores here are ~N(0, 1)), alone
// and with a window.
TEST(CpuPagedAttention, SoftCap) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (float cap : {0.5f, 2.0f, 50.0f}) {
      for (int window : {0, 20}) {
        CheckConfig({t, 2, 2, 64}, {{150, 150}, {45, 7}, {300, 1}, {70, 1}}, 80 + int(cap) + window, {window, cap});
      }
    }
  }
  CheckConfig({DType::F32, 2, 2, 8}, {{40, 40}, {9, 1}}, 90, {0, 1.5f});
  CheckConfig({DType::F16, 1, 2, 128}, {{70, 30}, {90, 1}}, 91, {10, 1.5f});
}

// A window changes the result (the test above is not vacuous) and a soft-cap changes it too.
TEST(CpuPagedAttention, WindowAndCapChangeResults) {
  Rng rng(95);
  const int n_kv = 1, hd = 64, n_heads = 2;
  Pool pool(DType::F32, 10, n_kv, hd, rng);
  std::vector<int32_t> free_blocks(10);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  Seq a = MakeSeq(pool, free_blocks, 200, 1, n_heads, rng);
  a.q_pos = {150};
  auto plain = RunBatch(pool, {&a}, n_heads, 0.125f);
  EXPECT_NE(plain, RunBatch(pool, {&a}, n_heads, 0.125f, {40, 0}));
  EXPECT_NE(plain, RunBatch(pool, {&a}, n_heads, 0.125f, {0, 1.0f}));
  EXPECT_EQ(plain, RunBatch(pool, {&a}, n_heads, 0.125f, {151, 0}));  // the window holds every key
}

TEST(CpuPagedAttention, SameResultWithOneThread) {
  Rng rng(40);
  const int n_kv = 2, group = 2, hd = 64, n_heads = n_kv * group;
  Pool pool(DType::BF16, 20, n_kv, hd, rng);
  std::vector<int32_t> free_blocks(20);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  Seq a = MakeSeq(pool, free_blocks, 200, 100, n_heads, rng);
  Seq b = MakeSeq(pool, free_blocks, 90, 1, n_heads, rng);
  auto r1 = RunBatch(pool, {&a, &b}, n_heads, 0.125f);
  const int saved = NumThreads();
  SetNumThreads(1);
  auto r2 = RunBatch(pool, {&a, &b}, n_heads, 0.125f);
  SetNumThreads(saved);
  EXPECT_EQ(r1, r2);
}

}  // namespace
}  // namespace mnemo::kernels
