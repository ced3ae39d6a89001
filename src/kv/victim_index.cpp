#include "kv/victim_index.h"

#include <algorithm>
#include <utility>

#include "base/status.h"

namespace mnemo {
namespace {

// The time order of fronts: (last_active, weight); weights are unique within a tier.
bool TimeLess(double a_time, double a_weight, double b_time, double b_weight) {
  return a_time < b_time || (a_time == b_time && a_weight < b_weight);
}

template <typename Front>
typename std::vector<Front>::iterator FindWeight(std::vector<Front>& v, double weight) {
  return std::lower_bound(v.begin(), v.end(), weight, [](const Front& f, double w) { return f.weight < w; });
}

template <typename Front>
typename std::vector<Front>::iterator FindTime(std::vector<Front>& v, double time, double weight) {
  return std::lower_bound(v.begin(), v.end(), std::make_pair(time, weight), [](const Front& f, const auto& k) {
    return TimeLess(f.last_active, f.weight, k.first, k.second);
  });
}

}  // namespace

void VictimIndex::SiftUp(Class& c, size_t i) {
  const Slot s = c.heap[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 4;
    if (!(s < c.heap[parent])) break;
    Place(c, i, c.heap[parent]);
    i = parent;
  }
  Place(c, i, s);
}

void VictimIndex::SiftDown(Class& c, size_t i) {
  const Slot s = c.heap[i];
  const size_t n = c.heap.size();
  while (true) {
    const size_t first = 4 * i + 1;
    if (first >= n) break;
    size_t child = first;
    for (size_t k = first + 1; k < std::min(first + 4, n); k++) {
      if (c.heap[k] < c.heap[child]) child = k;
    }
    if (!(c.heap[child] < s)) break;
    Place(c, i, c.heap[child]);
    i = child;
  }
  Place(c, i, s);
}

int32_t VictimIndex::ClassFor(TierIndex& x, int tier, double weight, double last_active) {
  auto w = FindWeight(x.by_weight, weight);
  if (w != x.by_weight.end() && w->weight == weight) return w->cls;
  int32_t id;
  if (!free_classes_.empty()) {
    id = free_classes_.back();
    free_classes_.pop_back();
  } else {
    id = static_cast<int32_t>(classes_.size());
    classes_.emplace_back();
  }
  Class& c = classes_[id];
  c.tier = tier;
  c.weight = weight;
  x.by_weight.insert(w, Front{weight, last_active, id});
  x.by_time.insert(FindTime(x.by_time, last_active, weight), Front{weight, last_active, id});
  return id;
}

void VictimIndex::MoveFront(TierIndex& x, const Class& c, double old_time) {
  const double t = c.heap[0].last_active;
  auto w = FindWeight(x.by_weight, c.weight);
  MNEMO_CHECK(w != x.by_weight.end() && w->weight == c.weight);
  w->last_active = t;
  auto p = FindTime(x.by_time, old_time, c.weight);
  MNEMO_CHECK(p != x.by_time.end() && p->weight == c.weight && p->last_active == old_time);
  Front f = *p;
  f.last_active = t;
  // The fronts it passes shift by one place (a new front is usually near its old place).
  if (t > old_time) {
    auto q = std::lower_bound(p + 1, x.by_time.end(), f, [](const Front& a, const Front& b) {
      return TimeLess(a.last_active, a.weight, b.last_active, b.weight);
    });
    std::move(p + 1, q, p);
    *(q - 1) = f;
  } else {
    auto q = FindTime(x.by_time, t, f.weight);  // in [begin, p]
    std::move_backward(q, p, p + 1);
    *q = f;
  }
}

void VictimIndex::DropClass(TierIndex& x, int32_t cls, double old_time) {
  Class& c = classes_[cls];
  auto w = FindWeight(x.by_weight, c.weight);
  MNEMO_CHECK(w != x.by_weight.end() && w->cls == cls);
  x.by_weight.erase(w);
  auto t = FindTime(x.by_time, old_time, c.weight);
  MNEMO_CHECK(t != x.by_time.end() && t->cls == cls);
  x.by_time.erase(t);
  c.tier = -1;
  free_classes_.push_back(cls);
}

void VictimIndex::File(int32_t rec, int tier, double weight, double last_active) {
  MNEMO_CHECK(rec >= 0 && tier >= 0 && tier < kTiers);
  if (rec >= static_cast<int32_t>(entries_.size())) entries_.resize(rec + 1);
  MNEMO_CHECK(entries_[rec].cls < 0);
  TierIndex& x = tiers_[tier];
  const int32_t id = ClassFor(x, tier, weight, last_active);  // may grow classes_: references after it
  Class& c = classes_[id];
  entries_[rec].last_active = last_active;
  entries_[rec].cls = id;
  const double old_front = c.heap.empty() ? last_active : c.heap[0].last_active;  // a new class is filed at last_active
  c.heap.push_back({last_active, rec});
  SiftUp(c, c.heap.size() - 1);
  x.size++;
  if (c.heap[0].last_active != old_front) MoveFront(x, c, old_front);  // equal times: either record stands
}

void VictimIndex::Unfile(int32_t rec) {
  if (!Filed(rec)) return;
  Entry& e = entries_[rec];
  const int32_t id = e.cls;
  Class& c = classes_[id];
  TierIndex& x = tiers_[c.tier];
  const double front = c.heap[0].last_active;
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
  e.cls = -1;
  e.pos = -1;
  if (c.heap.empty()) {
    DropClass(x, id, front);
  } else if (c.heap[0].last_active != front) {
    MoveFront(x, c, front);
  }
}

bool VictimIndex::FiledAs(int32_t rec, int tier, double weight, double last_active) const {
  if (!Filed(rec)) return false;
  const Entry& e = entries_[rec];
  const Class& c = classes_[e.cls];
  return c.tier == tier && c.weight == weight && e.last_active == last_active;
}

namespace {

// Pick's walk for a Value function value(weight, idle, last_active); returns the class whose
// front has the smallest key, or -1 when there are no classes.
template <typename Front, typename ValueFn>
int32_t WalkFronts(const std::vector<Front>& by_weight, const std::vector<Front>& by_time, double now,
                   ValueFn value, uint64_t* visits) {
  const size_t n = by_weight.size();  // == by_time.size()
  // Keys are (Value, weight), compared lexicographically; the best seen so far and its class.
  std::pair<double, double> best;
  int32_t best_class = -1;
  auto consider = [&](const Front& f) {
    const std::pair<double, double> key{value(f.weight, now - f.last_active, f.last_active), f.weight};
    if (best_class < 0 || key < best) {
      best = key;
      best_class = f.cls;
    }
  };
  // a walks by weight, b by time; when either ends, it has visited every class.
  for (size_t a = 0, b = 0; a < n && b < n; a++, b++) {
    const Front& fa = by_weight[a];
    const Front& fb = by_time[b];
    if (best_class >= 0) {
      const std::pair<double, double> bound{value(fa.weight, now - fb.last_active, fb.last_active), fa.weight};
      if (!(bound < best)) break;
    }
    consider(fa);
    consider(fb);
    *visits += 2;
  }
  return best_class;
}

}  // namespace

int32_t VictimIndex::Pick(int tier, double now, const EvictionPolicy& policy) const {
  const TierIndex& x = tiers_[tier];
  if (x.by_weight.empty()) return -1;
  picks_++;
  int32_t cls;
  // The policies we ship with Value inline (a third of an admission's instructions went to the
  // virtual calls, three per step of the walk); any other through the vtable.
  switch (policy.kind()) {
    case EvictionPolicy::Kind::kPensieve:
      cls = WalkFronts(x.by_weight, x.by_time, now,
                       [](double w, double idle, double) { return PensievePolicy::ValueOf(w, idle); }, &visits_);
      break;
    case EvictionPolicy::Kind::kLru:
      cls = WalkFronts(x.by_weight, x.by_time, now, [](double, double, double t) { return LruPolicy::ValueOf(t); },
                       &visits_);
      break;
    default:
      cls = WalkFronts(x.by_weight, x.by_time, now,
                       [&](double w, double idle, double t) { return policy.Value(w, idle, t); }, &visits_);
  }
  return classes_[cls].heap[0].rec;
}

bool VictimIndex::Check() const {
  size_t filed[kTiers] = {0, 0, 0};
  for (size_t id = 0; id < entries_.size(); id++) {
    const Entry& e = entries_[id];
    if (e.cls < 0) continue;
    if (static_cast<size_t>(e.cls) >= classes_.size()) return false;
    const Class& c = classes_[e.cls];
    if (c.tier < 0 || e.pos < 0 || static_cast<size_t>(e.pos) >= c.heap.size()) return false;
    const Slot& s = c.heap[e.pos];
    if (s.rec != static_cast<int32_t>(id) || s.last_active != e.last_active) return false;
    filed[c.tier]++;
  }
  size_t used[kTiers] = {0, 0, 0}, unused = 0;
  for (const Class& c : classes_) {
    if (c.tier < 0) {
      if (!c.heap.empty()) return false;
      unused++;
      continue;
    }
    if (c.tier >= kTiers) return false;
    used[c.tier]++;
    for (size_t i = 1; i < c.heap.size(); i++) {  // heap order
      if (c.heap[i] < c.heap[(i - 1) / 4]) return false;
    }
  }
  if (unused != free_classes_.size()) return false;
  for (int32_t id : free_classes_) {
    if (classes_[id].tier >= 0) return false;
  }
  for (int t = 0; t < kTiers; t++) {
    const TierIndex& x = tiers_[t];
    if (x.by_weight.size() != used[t] || x.by_time.size() != used[t]) return false;
    size_t n = 0;
    for (size_t i = 0; i < x.by_weight.size(); i++) {
      const Front& f = x.by_weight[i];
      if (i > 0 && !(x.by_weight[i - 1].weight < f.weight)) return false;
      const Class& c = classes_[f.cls];
      if (c.tier != t || c.weight != f.weight || c.heap.empty() || c.heap[0].last_active != f.last_active) return false;
      n += c.heap.size();
    }
    for (size_t i = 0; i < x.by_time.size(); i++) {
      const Front& f = x.by_time[i];
      if (i > 0 && !TimeLess(x.by_time[i - 1].last_active, x.by_time[i - 1].weight, f.last_active, f.weight)) {
        return false;
      }
      const Class& c = classes_[f.cls];
      if (c.tier != t || c.weight != f.weight || c.heap.empty() || c.heap[0].last_active != f.last_active) return false;
    }
    if (n != x.size || n != filed[t]) return false;
  }
  return true;
}

}  // namespace mnemo
