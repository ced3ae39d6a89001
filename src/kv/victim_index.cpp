#include "kv/victim_index.h"

#include "base/status.h"

namespace mnemo {

void VictimIndex::File(int32_t rec, int tier, double weight, double last_active) {
  MNEMO_CHECK(rec >= 0 && tier >= 0 && tier < kTiers);
  if (rec >= static_cast<int32_t>(entries_.size())) entries_.resize(rec + 1);
  Entry& e = entries_[rec];
  MNEMO_CHECK(e.tier < 0);
  e = Entry{static_cast<int8_t>(tier), weight, last_active};
  TierIndex& x = tiers_[tier];
  ByTime& c = x.classes[weight];
  if (!c.empty()) {
    if (c.begin()->first <= last_active) {  // the front stays (equal times: the lower id is in front, same time)
      c.insert({last_active, rec});
      x.size++;
      return;
    }
    x.fronts.erase({c.begin()->first, weight, &c});
  }
  c.insert({last_active, rec});
  x.fronts.insert({last_active, weight, &c});
  x.size++;
}

void VictimIndex::Unfile(int32_t rec) {
  if (!Filed(rec)) return;
  Entry& e = entries_[rec];
  TierIndex& x = tiers_[e.tier];
  auto ci = x.classes.find(e.weight);
  MNEMO_CHECK(ci != x.classes.end());
  ByTime& c = ci->second;
  const double front = c.begin()->first;
  MNEMO_CHECK(c.erase({e.last_active, rec}) == 1);
  if (c.empty()) {
    x.fronts.erase({front, e.weight, &c});
    x.classes.erase(ci);
  } else if (c.begin()->first != front) {
    x.fronts.erase({front, e.weight, &c});
    x.fronts.insert({c.begin()->first, e.weight, &c});
  }
  x.size--;
  e.tier = -1;
}

bool VictimIndex::FiledAs(int32_t rec, int tier, double weight, double last_active) const {
  if (!Filed(rec)) return false;
  const Entry& e = entries_[rec];
  return e.tier == tier && e.weight == weight && e.last_active == last_active;
}

int32_t VictimIndex::Pick(int tier, double now, const EvictionPolicy& policy) const {
  const TierIndex& x = tiers_[tier];
  if (x.classes.empty()) return -1;
  picks_++;
  // Keys are (Value, weight), compared lexicographically; the best seen so far and its class.
  std::pair<double, double> best;
  const ByTime* best_class = nullptr;
  auto consider = [&](double weight, double last_active, const ByTime* c) {
    const std::pair<double, double> key{policy.Value(weight, now - last_active, last_active), weight};
    if (!best_class || key < best) {
      best = key;
      best_class = c;
    }
  };
  auto a = x.classes.begin();  // by weight
  auto b = x.fronts.begin();   // by front time
  // When either walk ends, it has visited every class.
  while (a != x.classes.end() && b != x.fronts.end()) {
    const auto& [b_time, b_weight, b_class] = *b;
    if (best_class) {
      const std::pair<double, double> bound{policy.Value(a->first, now - b_time, b_time), a->first};
      if (!(bound < best)) break;
    }
    consider(a->first, a->second.begin()->first, &a->second);
    ++a;
    consider(b_weight, b_time, b_class);
    ++b;
    visits_ += 2;
  }
  return best_class->begin()->second;
}

bool VictimIndex::Check() const {
  size_t filed[kTiers] = {0, 0, 0};
  for (size_t id = 0; id < entries_.size(); id++) {
    const Entry& e = entries_[id];
    if (e.tier < 0) continue;
    filed[e.tier]++;
    auto c = tiers_[e.tier].classes.find(e.weight);
    if (c == tiers_[e.tier].classes.end() || !c->second.count({e.last_active, static_cast<int32_t>(id)})) {
      return false;
    }
  }
  for (int t = 0; t < kTiers; t++) {
    const TierIndex& x = tiers_[t];
    size_t n = 0;
    if (x.fronts.size() != x.classes.size()) return false;
    for (const auto& [w, c] : x.classes) {
      if (c.empty() || !x.fronts.count({c.begin()->first, w, &c})) return false;
      n += c.size();
    }
    if (n != x.size || n != filed[t]) return false;
  }
  return true;
}

}  // namespace mnemo
