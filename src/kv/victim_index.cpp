#include "kv/victim_index.h"

#include "base/status.h"

namespace mnemo {

void VictimIndex::SiftUp(ByTime& c, size_t i) {
  const Slot s = c.heap[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!(s < c.heap[parent])) break;
    Place(c, i, c.heap[parent]);
    i = parent;
  }
  Place(c, i, s);
}

void VictimIndex::SiftDown(ByTime& c, size_t i) {
  const Slot s = c.heap[i];
  const size_t n = c.heap.size();
  while (true) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && c.heap[child + 1] < c.heap[child]) child++;
    if (!(c.heap[child] < s)) break;
    Place(c, i, c.heap[child]);
    i = child;
  }
  Place(c, i, s);
}

void VictimIndex::File(int32_t rec, int tier, double weight, double last_active) {
  MNEMO_CHECK(rec >= 0 && tier >= 0 && tier < kTiers);
  if (rec >= static_cast<int32_t>(entries_.size())) entries_.resize(rec + 1);
  Entry& e = entries_[rec];
  MNEMO_CHECK(e.tier < 0);
  e = Entry{static_cast<int8_t>(tier), -1, weight, last_active};
  TierIndex& x = tiers_[tier];
  ByTime& c = x.classes[weight];
  const bool had_front = !c.empty();
  const double old_front = had_front ? c.front().last_active : 0;
  c.heap.push_back({last_active, rec});
  SiftUp(c, c.heap.size() - 1);
  x.size++;
  if (had_front && c.front().last_active == old_front) return;  // the front's time stands (equal times: either record)
  if (had_front) x.fronts.erase({old_front, weight, &c});
  x.fronts.insert({c.front().last_active, weight, &c});
}

void VictimIndex::Unfile(int32_t rec) {
  if (!Filed(rec)) return;
  Entry& e = entries_[rec];
  TierIndex& x = tiers_[e.tier];
  auto ci = x.classes.find(e.weight);
  MNEMO_CHECK(ci != x.classes.end());
  ByTime& c = ci->second;
  const double front = c.front().last_active;
  const size_t i = static_cast<size_t>(e.pos);
  MNEMO_CHECK(i < c.heap.size() && c.heap[i].rec == rec);
  const Slot last = c.heap.back();
  c.heap.pop_back();
  if (i < c.heap.size()) {  // the last slot fills the hole, then moves to its place
    Place(c, i, last);
    if (last < Slot{e.last_active, rec}) {
      SiftUp(c, i);
    } else {
      SiftDown(c, i);
    }
  }
  x.size--;
  e.tier = -1;
  e.pos = -1;
  if (c.empty()) {
    x.fronts.erase({front, e.weight, &c});
    x.classes.erase(ci);
  } else if (c.front().last_active != front) {
    x.fronts.erase({front, e.weight, &c});
    x.fronts.insert({c.front().last_active, e.weight, &c});
  }
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
    consider(a->first, a->second.front().last_active, &a->second);
    ++a;
    consider(b_weight, b_time, b_class);
    ++b;
    visits_ += 2;
  }
  return best_class->front().rec;
}

bool VictimIndex::Check() const {
  size_t filed[kTiers] = {0, 0, 0};
  for (size_t id = 0; id < entries_.size(); id++) {
    const Entry& e = entries_[id];
    if (e.tier < 0) continue;
    filed[e.tier]++;
    auto c = tiers_[e.tier].classes.find(e.weight);
    if (c == tiers_[e.tier].classes.end() || e.pos < 0 || static_cast<size_t>(e.pos) >= c->second.size()) return false;
    const Slot& s = c->second.heap[e.pos];
    if (s.rec != static_cast<int32_t>(id) || s.last_active != e.last_active) return false;
  }
  for (int t = 0; t < kTiers; t++) {
    const TierIndex& x = tiers_[t];
    size_t n = 0;
    if (x.fronts.size() != x.classes.size()) return false;
    for (const auto& [w, c] : x.classes) {
      if (c.empty() || !x.fronts.count({c.front().last_active, w, &c})) return false;
      for (size_t i = 1; i < c.size(); i++) {  // heap order
        if (c.heap[i] < c.heap[(i - 1) / 2]) return false;
      }
      n += c.size();
    }
    if (n != x.size || n != filed[t]) return false;
  }
  return true;
}

}  // namespace mnemo
