// Responses and conversations: round trips, ownership isolation, paging, and the atomic CommitTurn.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>

#include "store/store.h"
#include "test_util.h"

namespace mnemo {
namespace {

using testing_util::Paging;

class StoreObjects : public ::testing::TestWithParam<testing_util::Backend> {
 protected:
  void SetUp() override {
    if (!home_.unavailable().empty()) GTEST_SKIP() << home_.unavailable();
    auto s = Store::Open(home_.Spec("o.db"));
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(*s);
  }
  // Reopens the same file (everything must still be there).
  void Reopen() {
    store_.reset();
    auto s = Store::Open(home_.Spec("o.db"));
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(*s);
  }
  testing_util::StoreHome home_{GetParam()};
  std::unique_ptr<Store> store_;
};

StoredResponse SampleResponse(const std::string& id, const std::string& owner) {
  StoredResponse r;
  r.id = id;
  r.owner = owner;
  r.end_token = 0;
  r.created_at = 1700000000.5;
  r.model = "stories260K";
  r.status = "completed";
  r.previous_response_id = "resp_prev";
  r.request_json = R"({"input":"hi","store":true})";
  r.input_items_json = R"([{"id":"msg_1","type":"message","role":"user","content":"a"},)"
                       R"({"id":"msg_2","type":"message","role":"user","content":"b"},)"
                       R"({"id":"msg_3","type":"message","role":"user","content":"c"}])";
  r.output_json = R"([{"type":"message","role":"assistant","content":[{"type":"output_text","text":"yo"}]}])";
  r.usage_json = R"({"input_tokens":3,"output_tokens":1})";
  return r;
}

std::vector<std::string> Ids(const ItemPage& p) {
  std::vector<std::string> v;
  for (const auto& it : p.items) v.push_back(it.id);
  return v;
}

TEST(StoreIds, NewIdIsPrefixAnd32Hex) {
  std::string a = NewId("resp_"), b = NewId("resp_");
  ASSERT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(a.substr(0, 5), "resp_");
  for (char c : a.substr(5)) EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(c)) << a;
  EXPECT_NE(a, b);
}

TEST_P(StoreObjects, ResponseRoundTripAndOwnership) {
  StoredResponse r = SampleResponse("resp_1", "key-a");
  ASSERT_TRUE(store_->PutResponse(r).ok());
  EXPECT_FALSE(store_->PutResponse(r).ok());  // id exists
  Reopen();
  auto got = store_->GetResponse("resp_1", "key-a");
  ASSERT_TRUE(got.ok()) << got.error().message;
  ASSERT_TRUE(got->has_value());
  const StoredResponse& g = **got;
  EXPECT_EQ(g.id, r.id);
  EXPECT_EQ(g.owner, r.owner);
  EXPECT_FALSE(g.session_id.has_value());
  EXPECT_EQ(g.end_token, 0);
  EXPECT_DOUBLE_EQ(g.created_at, r.created_at);
  EXPECT_EQ(g.model, r.model);
  EXPECT_EQ(g.status, r.status);
  EXPECT_EQ(g.previous_response_id, r.previous_response_id);
  EXPECT_FALSE(g.conversation_id.has_value());
  EXPECT_EQ(g.request_json, r.request_json);
  EXPECT_EQ(g.input_items_json, r.input_items_json);
  EXPECT_EQ(g.output_json, r.output_json);
  EXPECT_EQ(g.usage_json, r.usage_json);

  // Another owner sees nothing and cannot delete it.
  auto other = store_->GetResponse("resp_1", "key-b");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
  auto del = store_->DeleteResponse("resp_1", "key-b");
  ASSERT_TRUE(del.ok());
  EXPECT_FALSE(*del);
  auto items = store_->ListInputItems("resp_1", "key-b", {});
  ASSERT_TRUE(items.ok());
  EXPECT_FALSE(items->has_value());

  del = store_->DeleteResponse("resp_1", "key-a");
  ASSERT_TRUE(del.ok());
  EXPECT_TRUE(*del);
  got = store_->GetResponse("resp_1", "key-a");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

TEST_P(StoreObjects, ResponseReferencesAreChecked) {
  StoredResponse r = SampleResponse("resp_1", "");
  r.session_id = 42;  // unknown
  Status st = store_->PutResponse(r);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("unknown session"), std::string::npos) << st.error().message;
  r.session_id.reset();
  r.conversation_id = "conv_missing";
  EXPECT_FALSE(store_->PutResponse(r).ok());
  auto got = store_->GetResponse("resp_1", "");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

TEST_P(StoreObjects, InputItemsPageBothWays) {
  ASSERT_TRUE(store_->PutResponse(SampleResponse("resp_1", "k")).ok());
  auto p = store_->ListInputItems("resp_1", "k", Paging(true, "", 2));
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ(Ids(**p), (std::vector<std::string>{"msg_1", "msg_2"}));
  EXPECT_TRUE((*p)->has_more);
  EXPECT_EQ(nlohmann::json::parse((*p)->items[0].item_json)["content"], "a");
  p = store_->ListInputItems("resp_1", "k", Paging(true, "msg_2", 2));
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ(Ids(**p), (std::vector<std::string>{"msg_3"}));
  EXPECT_FALSE((*p)->has_more);
  p = store_->ListInputItems("resp_1", "k", Paging(false, "msg_3", 5));
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ(Ids(**p), (std::vector<std::string>{"msg_2", "msg_1"}));
  EXPECT_FALSE(store_->ListInputItems("resp_1", "k", Paging(true, "msg_9", 20)).ok());
  EXPECT_FALSE(store_->ListInputItems("resp_1", "k", Paging(true, "", 0)).ok());
}

TEST_P(StoreObjects, ConversationLifecycle) {
  StoredConversation c;
  c.owner = "k";
  c.metadata_json = R"({"topic":"demo"})";
  std::vector<NewItem> initial = {{"", R"({"type":"message","role":"user","content":"one"})"},
                                  {"", R"({"type":"function_call","name":"f"})"}};
  std::vector<std::string> ids;
  auto created = store_->CreateConversation(c, initial, &ids);
  ASSERT_TRUE(created.ok()) << created.error().message;
  const std::string conv = created->id;
  EXPECT_EQ(conv.substr(0, 5), "conv_");
  EXPECT_GT(created->created_at, 1.6e9);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0].substr(0, 4), "msg_");
  EXPECT_EQ(ids[1].substr(0, 5), "item_");

  auto more = store_->AddConversationItems(conv, "k", std::vector<NewItem>{
      {"msg_custom", R"({"type":"message","role":"assistant","content":"two"})"},
      {"", R"({"role":"user","content":"three"})"}});
  ASSERT_TRUE(more.ok() && more->has_value()) << (more.ok() ? "" : more.error().message);
  ids.insert(ids.end(), (*more)->begin(), (*more)->end());
  EXPECT_EQ(ids[2], "msg_custom");
  // Not a JSON object: refused, nothing added.
  EXPECT_FALSE(store_->AddConversationItems(conv, "k", std::vector<NewItem>{{"", "[1,2]"}}).ok());
  // A taken id: refused as a whole.
  EXPECT_FALSE(store_->AddConversationItems(conv, "k", std::vector<NewItem>{
      {"msg_new", R"({"type":"message"})"}, {"msg_custom", R"({"type":"message"})"}}).ok());
  Reopen();

  auto got = store_->GetConversation(conv, "k");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->metadata_json, R"({"topic":"demo"})");
  EXPECT_FALSE((*got)->session_id.has_value());

  auto page = store_->ListConversationItems(conv, "k", Paging(true, "", 3));
  ASSERT_TRUE(page.ok() && page->has_value()) << (page.ok() ? "" : page.error().message);
  EXPECT_EQ(Ids(**page), (std::vector<std::string>{ids[0], ids[1], ids[2]}));
  EXPECT_TRUE((*page)->has_more);
  page = store_->ListConversationItems(conv, "k", Paging(true, ids[2], 3));
  ASSERT_TRUE(page.ok() && page->has_value());
  EXPECT_EQ(Ids(**page), (std::vector<std::string>{ids[3]}));
  EXPECT_FALSE((*page)->has_more);
  page = store_->ListConversationItems(conv, "k", Paging(false, "", 2));
  ASSERT_TRUE(page.ok() && page->has_value());
  EXPECT_EQ(Ids(**page), (std::vector<std::string>{ids[3], ids[2]}));
  EXPECT_TRUE((*page)->has_more);
  page = store_->ListConversationItems(conv, "k", Paging(false, ids[1], 2));
  ASSERT_TRUE(page.ok() && page->has_value());
  EXPECT_EQ(Ids(**page), (std::vector<std::string>{ids[0]}));
  EXPECT_FALSE(store_->ListConversationItems(conv, "k", Paging(true, "msg_nope", 20)).ok());

  auto item = store_->GetConversationItem(conv, "k", ids[2]);
  ASSERT_TRUE(item.ok() && item->has_value());
  EXPECT_EQ((*item)->item_json, R"({"type":"message","role":"assistant","content":"two"})");
  EXPECT_EQ((*item)->position, 2);

  auto del = store_->DeleteConversationItem(conv, "k", ids[1]);
  ASSERT_TRUE(del.ok() && *del);
  del = store_->DeleteConversationItem(conv, "k", ids[1]);
  ASSERT_TRUE(del.ok());
  EXPECT_FALSE(*del);
  page = store_->ListConversationItems(conv, "k", Paging(true, "", 10));
  ASSERT_TRUE(page.ok() && page->has_value());
  EXPECT_EQ(Ids(**page), (std::vector<std::string>{ids[0], ids[2], ids[3]}));

  auto upd = store_->UpdateConversationMetadata(conv, "k", R"({"topic":"new"})");
  ASSERT_TRUE(upd.ok() && *upd);
  EXPECT_FALSE(store_->UpdateConversationMetadata(conv, "k", "not json").ok());
  got = store_->GetConversation(conv, "k");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->metadata_json, R"({"topic":"new"})");

  ASSERT_TRUE(store_->CreateSession(4, "k").ok());
  ASSERT_TRUE(store_->AppendTurn(4, 0, 2, std::vector<int32_t>{1, 2, 3}, true).ok());
  auto set = store_->SetConversationSession(conv, 4, 3);
  ASSERT_TRUE(set.ok() && *set);
  EXPECT_FALSE(store_->SetConversationSession(conv, 4, 9).ok());   // past the log
  EXPECT_FALSE(store_->SetConversationSession(conv, 77, 0).ok());  // unknown session
  got = store_->GetConversation(conv, "k");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->session_id, std::optional<int64_t>(4));
  EXPECT_EQ((*got)->end_token, std::optional<int64_t>(3));

  // Deleting the conversation takes its items with it.
  auto gone = store_->DeleteConversation(conv, "k");
  ASSERT_TRUE(gone.ok() && *gone);
  got = store_->GetConversation(conv, "k");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  item = store_->GetConversationItem(conv, "k", ids[0]);
  ASSERT_TRUE(item.ok());
  EXPECT_FALSE(item->has_value());
  // The ids are free again (the items are really gone, not just hidden).
  StoredConversation c2;
  c2.owner = "k";
  auto again = store_->CreateConversation(c2, std::vector<NewItem>{{ids[0], R"({"type":"message"})"}});
  EXPECT_TRUE(again.ok()) << (again.ok() ? "" : again.error().message);
}

TEST_P(StoreObjects, ConversationOwnershipIsolation) {
  StoredConversation c;
  c.owner = "alice";
  std::vector<std::string> ids;
  auto created = store_->CreateConversation(c, std::vector<NewItem>{{"", R"({"type":"message"})"}}, &ids);
  ASSERT_TRUE(created.ok());
  const std::string id = created->id;
  auto got = store_->GetConversation(id, "bob");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  auto list = store_->ListConversationItems(id, "bob", {});
  ASSERT_TRUE(list.ok());
  EXPECT_FALSE(list->has_value());
  auto item = store_->GetConversationItem(id, "bob", ids[0]);
  ASSERT_TRUE(item.ok());
  EXPECT_FALSE(item->has_value());
  auto add = store_->AddConversationItems(id, "bob", std::vector<NewItem>{{"", R"({"type":"message"})"}});
  ASSERT_TRUE(add.ok());
  EXPECT_FALSE(add->has_value());
  auto b = store_->UpdateConversationMetadata(id, "bob", "{}");
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(*b);
  b = store_->DeleteConversationItem(id, "bob", ids[0]);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(*b);
  b = store_->DeleteConversation(id, "bob");
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(*b);
  // Alice still has it all.
  list = store_->ListConversationItems(id, "alice", {});
  ASSERT_TRUE(list.ok() && list->has_value());
  EXPECT_EQ((*list)->items.size(), 1u);
}

// An item id is unique within its conversation only: another owner's conversation may use the
// same client-chosen id (no collision, so no way to probe for it); a repeat within one
// conversation, or within one batch, is kAlreadyExists and adds nothing.
TEST_P(StoreObjects, ItemIdsAreScopedToTheirConversation) {
  StoredConversation a, b;
  a.owner = "alice";
  b.owner = "bob";
  auto ca = store_->CreateConversation(a, std::vector<NewItem>{{"msg_1", R"({"type":"message","n":"a"})"}});
  ASSERT_TRUE(ca.ok()) << ca.error().message;
  auto cb = store_->CreateConversation(b, std::vector<NewItem>{{"msg_1", R"({"type":"message","n":"b"})"}});
  ASSERT_TRUE(cb.ok()) << cb.error().message;
  auto ia = store_->GetConversationItem(ca->id, "alice", "msg_1");
  auto ib = store_->GetConversationItem(cb->id, "bob", "msg_1");
  ASSERT_TRUE(ia.ok() && ia->has_value() && ib.ok() && ib->has_value());
  EXPECT_EQ((*ia)->item_json, R"({"type":"message","n":"a"})");
  EXPECT_EQ((*ib)->item_json, R"({"type":"message","n":"b"})");
  auto again = store_->AddConversationItems(ca->id, "alice", std::vector<NewItem>{{"msg_1", R"({"type":"message"})"}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, StatusCode::kAlreadyExists);
  auto twice = store_->AddConversationItems(
      cb->id, "bob", std::vector<NewItem>{{"msg_2", R"({"type":"message"})"}, {"msg_2", R"({"type":"message"})"}});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, StatusCode::kAlreadyExists);
  auto list = store_->ListConversationItems(cb->id, "bob", {});
  ASSERT_TRUE(list.ok() && list->has_value());
  EXPECT_EQ(Ids(**list), std::vector<std::string>{"msg_1"});  // the failed batch left nothing
  // Deleting one conversation's item leaves the other's.
  auto d = store_->DeleteConversationItem(ca->id, "alice", "msg_1");
  ASSERT_TRUE(d.ok() && *d);
  ib = store_->GetConversationItem(cb->id, "bob", "msg_1");
  ASSERT_TRUE(ib.ok() && ib->has_value());
}

TEST_P(StoreObjects, CommitTurnWritesEverythingTogether) {
  StoredConversation c;
  auto conv = store_->CreateConversation(c, {});
  ASSERT_TRUE(conv.ok());
  std::vector<int32_t> toks = {5, 6, 7, 8};
  TurnCommit tc;
  tc.session_id = 11;
  tc.create_session = true;
  tc.begin = 0;
  tc.prompt_end = 2;
  tc.tokens = toks;
  tc.response = SampleResponse("resp_c1", "");
  tc.response->conversation_id = conv->id;
  tc.conversation = ConversationUpdate{conv->id, {{"", R"({"type":"message","role":"user"})"},
                                                  {"", R"({"type":"message","role":"assistant"})"}}};
  auto ids = store_->CommitTurn(tc);
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_EQ(ids->size(), 2u);
  Reopen();
  auto s = store_->LoadSession(11);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, toks);
  auto r = store_->GetResponse("resp_c1", "");
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->session_id, std::optional<int64_t>(11));
  EXPECT_EQ((*r)->end_token, 4);
  EXPECT_EQ((*r)->conversation_id, conv->id);
  auto g = store_->GetConversation(conv->id, "");
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ((*g)->session_id, std::optional<int64_t>(11));
  EXPECT_EQ((*g)->end_token, std::optional<int64_t>(4));

  // A branch: cut back to 2 tokens and continue from there, in the same transaction.
  std::vector<int32_t> toks2 = {9, 9, 9};
  TurnCommit branch;
  branch.session_id = 11;
  branch.truncate_to = 2;
  branch.begin = 2;
  branch.prompt_end = 3;
  branch.tokens = toks2;
  branch.response = SampleResponse("resp_c2", "");
  ASSERT_TRUE(store_->CommitTurn(branch).ok());
  s = store_->LoadSession(11);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{5, 6, 9, 9, 9}));
  r = store_->GetResponse("resp_c1", "");
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_FALSE((*r)->session_id.has_value());  // its tokens were replaced
  g = store_->GetConversation(conv->id, "");
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_FALSE((*g)->session_id.has_value());
}

// Two turns of one conversation that both read it before either committed (their turn lock lost,
// or first turns, which each create their own session): the second commit finds the conversation
// moved on and stores nothing.
TEST_P(StoreObjects, ConversationCommitExpectsWhereItRead) {
  auto conv = store_->CreateConversation(StoredConversation{}, {});
  ASSERT_TRUE(conv.ok());
  const ConversationPointer read_at;  // both read it before its first turn
  std::vector<int32_t> toks = {5, 6, 7};
  auto turn = [&](int64_t session, const std::string& response_id, const std::string& item_id) {
    TurnCommit tc;
    tc.session_id = session;
    tc.create_session = true;
    tc.prompt_end = 1;
    tc.tokens = toks;
    tc.response = SampleResponse(response_id, "");
    tc.response->conversation_id = conv->id;
    tc.conversation = ConversationUpdate{conv->id, {{item_id, R"({"type":"message"})"}}, true, read_at};
    return store_->CommitTurn(tc);
  };
  ASSERT_TRUE(turn(31, "resp_first", "msg_first").ok());
  auto second = turn(32, "resp_second", "msg_second");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, StatusCode::kAborted);

  Reopen();
  EXPECT_FALSE(store_->LoadSession(32).ok());
  auto r = store_->GetResponse("resp_second", "");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  auto items = store_->ListConversationItems(conv->id, "", Paging(true, "", 10));
  ASSERT_TRUE(items.ok() && items->has_value());
  EXPECT_EQ(Ids(**items), (std::vector<std::string>{"msg_first"}));

  // The next turn, having read where the first one left it, commits.
  TurnCommit next;
  next.session_id = 31;
  next.begin = 3;
  next.prompt_end = 4;
  next.tokens = toks;
  next.conversation = ConversationUpdate{conv->id, {{"msg_next", R"({"type":"message"})"}}, true,
                                         ConversationPointer{31, 3}};
  auto ok = store_->CommitTurn(next);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  auto g = store_->GetConversation(conv->id, "");
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ((ConversationPointer{(*g)->session_id, (*g)->end_token}), (ConversationPointer{31, 6}));

  // A turn that cuts the previous reply's last token (an end-of-generation token the template does
  // not write, as after every tool call) read the conversation at that reply's end: the cut clears
  // pointers past it, but the compare-and-set is against what the writer read (it failed every
  // such turn with "moved on").
  TurnCommit cut;
  cut.session_id = 31;
  cut.truncate_to = 5;
  cut.begin = 5;
  cut.prompt_end = 6;
  cut.tokens = toks;
  cut.conversation = ConversationUpdate{conv->id, {{"msg_cut", R"({"type":"message"})"}}, true,
                                        ConversationPointer{31, 6}};
  ok = store_->CommitTurn(cut);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  g = store_->GetConversation(conv->id, "");
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ((ConversationPointer{(*g)->session_id, (*g)->end_token}), (ConversationPointer{31, 8}));
}

// Each commit fails at a different step, after earlier steps wrote: nothing of it may remain.
TEST_P(StoreObjects, FailedCommitLeavesNothing) {
  ASSERT_TRUE(store_->PutResponse(SampleResponse("resp_taken", "")).ok());
  StoredConversation c;
  auto conv = store_->CreateConversation(c, std::vector<NewItem>{{"msg_taken", R"({"type":"message"})"}});
  ASSERT_TRUE(conv.ok());
  std::vector<int32_t> toks = {1, 2, 3};

  TurnCommit dup_response;  // session created and turn appended, then the response insert fails
  dup_response.session_id = 20;
  dup_response.create_session = true;
  dup_response.prompt_end = 1;
  dup_response.tokens = toks;
  dup_response.response = SampleResponse("resp_taken", "");
  EXPECT_FALSE(store_->CommitTurn(dup_response).ok());

  TurnCommit dup_item = dup_response;  // ... then the second conversation item fails
  dup_item.response = SampleResponse("resp_new", "");
  dup_item.conversation = ConversationUpdate{conv->id, {{"msg_fresh", R"({"type":"message"})"},
                                                        {"msg_taken", R"({"type":"message"})"}}};
  EXPECT_FALSE(store_->CommitTurn(dup_item).ok());

  TurnCommit bad_conv = dup_response;  // ... unknown conversation
  bad_conv.response = SampleResponse("resp_new", "");
  bad_conv.conversation = ConversationUpdate{"conv_missing", {}};
  EXPECT_FALSE(store_->CommitTurn(bad_conv).ok());

  Reopen();
  EXPECT_FALSE(store_->LoadSession(20).ok());
  auto m = store_->MaxSessionId();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, 0);
  auto r = store_->GetResponse("resp_new", "");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  auto items = store_->ListConversationItems(conv->id, "", Paging(true, "", 10));
  ASSERT_TRUE(items.ok() && items->has_value());
  EXPECT_EQ(Ids(**items), (std::vector<std::string>{"msg_taken"}));

  // An existing session: a failing commit leaves its log as it was (no truncation either).
  ASSERT_TRUE(store_->CreateSession(21, "").ok());
  ASSERT_TRUE(store_->AppendTurn(21, 0, 1, toks, true).ok());
  TurnCommit cut;
  cut.session_id = 21;
  cut.truncate_to = 1;
  cut.begin = 1;
  cut.prompt_end = 1;
  cut.tokens = toks;
  cut.response = SampleResponse("resp_taken", "");
  EXPECT_FALSE(store_->CommitTurn(cut).ok());
  auto s = store_->LoadSession(21);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens, toks);
}

}  // namespace
}  // namespace mnemo

namespace mnemo {
namespace {

// The chain as the hop-by-hop walk sees it (GetResponse per link), newest first.
std::vector<std::string> WalkIds(Store& store, const std::string& id, const std::string& owner, int max) {
  std::vector<std::string> out;
  std::optional<std::string> cur = id;
  while (cur && static_cast<int>(out.size()) < max) {
    auto r = store.GetResponse(*cur, owner);
    if (!r.ok() || !r->has_value()) break;
    out.push_back((*r)->id);
    cur = (*r)->previous_response_id;
  }
  return out;
}

TEST_P(StoreObjects, ResponseChainIsTheHopByHopWalkInOneQuery) {
  // resp_0 <- resp_1 <- ... <- resp_9 (key-a), with resp_4 another owner's.
  for (int i = 0; i < 10; i++) {
    StoredResponse r = SampleResponse("resp_" + std::to_string(i), i == 4 ? "key-b" : "key-a");
    r.previous_response_id = i == 0 ? std::nullopt : std::optional<std::string>("resp_" + std::to_string(i - 1));
    r.output_json = R"([{"text":")" + std::to_string(i) + R"("}])";
    ASSERT_TRUE(store_->PutResponse(r).ok());
  }
  auto ids = [&](const std::string& id, const std::string& owner, int max) {
    auto c = store_->GetResponseChain(id, owner, max);
    EXPECT_TRUE(c.ok()) << c.error().message;
    std::vector<std::string> out;
    for (const auto& l : *c) out.push_back(l.id);
    return out;
  };
  EXPECT_EQ(ids("resp_9", "key-a", 100), (std::vector<std::string>{"resp_9", "resp_8", "resp_7", "resp_6", "resp_5"}));
  EXPECT_EQ(ids("resp_9", "key-a", 100), WalkIds(*store_, "resp_9", "key-a", 100));  // a foreign link ends it
  EXPECT_EQ(ids("resp_3", "key-a", 100), WalkIds(*store_, "resp_3", "key-a", 100));
  EXPECT_EQ(ids("resp_3", "key-a", 2), (std::vector<std::string>{"resp_3", "resp_2"}));  // at most max links
  EXPECT_EQ(ids("resp_4", "key-a", 100), std::vector<std::string>{});  // absent for this owner
  EXPECT_EQ(ids("resp_4", "key-b", 100), (std::vector<std::string>{"resp_4"}));
  auto c = store_->GetResponseChain("resp_2", "key-a", 100);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 3u);
  EXPECT_EQ((*c)[0].output_json, R"([{"text":"2"}])");
  EXPECT_EQ((*c)[0].previous_response_id, std::optional<std::string>("resp_1"));
  EXPECT_EQ((*c)[2].previous_response_id, std::nullopt);
  EXPECT_EQ((*c)[1].input_items_json, SampleResponse("x", "").input_items_json);
  ASSERT_TRUE(store_->DeleteResponse("resp_7", "key-a").ok());  // a deleted link ends it too
  EXPECT_EQ(ids("resp_9", "key-a", 100), (std::vector<std::string>{"resp_9", "resp_8"}));
  EXPECT_EQ(ids("resp_9", "key-a", 100), WalkIds(*store_, "resp_9", "key-a", 100));
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreObjects,
                         ::testing::Values(testing_util::Backend::kSqlite, testing_util::Backend::kPostgres),
                         testing_util::BackendName);

}  // namespace
}  // namespace mnemo
