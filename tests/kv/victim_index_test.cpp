// The victim index against brute force: the record it picks has the smallest policy key of all,
// for Pensieve and LRU, on its own and inside the cache manager under random operations.
#include "kv/victim_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/block.h"
#include "base/rng.h"
#include "cache_test_util.h"
#include "kv/cache_manager.h"
#include "random_ops.h"

namespace mnemo {
namespace {

using kvtest::Policy;

// Random files and unfiles over few weights and few distinct times (ties in both), each pick
// checked against the minimum key over a plain copy of what is filed.
TEST(VictimIndex, PickHasTheSmallestKeyOfAllFiledRecords) {
  for (const char* name : {"pensieve", "lru"}) {
    auto policy = Policy(name);
    for (uint64_t seed = 1; seed <= 20; seed++) {
      Rng rng(seed);
      VictimIndex x;
      struct Filed {
        int tier;
        int chunk;
        double t;
      };
      std::map<int32_t, Filed> model;  // rec -> how it is filed
      const int n_chunks = 1 + int(rng.Next() % 40);
      for (int step = 0; step < 2000; step++) {
        const int32_t rec = int32_t(rng.Next() % 300);
        if (model.count(rec)) {
          x.Unfile(rec);
          model.erase(rec);
        } else {
          Filed f{int(rng.Next() % 3), int(rng.Next() % n_chunks), double(rng.Next() % 50)};
          x.File(rec, f.tier, policy->Weight(f.chunk, f.chunk * kBlockTokens), f.t);
          model[rec] = f;
        }
        const double now = 50 + double(rng.Next() % 100) * 0.5;
        for (int tier = 0; tier < 3; tier++) {
          std::optional<std::pair<double, double>> best;
          for (const auto& [r, f] : model) {
            if (f.tier != tier) continue;
            auto key = policy->Key({f.chunk, f.chunk * kBlockTokens, kBlockTokens, now - f.t, f.t});
            if (!best || key < *best) best = key;
          }
          const int32_t pick = x.Pick(tier, now, *policy);
          ASSERT_EQ(pick >= 0, best.has_value()) << name << " seed " << seed << " step " << step;
          if (pick < 0) continue;
          ASSERT_TRUE(model.count(pick));
          const Filed& f = model[pick];
          ASSERT_EQ(f.tier, tier);
          EXPECT_EQ(policy->Key({f.chunk, f.chunk * kBlockTokens, kBlockTokens, now - f.t, f.t}), *best)
              << name << " seed " << seed << " step " << step;
        }
        ASSERT_TRUE(x.Check());
      }
    }
  }
}

// Large classes (heaps several levels deep, records taken out of the middle) and fronts that move
// far in time order (files older than a class's front, fronts removed), classes that empty and
// come back: every pick is the brute-force minimum and the index stays consistent.
TEST(VictimIndex, DeepHeapsAndFarMovingFrontsKeepPickExact) {
  for (const char* name : {"pensieve", "lru"}) {
    auto policy = Policy(name);
    for (uint64_t seed = 1; seed <= 4; seed++) {
      Rng rng(seed * 104729);
      VictimIndex x;
      struct Filed {
        int tier;
        int chunk;
        double t;
      };
      std::vector<std::optional<Filed>> model(3000);
      std::vector<int32_t> filed;  // recs filed, in no order
      for (int step = 0; step < 12000; step++) {
        // Mostly files while it grows, then as many unfiles as files; picks' victims are unfiled
        // (as eviction does), so fronts keep moving.
        const bool grow = filed.size() < 2000 && rng.Next() % 3 != 0;
        if (grow) {
          int32_t rec;
          do {
            rec = int32_t(rng.Next() % model.size());
          } while (model[rec]);
          // Two tiers, a handful of chunk positions (some emptied and refilled), times from a
          // wide range so that a new record is often older than its class's front.
          Filed f{int(rng.Next() % 2), int(rng.Next() % 6), double(rng.Next() % 1000) * 0.25};
          x.File(rec, f.tier, policy->Weight(f.chunk, f.chunk * kBlockTokens), f.t);
          model[rec] = f;
          filed.push_back(rec);
        } else if (!filed.empty()) {
          const size_t k = rng.Next() % filed.size();
          x.Unfile(filed[k]);
          model[filed[k]].reset();
          filed[k] = filed.back();
          filed.pop_back();
        }
        if (step % 7 != 0) continue;
        const double now = 250 + double(rng.Next() % 100);
        for (int tier = 0; tier < 3; tier++) {
          std::optional<std::pair<double, double>> best;
          for (int32_t rec : filed) {
            const Filed& f = *model[rec];
            if (f.tier != tier) continue;
            auto key = policy->Key({f.chunk, f.chunk * kBlockTokens, kBlockTokens, now - f.t, f.t});
            if (!best || key < *best) best = key;
          }
          const int32_t pick = x.Pick(tier, now, *policy);
          ASSERT_EQ(pick >= 0, best.has_value()) << name << " seed " << seed << " step " << step;
          if (pick < 0) continue;
          ASSERT_TRUE(model[pick] && model[pick]->tier == tier);
          const Filed& f = *model[pick];
          ASSERT_EQ(policy->Key({f.chunk, f.chunk * kBlockTokens, kBlockTokens, now - f.t, f.t}), *best)
              << name << " seed " << seed << " step " << step;
          if (rng.Next() % 2) {  // evict it
            x.Unfile(pick);
            model[pick].reset();
            filed.erase(std::find(filed.begin(), filed.end(), pick));
          }
        }
        if (step % 500 == 0) {
          ASSERT_TRUE(x.Check()) << name << " seed " << seed << " step " << step;
        }
      }
      ASSERT_TRUE(x.Check());
      EXPECT_EQ(x.size(0) + x.size(1) + x.size(2), filed.size());
    }
  }
}

// After each step of the shared random-operation driver: the next victim of every tier, now and
// later, is the minimum key over a scan of all records.
class VictimsEqualScan : public kvtest::RandomOpsHooks {
 public:
  void AfterStep(CacheManager& cm, double now) override {
    for (Tier t : {Tier::kT0, Tier::kT1, Tier::kT2}) {
      for (double later : {0.0, 0.5, 3.0, 1000.0}) {
        const auto index = cm.NextVictimKey(t, now + later), scan = cm.ScanVictimKey(t, now + later);
        ASSERT_EQ(index.has_value(), scan.has_value()) << "now " << now << " tier " << TierName(t);
        if (!index) continue;
        ASSERT_EQ(*index, *scan) << "now " << now << " tier " << TierName(t);
        compared++;
      }
    }
  }
  int64_t compared = 0;
};

// After every operation (turns that touch and grow, forks, truncations, invalidations, removals,
// upkeep that evicts and spills, copies landing or failing), the next victim of every tier has
// the minimum key over all records, now and later.
TEST(VictimIndex, CacheManagerVictimsEqualBruteForce) {
  int64_t compared = 0;
  for (uint64_t seed = 1; seed <= 40; seed++) {
    Rng rng(seed * 7919);
    CacheConfig cfg{int32_t(8 + rng.Next() % 24), int32_t(rng.Next() % 24), int32_t(rng.Next() % 24), 0.1};
    CacheManager cm(cfg, Policy(seed % 2 ? "pensieve" : "lru"));
    VictimsEqualScan hooks;
    kvtest::RandomOpsConfig rc;
    rc.sessions = 5;
    rc.max_new_tokens = 90;
    rc.grow_one_in = 3;
    rc.fractional_time = true;  // equal times too
    kvtest::RunRandomOps(cm, rc, hooks, rng, "seed " + std::to_string(seed));
    ASSERT_FALSE(HasFailure()) << "seed " << seed;
    compared += hooks.compared;
  }
  EXPECT_GT(compared, 20000);
}

// A shared (forked) chunk is priced by the idle time of its most recently active sharer: the
// latest activity of any session while it held the chunk.
TEST(VictimIndex, ASharedChunkIsPricedByItsMostRecentlyActiveSharer) {
  CostModel cost{1000.0, 10.0};
  CacheManager cm({16, 0, 0, 0.0}, std::make_unique<PensievePolicy>(cost));
  CacheManager::Acquired a;
  cm.AddSession(1, 0);
  ASSERT_EQ(cm.Acquire(1, 2 * kBlockTokens, 0, &a), Admission::kOk);
  cm.Release(1, 2 * kBlockTokens, 0);  // session 1: two full chunks, idle since 0
  cm.AddSession(3, 1);
  ASSERT_EQ(cm.Acquire(3, 2 * kBlockTokens, 1, &a), Admission::kOk);
  cm.Release(3, 2 * kBlockTokens, 1);  // session 3: two full chunks, idle since 1
  const double w0 = cost.Cost(0, kBlockTokens);
  // Unshared, session 1's leading chunk goes first.
  EXPECT_EQ(cm.NextVictimKey(Tier::kT0, 10), std::make_pair(w0 / 10, w0));
  // Session 2 forks all of session 1 at 5: the shared chunks are as idle as session 2, so session
  // 3's leading chunk (idle since 1) goes first, though session 1 has been idle longer.
  ASSERT_FALSE(cm.Fork(1, 2, 2 * kBlockTokens, 5).has_value());
  EXPECT_EQ(cm.NextVictimKey(Tier::kT0, 10), std::make_pair(w0 / 9, w0));
  EXPECT_EQ(cm.ScanVictimKey(Tier::kT0, 10), cm.NextVictimKey(Tier::kT0, 10));
  // A turn of session 1 at 7 makes it the most recent sharer.
  ASSERT_EQ(cm.Acquire(1, 2 * kBlockTokens, 7, &a), Admission::kOk);
  cm.Release(1, 2 * kBlockTokens, 7);
  cm.RemoveSession(3);
  EXPECT_EQ(cm.NextVictimKey(Tier::kT0, 10), std::make_pair(w0 / 3, w0));
  // The sharer that leaves does not make the chunk look older than its activity while shared.
  cm.RemoveSession(1);
  EXPECT_EQ(cm.NextVictimKey(Tier::kT0, 10), std::make_pair(w0 / 3, w0));
  EXPECT_TRUE(cm.CheckInvariants());
}

}  // namespace
}  // namespace mnemo
