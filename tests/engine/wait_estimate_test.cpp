// The admission-wait estimator (model-free): the drain rate is measured over backlog only, the
// forecast follows Little's law, the oldest waiting turn's sojourn bounds it from below.
#include "engine/wait_estimate.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace mnemo {
namespace {

TEST(WaitEstimator, NothingWaitingAndAFreeSlotIsNoWait) {
  WaitEstimator w;
  EXPECT_EQ(w.Estimate(10), 0);
  w.Publish(0, /*free_slots=*/4, -1);
  EXPECT_EQ(w.Estimate(10), 0);
  EXPECT_LT(w.drain_rate(), 0);  // not measured yet
}

TEST(WaitEstimator, DrainRateIsMeasuredOverBacklogOnly) {
  WaitEstimator w;
  // An idle engine admits each turn as it comes (20 a second): that is the arrival rate, and it
  // says nothing of the capacity, so it is not measured.
  for (int i = 0; i < 100; i++) w.Pass(i * 0.05, 1, /*left_waiting=*/false);
  EXPECT_LT(w.drain_rate(), 0);
  // A backlog drained at 10 turns a second (one admission per 0.1 s pass).
  double t = 10;
  for (int i = 0; i < 40; i++) w.Pass(t += 0.1, 1, /*left_waiting=*/true);
  EXPECT_NEAR(w.drain_rate(), 10, 0.5);
  // 19 waiting: the newcomer is the 20th admission, 2 s away.
  w.Publish(19, /*free_slots=*/0, t);
  EXPECT_NEAR(w.Estimate(t), 2.0, 0.1);
  // A long idle gap between a pass that left nothing waiting and the next is not backlog.
  w.Pass(t += 0.1, 1, false);  // the backlog is gone
  w.Pass(t += 100, 1, true);   // 100 s later a burst: the gap is idle time, not backlog
  for (int i = 0; i < 2; i++) w.Pass(t += 0.1, 1, true);
  EXPECT_NEAR(w.drain_rate(), 10, 0.5);
}

TEST(WaitEstimator, FollowsASlowerDrainWithinAFewWindows) {
  WaitEstimator w;
  double t = 0;
  for (int i = 0; i < 40; i++) w.Pass(t += 0.1, 1, true);  // 10/s
  for (int i = 0; i < 20; i++) w.Pass(t += 0.5, 1, true);  // then 2/s for 10 s
  EXPECT_NEAR(w.drain_rate(), 2, 0.1);
}

TEST(WaitEstimator, TheOldestTurnsSojournBoundsTheEstimateFromBelow) {
  WaitEstimator w;
  // Unmeasured rate: the head of the queue has waited 3 s, so a newcomer waits at least that.
  w.Publish(2, /*free_slots=*/0, 7.0);
  EXPECT_NEAR(w.Estimate(10), 3.0, 1e-9);
  // A fast measured drain does not hide a stalled head (a batch blocked on memory).
  double t = 0;
  for (int i = 0; i < 40; i++) w.Pass(t += 0.01, 1, true);  // 100/s
  w.Publish(2, /*free_slots=*/0, 7.0);
  EXPECT_NEAR(w.Estimate(10), 3.0, 1e-9);
}

// A backlog that does not drain closes no window: the turn at the head speaks for it (its sojourn
// grows until the server's bound refuses newcomers), and the admission that ends the stall
// measures how slow the drain was.
TEST(WaitEstimator, ABacklogThatDoesNotDrainWaitsAsLongAsItsHead) {
  WaitEstimator w;
  double t = 0;
  for (int i = 0; i < 100; i++) w.Pass(t += 0.1, 0, true);  // 10 s, nothing admitted
  EXPECT_LT(w.drain_rate(), 0);                              // nothing measured
  w.Publish(3, /*free_slots=*/0, 0.0);
  EXPECT_NEAR(w.Estimate(t), 10.0, 1e-9);
  w.Pass(t += 0.1, 1, true);  // one admission after 10.1 s of backlog
  EXPECT_NEAR(w.drain_rate(), 1 / 10.1, 1e-3);
  // A full batch with nothing waiting waits for one slot.
  WaitEstimator v;
  for (int i = 0; i < 40; i++) v.Pass(t += 0.25, 1, true);  // 4/s
  v.Publish(0, /*free_slots=*/0, -1);
  EXPECT_NEAR(v.Estimate(t), 0.25, 0.01);
}

// Admissions in lumps: each turn holds the memory for longer than a window (two long turns admitted
// together every 0.6 s, 3.3 a second, the engine stepping every 10 ms). Windows cut by the clock
// read 0, 0, 8, 0, 0, 8 ... and the blend dipped to ~1.3 a second: 7 waiting turns then forecast
// 6.2 s for a 2.4 s wait, over a 5 s bound (`bench serve --api chat --users 8` with T0 for one
// context: 4 of 133 requests refused with a TTFT p99 of 1 s). Windows that end on an admission
// read the lumps' rate.
TEST(WaitEstimator, AdmissionsInLumpsAreMeasuredAtTheirRate) {
  WaitEstimator w;
  double t = 0;
  double worst = 0;
  for (int step = 1; step <= 1200; step++) {  // 12 s
    t = step * 0.01;
    w.Pass(t, step % 60 == 0 ? 2 : 0, true);
    w.Publish(7, /*free_slots=*/0, t - 0.01);
    if (t > 2) worst = std::max(worst, w.Estimate(t));
  }
  EXPECT_NEAR(w.drain_rate(), 2 / 0.6, 0.05);
  EXPECT_LT(worst, 1.2 * 8 * 0.3);  // the newcomer is the 8th admission, 2.4 s away
}

// A rate measured in a slow spell refuses newcomers while the spell lasts, and not after it: once no
// backlog has been measured for kStale seconds, a turn waiting for a moment is judged by its
// sojourn alone (before, the near-0 rate of a past spell made every arrival behind one waiting turn
// an endless wait: a soak with 2 clients saw 18 of 28 turns refused on an idle engine).
TEST(WaitEstimator, ARateFromAPastStallGoesStale) {
  WaitEstimator w;
  double t = 0;
  for (int i = 0; i < 100; i++) w.Pass(t += 0.1, i == 99 ? 1 : 0, true);  // one admission in 10 s
  EXPECT_NEAR(w.drain_rate(), 0.1, 0.005);
  w.Publish(1, /*free_slots=*/0, t);
  EXPECT_NEAR(w.Estimate(t), 20, 0.5);  // the newcomer is the 2nd admission at 0.1 a second
  w.Pass(t += 0.1, 1, false);           // it ends; the queue empties
  t += WaitEstimator::kStale + 1;
  w.Publish(1, /*free_slots=*/0, t - 0.05);  // later, one turn waits 50 ms
  EXPECT_NEAR(w.Estimate(t), 0.05, 1e-9);
  // A new backlog measures afresh, not blended with the stale rate.
  w.Pass(t, 0, true);
  for (int i = 0; i < 5; i++) w.Pass(t += 0.1, 1, true);
  EXPECT_NEAR(w.drain_rate(), 10, 0.5);
}

// Turns let in at the door but not yet queued count once the batch's free places are taken: a
// burst checked against one published queue no longer passes whole.
TEST(WaitEstimator, ArrivalsBeyondTheFreePlacesQueue) {
  WaitEstimator w;
  double t = 0;
  for (int i = 0; i < 40; i++) w.Pass(t += 0.1, 1, true);  // 10/s
  w.Publish(0, /*free_slots=*/3, -1);
  EXPECT_EQ(w.Ahead(2), 0);
  EXPECT_EQ(w.Estimate(t, 2), 0);  // a third free place for the newcomer
  EXPECT_EQ(w.Ahead(3), 0);
  EXPECT_NEAR(w.Estimate(t, 3), 0.1, 0.01);  // the places are taken: the next admission
  EXPECT_EQ(w.Ahead(13), 10);
  EXPECT_NEAR(w.Estimate(t, 13), 1.1, 0.05);
  w.Publish(5, /*free_slots=*/0, t);
  EXPECT_EQ(w.Ahead(4), 9);
  EXPECT_NEAR(w.Estimate(t, 4), 1.0, 0.05);
}

}  // namespace
}  // namespace mnemo
