// Request-id de-duplication records: recorded with the turn or not at all, scoped per owner,
// refused when another attempt committed first (also from another Store, as another replica), and
// expired.
#include <gtest/gtest.h>

#include <thread>

#include "store/store.h"
#include "test_util.h"

namespace mnemo {
namespace {

class StoreRequests : public ::testing::TestWithParam<testing_util::Backend> {
 protected:
  void SetUp() override {
    if (!home_.unavailable().empty()) GTEST_SKIP() << home_.unavailable();
    store_ = Open();
    ASSERT_TRUE(store_);
  }
  std::unique_ptr<Store> Open() {
    auto s = Store::Open(home_.Spec("r.db"));
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  testing_util::StoreHome home_{GetParam()};
  std::unique_ptr<Store> store_;
};

StoredRequest Record(std::string owner, std::string id, std::string body, double ttl_s = 3600) {
  StoredRequest r;
  r.owner = std::move(owner);
  r.request_id = std::move(id);
  r.body_hash = std::string("h1");
  r.status = 200;
  r.body = std::move(body);
  r.expires_at = UnixNow() + ttl_s;
  return r;
}

// A turn creating session `session` (tokens 1, 2, 3) with response `response_id` and record r.
TurnCommit Turn(int64_t session, const std::vector<int32_t>& tokens, const std::string& response_id,
                StoredRequest r) {
  TurnCommit t;
  t.session_id = session;
  t.create_session = true;
  t.owner = r.owner;
  t.begin = 0;
  t.prompt_end = 1;
  t.tokens = tokens;
  t.response = testing_util::MakeResponse(response_id, r.owner);
  t.request = std::move(r);
  return t;
}

TEST_P(StoreRequests, RecordedWithTheTurnAndRefusedTwice) {
  const std::vector<int32_t> toks = {1, 2, 3};
  auto first = store_->CommitTurn(Turn(1, toks, "resp_1", Record("alice", "req-1", R"({"id":"resp_1"})")));
  ASSERT_TRUE(first.ok()) << first.error().message;
  auto got = store_->GetRequest("alice", "req-1");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->body, R"({"id":"resp_1"})");
  EXPECT_EQ((*got)->status, 200);
  EXPECT_EQ((*got)->body_hash, "h1");
  EXPECT_GT((*got)->created_at, 1.6e9);

  // The same request again: refused, and nothing of its turn is applied.
  auto again = store_->CommitTurn(Turn(2, toks, "resp_2", Record("alice", "req-1", "other")));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, StatusCode::kAlreadyExists);
  EXPECT_FALSE(store_->LoadSession(2).ok());
  auto r2 = store_->GetResponse("resp_2", "alice");
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE(r2->has_value());
  EXPECT_EQ((*store_->GetRequest("alice", "req-1"))->body, R"({"id":"resp_1"})");

  // Ids are scoped per owner: bob's req-1 is another request, alice's is not his to read.
  auto bob = store_->GetRequest("bob", "req-1");
  ASSERT_TRUE(bob.ok());
  EXPECT_FALSE(bob->has_value());
  ASSERT_TRUE(store_->CommitTurn(Turn(3, toks, "resp_3", Record("bob", "req-1", "b"))).ok());

  // A turn that fails for its own reason leaves no record.
  TurnCommit bad = Turn(1, toks, "resp_4", Record("alice", "req-2", "x"));  // session 1 exists
  EXPECT_FALSE(store_->CommitTurn(bad).ok());
  EXPECT_FALSE(store_->GetRequest("alice", "req-2")->has_value());
}

TEST_P(StoreRequests, ExpiredRecordsAreAbsentReplacedAndCleaned) {
  const std::vector<int32_t> toks = {1, 2, 3};
  ASSERT_TRUE(store_->CommitTurn(Turn(1, toks, "resp_1", Record("", "old", "a", -1))).ok());
  ASSERT_TRUE(store_->CommitTurn(Turn(2, toks, "resp_2", Record("", "live", "b"))).ok());
  EXPECT_FALSE(store_->GetRequest("", "old")->has_value());  // expired: as absent
  // ... and a new attempt with that id runs and is recorded in its place.
  ASSERT_TRUE(store_->CommitTurn(Turn(3, toks, "resp_3", Record("", "old", "c"))).ok());
  EXPECT_EQ((*store_->GetRequest("", "old"))->body, "c");
  auto n = store_->ExpireRequests(UnixNow());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  n = store_->ExpireRequests(UnixNow() + 7200);  // both live records are past their time then
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2);
  EXPECT_FALSE(store_->GetRequest("", "live")->has_value());
  EXPECT_TRUE(store_->LoadSession(2).ok());  // turns stay: only the records go
}

// Two writers (two replicas on one store) commit the same request at once: one turn is stored.
TEST_P(StoreRequests, ConcurrentAttemptsCommitOnce) {
  auto other = Open();
  ASSERT_TRUE(other);
  const std::vector<int32_t> toks = {1, 2, 3};
  for (int round = 0; round < 5; ++round) {
    const std::string id = "race-" + std::to_string(round);
    Result<std::vector<std::string>> a = std::vector<std::string>{}, b = std::vector<std::string>{};
    std::thread ta([&] { a = store_->CommitTurn(Turn(100 + 2 * round, toks, id + "a", Record("", id, "a"))); });
    std::thread tb([&] { b = other->CommitTurn(Turn(101 + 2 * round, toks, id + "b", Record("", id, "b"))); });
    ta.join();
    tb.join();
    ASSERT_NE(a.ok(), b.ok()) << id;
    const Error& lost = a.ok() ? b.error() : a.error();
    EXPECT_EQ(lost.code, StatusCode::kAlreadyExists) << lost.message;
    EXPECT_EQ((*store_->GetRequest("", id))->body, a.ok() ? "a" : "b");
    EXPECT_EQ(store_->LoadSession(a.ok() ? 101 + 2 * round : 100 + 2 * round).ok(), false);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreRequests,
                         ::testing::Values(testing_util::Backend::kSqlite, testing_util::Backend::kPostgres),
                         testing_util::BackendName);

}  // namespace
}  // namespace mnemo
