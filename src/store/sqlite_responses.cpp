// Responses API objects.
#include <mutex>
#include <nlohmann/json.hpp>

#include "store/sqlite_db.h"
#include "store/sqlite_store.h"
#include "store/store_internal.h"

namespace mnemo {

using sqlite::Transaction;

namespace {
constexpr const char* kResponseColumns =
    "id, owner, session_id, end_token, created_at, model, status, previous_response_id, conversation_id, "
    "request_json, input_items_json, output_json, usage_json";

StoredResponse ResponseFromRow(const sqlite::Stmt& st) {
  StoredResponse r;
  r.id = st.Text(0);
  r.owner = st.Text(1);
  r.session_id = st.OptInt(2);
  r.end_token = st.Int(3);
  r.created_at = st.Double(4);
  r.model = st.Text(5);
  r.status = st.Text(6);
  r.previous_response_id = st.OptText(7);
  r.conversation_id = st.OptText(8);
  r.request_json = st.Text(9);
  r.input_items_json = st.Text(10);
  r.output_json = st.Text(11);
  r.usage_json = st.Text(12);
  return r;
}
}  // namespace

Status SqliteStore::PutResponseTx(const StoredResponse& r) {
  if (r.id.empty()) return MakeError("a response needs an id");
  // Checked here, not left to constraints, for messages that name what is wrong.
  auto exists = writer_->Prepare("SELECT 1 FROM responses WHERE id=?1");
  if (!exists) return exists.error();
  auto row = exists->Bind(1, r.id).Step();
  if (!row) return row.error();
  if (*row) return MakeError("response '%s' exists", r.id.c_str());
  if (r.session_id) {
    auto len = SessionLength(*writer_, *r.session_id);
    if (!len) return len.error();
    if (r.end_token < 0 || r.end_token > *len) {
      return MakeError("response '%s': end_token %lld outside session %lld's %lld tokens", r.id.c_str(),
                       static_cast<long long>(r.end_token), static_cast<long long>(*r.session_id),
                       static_cast<long long>(*len));
    }
  }
  if (r.conversation_id) {
    auto conv = writer_->Prepare("SELECT 1 FROM conversations WHERE id=?1");
    if (!conv) return conv.error();
    auto found = conv->Bind(1, *r.conversation_id).Step();
    if (!found) return found.error();
    if (!*found) return MakeError("unknown conversation '%s'", r.conversation_id->c_str());
  }
  auto ins = writer_->Prepare(
      "INSERT INTO responses(id, owner, session_id, end_token, created_at, model, status, "
      "previous_response_id, conversation_id, request_json, input_items_json, output_json, usage_json) "
      "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
  if (!ins) return ins.error();
  return ins->Bind(1, r.id)
      .Bind(2, r.owner)
      .Bind(3, r.session_id)
      .Bind(4, r.end_token)
      .Bind(5, r.created_at == 0 ? UnixNow() : r.created_at)
      .Bind(6, r.model)
      .Bind(7, r.status)
      .Bind(8, r.previous_response_id)
      .Bind(9, r.conversation_id)
      .Bind(10, r.request_json)
      .Bind(11, r.input_items_json)
      .Bind(12, r.output_json)
      .Bind(13, r.usage_json)
      .Run();
}

Status SqliteStore::PutResponse(const StoredResponse& r) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  MNEMO_TRY(PutResponseTx(r));
  return tx->Commit();
}

Result<std::optional<StoredResponse>> SqliteStore::GetResponse(const std::string& id, const std::string& owner) {
  std::lock_guard lock(read_mu_);
  static const std::string kSql =
      std::string("SELECT ") + kResponseColumns + " FROM responses WHERE id=?1 AND owner=?2";
  auto st = reader_->Prepare(kSql.c_str());
  if (!st) return st.error();
  auto row = st->Bind(1, id).Bind(2, owner).Step();
  if (!row) return row.error();
  if (!*row) return std::optional<StoredResponse>();
  return std::optional<StoredResponse>(ResponseFromRow(*st));
}

Result<std::vector<ResponseLink>> SqliteStore::GetResponseChain(const std::string& id, const std::string& owner,
                                                         int max_links) {
  std::lock_guard lock(read_mu_);
  // Each step joins the previous link's previous_response_id on the primary key, with the owner
  // filter GetResponse applies: an absent or foreign link ends the chain, as in the hop-by-hop walk.
  auto st = reader_->Prepare(
      "WITH RECURSIVE chain(id, prev, hop) AS ("
      " SELECT id, previous_response_id, 0 FROM responses WHERE id=?1 AND owner=?2"
      " UNION ALL"
      " SELECT r.id, r.previous_response_id, chain.hop + 1 FROM chain JOIN responses r"
      " ON r.id = chain.prev AND r.owner = ?2 WHERE chain.hop + 1 < ?3)"
      " SELECT r.id, r.session_id, r.end_token, r.previous_response_id, r.input_items_json, r.output_json"
      " FROM chain JOIN responses r ON r.id = chain.id ORDER BY chain.hop");
  if (!st) return st.error();
  st->Bind(1, id).Bind(2, owner).Bind(3, static_cast<int64_t>(max_links));
  std::vector<ResponseLink> out;
  for (;;) {
    auto row = st->Step();
    if (!row) return row.error();
    if (!*row) break;
    ResponseLink l;
    l.id = st->Text(0);
    l.session_id = st->OptInt(1);
    l.end_token = st->Int(2);
    l.previous_response_id = st->OptText(3);
    l.input_items_json = st->Text(4);
    l.output_json = st->Text(5);
    out.push_back(std::move(l));
  }
  return out;
}

Result<bool> SqliteStore::DeleteResponse(const std::string& id, const std::string& owner) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto del = writer_->Prepare("DELETE FROM responses WHERE id=?1 AND owner=?2");
  if (!del) return del.error();
  MNEMO_TRY(del->Bind(1, id).Bind(2, owner).Run());
  bool deleted = writer_->changes() > 0;
  MNEMO_TRY(tx->Commit());
  return deleted;
}

Result<std::optional<ItemPage>> SqliteStore::ListInputItems(const std::string& id, const std::string& owner,
                                                      const ListOptions& options) {
  MNEMO_TRY(store_internal::CheckLimit(options));
  std::string items_json;
  double created_at = 0;
  {
    std::lock_guard lock(read_mu_);
    auto st = reader_->Prepare("SELECT input_items_json, created_at FROM responses WHERE id=?1 AND owner=?2");
    if (!st) return st.error();
    auto row = st->Bind(1, id).Bind(2, owner).Step();
    if (!row) return row.error();
    if (!*row) return std::optional<ItemPage>();
    items_json = st->Text(0);
    created_at = st->Double(1);
  }
  auto j = nlohmann::json::parse(items_json, nullptr, /*allow_exceptions=*/false);
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

}  // namespace mnemo
