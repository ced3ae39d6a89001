// The PostgreSQL store's Responses and Conversations API objects (same semantics as
// sqlite_responses.cpp and sqlite_conversations.cpp).
#include <limits>
#include <nlohmann/json.hpp>

#include "store/pg_conn.h"
#include "store/pg_store.h"
#include "store/store_internal.h"

namespace mnemo {

using pg::Conn;
using pg::Stmt;
using pg::Rows;
using pg::Tx;

namespace {
constexpr const char* kSnapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

StoredResponse ResponseFromRow(const Rows& r) {
  StoredResponse s;
  s.id = r.Text(0, 0);
  s.owner = r.Text(0, 1);
  s.session_id = r.OptInt(0, 2);
  s.end_token = r.Int(0, 3);
  s.created_at = r.Double(0, 4);
  s.model = r.Text(0, 5);
  s.status = r.Text(0, 6);
  s.previous_response_id = r.OptText(0, 7);
  s.conversation_id = r.OptText(0, 8);
  s.request_json = r.Text(0, 9);
  s.input_items_json = r.Text(0, 10);
  s.output_json = r.Text(0, 11);
  s.usage_json = r.Text(0, 12);
  return s;
}

Status CheckMetadata(const std::string& metadata_json) {
  auto j = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return MakeError("conversation metadata must be a JSON object");
  return {};
}

// Item row columns: id, position, item_json, created_at.
StoredItem ItemFromRow(const Rows& r, int row) {
  return StoredItem{r.Text(row, 0), r.Int(row, 1), r.Text(row, 2), r.Double(row, 3)};
}

Result<int64_t> SessionLength(Conn& c, int64_t id) {
  auto v = c.QueryInt(Stmt{"session_n_tokens", "SELECT n_tokens FROM sessions WHERE id=$1"}, {id});
  if (!v) return v.error();
  if (!v->has_value()) return MakeError("unknown session %lld", static_cast<long long>(id));
  return **v;
}
}  // namespace

// ---- responses ----

Status PgStore::PutResponseTx(Conn& c, const StoredResponse& r) {
  if (r.id.empty()) return MakeError("a response needs an id");
  // Checked here, not left to constraints, for messages that name what is wrong.
  auto exists = c.QueryInt(Stmt{"response_exists", "SELECT 1 FROM responses WHERE id=$1"}, {r.id});
  if (!exists) return exists.error();
  if (exists->has_value()) return MakeError("response '%s' exists", r.id.c_str());
  if (r.session_id) {
    auto len = SessionLength(c, *r.session_id);
    if (!len) return len.error();
    if (r.end_token < 0 || r.end_token > *len) {
      return MakeError("response '%s': end_token %lld outside session %lld's %lld tokens", r.id.c_str(),
                       static_cast<long long>(r.end_token), static_cast<long long>(*r.session_id),
                       static_cast<long long>(*len));
    }
  }
  if (r.conversation_id) {
    auto conv = c.QueryInt(Stmt{"conversation_exists", "SELECT 1 FROM conversations WHERE id=$1"},
                           {*r.conversation_id});
    if (!conv) return conv.error();
    if (!conv->has_value()) return MakeError("unknown conversation '%s'", r.conversation_id->c_str());
  }
  return c.Run(
      Stmt{"insert_response",
           "INSERT INTO responses(id, owner, session_id, end_token, created_at, model, status, "
           "previous_response_id, conversation_id, request_json, input_items_json, output_json, usage_json) "
           "VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"},
      {r.id, r.owner, r.session_id, r.end_token, r.created_at == 0 ? UnixNow() : r.created_at, r.model, r.status,
       r.previous_response_id, r.conversation_id, r.request_json, r.input_items_json, r.output_json, r.usage_json});
}

Status PgStore::PutResponse(const StoredResponse& r) {
  return WriteTx([&](Conn& c) { return PutResponseTx(c, r); });
}

Result<std::optional<StoredResponse>> PgStore::GetResponse(const std::string& id, const std::string& owner) {
  std::optional<StoredResponse> out;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.Exec(
        Stmt{"get_response",
             "SELECT id, owner, session_id, end_token, created_at, model, status, previous_response_id, "
             "conversation_id, request_json, input_items_json, output_json, usage_json FROM responses "
             "WHERE id=$1 AND owner=$2"},
        {id, owner});
    if (!r) return r.error();
    if (r->size() > 0) out = ResponseFromRow(*r);
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<std::vector<ResponseLink>> PgStore::GetResponseChain(const std::string& id, const std::string& owner,
                                                           int max_links) {
  std::vector<ResponseLink> out;
  Status st = pool_->With([&](Conn& c) -> Status {
    // As in SQLite: each step joins the previous link's previous_response_id on the primary key,
    // with GetResponse's owner filter; an absent or foreign link ends the chain.
    auto r = c.Exec(
        "WITH RECURSIVE chain(id, prev, hop) AS ("
        " SELECT id, previous_response_id, 0 FROM responses WHERE id=$1 AND owner=$2"
        " UNION ALL"
        " SELECT r.id, r.previous_response_id, chain.hop + 1 FROM chain JOIN responses r"
        " ON r.id = chain.prev AND r.owner = $2 WHERE chain.hop + 1 < $3::int)"
        " SELECT r.id, r.session_id, r.end_token, r.previous_response_id, r.input_items_json, r.output_json"
        " FROM chain JOIN responses r ON r.id = chain.id ORDER BY chain.hop",
        {id, owner, max_links});
    if (!r) return r.error();
    out.clear();
    for (int i = 0; i < r->size(); ++i) {
      ResponseLink l;
      l.id = r->Text(i, 0);
      l.session_id = r->OptInt(i, 1);
      l.end_token = r->Int(i, 2);
      l.previous_response_id = r->OptText(i, 3);
      l.input_items_json = r->Text(i, 4);
      l.output_json = r->Text(i, 5);
      out.push_back(std::move(l));
    }
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<bool> PgStore::DeleteResponse(const std::string& id, const std::string& owner) {
  bool deleted = false;
  Status st = WriteTx([&](Conn& c) -> Status {
    auto r = c.Exec("DELETE FROM responses WHERE id=$1 AND owner=$2", {id, owner});
    if (!r) return r.error();
    deleted = r->affected() > 0;
    return {};
  });
  if (!st.ok()) return st.error();
  return deleted;
}

Result<std::optional<ItemPage>> PgStore::ListInputItems(const std::string& id, const std::string& owner,
                                                        const ListOptions& options) {
  MNEMO_TRY(store_internal::CheckLimit(options));
  std::optional<std::string> items_json;
  double created_at = 0;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.Exec("SELECT input_items_json, created_at FROM responses WHERE id=$1 AND owner=$2", {id, owner});
    if (!r) return r.error();
    if (r->size() > 0) {
      items_json = r->Text(0, 0);
      created_at = r->Double(0, 1);
    }
    return {};
  });
  if (!st.ok()) return st.error();
  if (!items_json) return std::optional<ItemPage>();
  auto j = nlohmann::json::parse(*items_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return MakeError("response '%s': stored input items are not a JSON array", id.c_str());
  std::vector<StoredItem> items;
  items.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    StoredItem it;
    if (j[i].is_object()) {
      auto f = j[i].find("id");
      if (f != j[i].end() && f->is_string()) it.id = f->get<std::string>();
    }
    it.position = static_cast<int64_t>(i);
    it.item_json = j[i].dump();
    it.created_at = created_at;
    items.push_back(std::move(it));
  }
  auto page = store_internal::PageOf(std::move(items), options);
  if (!page) return page.error();
  return std::optional<ItemPage>(std::move(*page));
}

// ---- conversations ----

Result<std::vector<std::string>> PgStore::AddItemsTx(Conn& c, const std::string& conversation_id,
                                                     std::span<const NewItem> items, double now) {
  // The row lock orders concurrent appends to one conversation (positions are max + 1).
  auto exists = c.QueryInt(Stmt{"lock_conversation", "SELECT 1 FROM conversations WHERE id=$1 FOR UPDATE"},
                           {conversation_id});
  if (!exists) return exists.error();
  if (!exists->has_value()) return MakeError("unknown conversation '%s'", conversation_id.c_str());
  auto next = c.QueryInt(Stmt{"next_item_position",
                              "SELECT coalesce(max(position), -1) + 1 FROM conversation_items "
                              "WHERE conversation_id=$1"},
                         {conversation_id});
  if (!next) return next.error();
  int64_t position = next->value_or(0);
  std::vector<std::string> ids;
  for (const NewItem& item : items) {
    auto id = store_internal::ItemIdFor(item);
    if (!id) return id.error();
    auto taken = c.QueryInt(Stmt{"item_exists", "SELECT 1 FROM conversation_items WHERE conversation_id=$1 AND id=$2"},
                            {conversation_id, *id});
    if (!taken) return taken.error();
    if (taken->has_value()) {
      return MakeError(StatusCode::kAlreadyExists, "conversation item '%s' exists", id->c_str());
    }
    MNEMO_TRY(c.Run(
        Stmt{"insert_item",
             "INSERT INTO conversation_items(id, conversation_id, position, item_json, created_at) "
             "VALUES($1, $2, $3, $4, $5)"},
        {*id, conversation_id, position++, item.item_json, now}));
    ids.push_back(std::move(*id));
  }
  return ids;
}

Result<StoredConversation> PgStore::CreateConversation(StoredConversation conv, std::span<const NewItem> items,
                                                       std::vector<std::string>* item_ids) {
  if (conv.id.empty()) conv.id = NewId("conv_");
  if (conv.metadata_json.empty()) conv.metadata_json = "{}";
  MNEMO_TRY(CheckMetadata(conv.metadata_json));
  const double now = UnixNow();
  if (conv.created_at == 0) conv.created_at = now;
  if (!conv.session_id) conv.end_token.reset();
  std::vector<std::string> ids;
  Status st = WriteTx([&](Conn& c) -> Status {
    if (conv.session_id) {
      auto len = SessionLength(c, *conv.session_id);
      if (!len) return len.error();
    }
    auto exists = c.QueryInt("SELECT 1 FROM conversations WHERE id=$1", {conv.id});
    if (!exists) return exists.error();
    if (exists->has_value()) return MakeError("conversation '%s' exists", conv.id.c_str());
    MNEMO_TRY(c.Run(
        "INSERT INTO conversations(id, owner, created_at, metadata_json, session_id, end_token) "
        "VALUES($1, $2, $3, $4, $5, $6)",
        {conv.id, conv.owner, conv.created_at, conv.metadata_json, conv.session_id, conv.end_token}));
    auto added = AddItemsTx(c, conv.id, items, now);
    if (!added) return added.error();
    ids = std::move(*added);
    return {};
  });
  if (!st.ok()) return st.error();
  if (item_ids) *item_ids = std::move(ids);
  return conv;
}

Result<std::optional<StoredConversation>> PgStore::GetConversation(const std::string& id, const std::string& owner) {
  std::optional<StoredConversation> out;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.Exec(
        "SELECT id, owner, created_at, metadata_json, session_id, end_token FROM conversations "
        "WHERE id=$1 AND owner=$2",
        {id, owner});
    if (!r) return r.error();
    if (r->size() == 0) return {};
    StoredConversation conv;
    conv.id = r->Text(0, 0);
    conv.owner = r->Text(0, 1);
    conv.created_at = r->Double(0, 2);
    conv.metadata_json = r->Text(0, 3);
    conv.session_id = r->OptInt(0, 4);
    // A deleted session nulls session_id (ON DELETE SET NULL) but leaves end_token behind.
    if (conv.session_id) conv.end_token = r->OptInt(0, 5);
    out = std::move(conv);
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

namespace {
// Runs one owner-checked write statement; returns whether it changed a row.
Result<bool> ChangedAny(const std::function<Status(const std::function<Status(Conn&)>&)>& write_tx,
                        const char* sql, std::initializer_list<pg::Param> params) {
  bool found = false;
  Status st = write_tx([&](Conn& c) -> Status {
    auto r = c.Exec(sql, params);
    if (!r) return r.error();
    found = r->affected() > 0;
    return {};
  });
  if (!st.ok()) return st.error();
  return found;
}
}  // namespace

Result<bool> PgStore::UpdateConversationMetadata(const std::string& id, const std::string& owner,
                                                 const std::string& metadata_json) {
  MNEMO_TRY(CheckMetadata(metadata_json));
  return ChangedAny([this](const auto& fn) { return WriteTx(fn); },
                    "UPDATE conversations SET metadata_json=$3 WHERE id=$1 AND owner=$2", {id, owner, metadata_json});
}

Result<bool> PgStore::DeleteConversation(const std::string& id, const std::string& owner) {
  return ChangedAny([this](const auto& fn) { return WriteTx(fn); },
                    "DELETE FROM conversations WHERE id=$1 AND owner=$2", {id, owner});
}

Result<std::optional<std::vector<std::string>>> PgStore::AddConversationItems(const std::string& id,
                                                                              const std::string& owner,
                                                                              std::span<const NewItem> items) {
  using Out = std::optional<std::vector<std::string>>;
  Out out;
  Status st = WriteTx([&](Conn& c) -> Status {
    auto exists = c.QueryInt("SELECT 1 FROM conversations WHERE id=$1 AND owner=$2", {id, owner});
    if (!exists) return exists.error();
    if (!exists->has_value()) return {};
    auto ids = AddItemsTx(c, id, items, UnixNow());
    if (!ids) return ids.error();
    out = std::move(*ids);
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<std::optional<ItemPage>> PgStore::ListConversationItems(const std::string& id, const std::string& owner,
                                                               const ListOptions& options) {
  MNEMO_TRY(store_internal::CheckLimit(options));
  std::optional<ItemPage> out;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto tx = Tx::Begin(c, kSnapshot);
    if (!tx) return tx.error();
    out.reset();
    auto exists = c.QueryInt("SELECT 1 FROM conversations WHERE id=$1 AND owner=$2", {id, owner});
    if (!exists) return exists.error();
    if (!exists->has_value()) return {};
    // The cursor: items strictly after `after` in the requested order.
    int64_t bound = options.ascending ? -1 : std::numeric_limits<int64_t>::max();
    if (!options.after.empty()) {
      auto pos = c.QueryInt("SELECT position FROM conversation_items WHERE conversation_id=$1 AND id=$2",
                            {id, options.after});
      if (!pos) return pos.error();
      if (!pos->has_value()) {
        return MakeError(StatusCode::kInvalidArgument, "no item '%s' in conversation '%s'", options.after.c_str(),
                         id.c_str());
      }
      bound = **pos;
    }
    auto r = c.Exec(options.ascending
                        ? "SELECT id, position, item_json, created_at FROM conversation_items "
                          "WHERE conversation_id=$1 AND position>$2 ORDER BY position ASC LIMIT $3"
                        : "SELECT id, position, item_json, created_at FROM conversation_items "
                          "WHERE conversation_id=$1 AND position<$2 ORDER BY position DESC LIMIT $3",
                    {id, bound, int64_t{options.limit} + 1});  // one extra row: has_more
    if (!r) return r.error();
    ItemPage page;
    for (int i = 0; i < r->size(); ++i) {
      if (static_cast<int>(page.items.size()) == options.limit) {
        page.has_more = true;
        break;
      }
      page.items.push_back(ItemFromRow(*r, i));
    }
    out = std::move(page);
    return tx->Commit();
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<std::optional<StoredItem>> PgStore::GetConversationItem(const std::string& id, const std::string& owner,
                                                               const std::string& item_id) {
  std::optional<StoredItem> out;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto r = c.Exec(
        "SELECT i.id, i.position, i.item_json, i.created_at FROM conversation_items i "
        "JOIN conversations c ON c.id=i.conversation_id WHERE i.id=$1 AND c.id=$2 AND c.owner=$3",
        {item_id, id, owner});
    if (!r) return r.error();
    if (r->size() > 0) out = ItemFromRow(*r, 0);
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<bool> PgStore::DeleteConversationItem(const std::string& id, const std::string& owner,
                                             const std::string& item_id) {
  return ChangedAny([this](const auto& fn) { return WriteTx(fn); },
                    "DELETE FROM conversation_items WHERE id=$1 AND conversation_id="
                    "(SELECT id FROM conversations WHERE id=$2 AND owner=$3)",
                    {item_id, id, owner});
}

Result<bool> PgStore::SetConversationSession(const std::string& id, std::optional<int64_t> session_id,
                                             std::optional<int64_t> end_token) {
  if (!session_id) end_token.reset();
  bool found = false;
  Status st = WriteTx([&](Conn& c) -> Status {
    if (session_id) {
      auto len = SessionLength(c, *session_id);
      if (!len) return len.error();
      if (!end_token || *end_token < 0 || *end_token > *len) {
        return MakeError("conversation '%s': end_token outside session %lld's %lld tokens", id.c_str(),
                         static_cast<long long>(*session_id), static_cast<long long>(*len));
      }
    }
    auto r = c.Exec("UPDATE conversations SET session_id=$2, end_token=$3 WHERE id=$1", {id, session_id, end_token});
    if (!r) return r.error();
    found = r->affected() > 0;
    return {};
  });
  if (!st.ok()) return st.error();
  return found;
}

}  // namespace mnemo
