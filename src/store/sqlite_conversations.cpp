// Conversations API objects and their items.
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "store/sqlite_db.h"
#include "store/sqlite_store.h"
#include "store/store_internal.h"

namespace mnemo {

using sqlite::Db;
using sqlite::Transaction;

namespace {
Status CheckMetadata(const std::string& metadata_json) {
  auto j = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return MakeError("conversation metadata must be a JSON object");
  return {};
}

// True when conversation id exists and (if owner is given) belongs to owner.
Result<bool> ConversationExists(Db& db, const std::string& id, const std::string* owner) {
  auto st = owner ? db.Prepare("SELECT 1 FROM conversations WHERE id=?1 AND owner=?2")
                  : db.Prepare("SELECT 1 FROM conversations WHERE id=?1");
  if (!st) return st.error();
  st->Bind(1, id);
  if (owner) st->Bind(2, *owner);
  auto row = st->Step();
  if (!row) return row.error();
  return *row;
}

// Item row columns: id, position, item_json, created_at.
StoredItem ItemFromRow(const sqlite::Stmt& st) {
  return StoredItem{st.Text(0), st.Int(1), st.Text(2), st.Double(3)};
}
}  // namespace

Result<std::vector<std::string>> SqliteStore::AddItemsTx(const std::string& conversation_id,
                                                   std::span<const NewItem> items, double now) {
  auto exists = ConversationExists(*writer_, conversation_id, nullptr);
  if (!exists) return exists.error();
  if (!*exists) return MakeError("unknown conversation '%s'", conversation_id.c_str());
  auto next = writer_->Prepare(
      "SELECT coalesce(max(position), -1) + 1 FROM conversation_items WHERE conversation_id=?1");
  if (!next) return next.error();
  auto row = next->Bind(1, conversation_id).Step();
  if (!row) return row.error();
  int64_t position = next->Int(0);
  auto ins = writer_->Prepare(
      "INSERT INTO conversation_items(id, conversation_id, position, item_json, created_at) "
      "VALUES(?1, ?2, ?3, ?4, ?5)");
  if (!ins) return ins.error();
  auto dup = writer_->Prepare("SELECT 1 FROM conversation_items WHERE conversation_id=?1 AND id=?2");
  if (!dup) return dup.error();
  std::vector<std::string> ids;
  for (const NewItem& item : items) {
    auto id = store_internal::ItemIdFor(item);
    if (!id) return id.error();
    dup->Reset();
    auto taken = dup->Bind(1, conversation_id).Bind(2, *id).Step();
    if (!taken) return taken.error();
    if (*taken) return MakeError(StatusCode::kAlreadyExists, "conversation item '%s' exists", id->c_str());
    ins->Reset();
    MNEMO_TRY(ins->Bind(1, *id).Bind(2, conversation_id).Bind(3, position++).Bind(4, item.item_json)
                  .Bind(5, now)
                  .Run());
    ids.push_back(std::move(*id));
  }
  return ids;
}

Result<StoredConversation> SqliteStore::CreateConversation(StoredConversation c, std::span<const NewItem> items,
                                                     std::vector<std::string>* item_ids) {
  if (c.id.empty()) c.id = NewId("conv_");
  if (c.metadata_json.empty()) c.metadata_json = "{}";
  MNEMO_TRY(CheckMetadata(c.metadata_json));
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  double now = UnixNow();
  if (c.created_at == 0) c.created_at = now;
  if (!c.session_id) c.end_token.reset();
  if (c.session_id) {
    auto len = SessionLength(*writer_, *c.session_id);
    if (!len) return len.error();
  }
  auto exists = ConversationExists(*writer_, c.id, nullptr);
  if (!exists) return exists.error();
  if (*exists) return MakeError("conversation '%s' exists", c.id.c_str());
  auto ins = writer_->Prepare(
      "INSERT INTO conversations(id, owner, created_at, metadata_json, session_id, end_token) "
      "VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
  if (!ins) return ins.error();
  MNEMO_TRY(ins->Bind(1, c.id).Bind(2, c.owner).Bind(3, c.created_at).Bind(4, c.metadata_json)
                .Bind(5, c.session_id).Bind(6, c.end_token)
                .Run());
  auto ids = AddItemsTx(c.id, items, now);
  if (!ids) return ids.error();
  MNEMO_TRY(tx->Commit());
  if (item_ids) *item_ids = std::move(*ids);
  return c;
}

Result<std::optional<StoredConversation>> SqliteStore::GetConversation(const std::string& id,
                                                                 const std::string& owner) {
  std::lock_guard lock(read_mu_);
  auto st = reader_->Prepare(
      "SELECT id, owner, created_at, metadata_json, session_id, end_token FROM conversations "
      "WHERE id=?1 AND owner=?2");
  if (!st) return st.error();
  auto row = st->Bind(1, id).Bind(2, owner).Step();
  if (!row) return row.error();
  if (!*row) return std::optional<StoredConversation>();
  StoredConversation c;
  c.id = st->Text(0);
  c.owner = st->Text(1);
  c.created_at = st->Double(2);
  c.metadata_json = st->Text(3);
  c.session_id = st->OptInt(4);
  // A deleted session nulls session_id (ON DELETE SET NULL) but leaves end_token behind.
  if (c.session_id) c.end_token = st->OptInt(5);
  return std::optional<StoredConversation>(std::move(c));
}

Result<bool> SqliteStore::UpdateConversationMetadata(const std::string& id, const std::string& owner,
                                               const std::string& metadata_json) {
  MNEMO_TRY(CheckMetadata(metadata_json));
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto upd = writer_->Prepare("UPDATE conversations SET metadata_json=?3 WHERE id=?1 AND owner=?2");
  if (!upd) return upd.error();
  MNEMO_TRY(upd->Bind(1, id).Bind(2, owner).Bind(3, metadata_json).Run());
  bool found = writer_->changes() > 0;
  MNEMO_TRY(tx->Commit());
  return found;
}

Result<bool> SqliteStore::DeleteConversation(const std::string& id, const std::string& owner) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto del = writer_->Prepare("DELETE FROM conversations WHERE id=?1 AND owner=?2");
  if (!del) return del.error();
  MNEMO_TRY(del->Bind(1, id).Bind(2, owner).Run());
  bool found = writer_->changes() > 0;
  MNEMO_TRY(tx->Commit());
  return found;
}

Result<std::optional<std::vector<std::string>>> SqliteStore::AddConversationItems(const std::string& id,
                                                                            const std::string& owner,
                                                                            std::span<const NewItem> items) {
  using Out = std::optional<std::vector<std::string>>;
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto exists = ConversationExists(*writer_, id, &owner);
  if (!exists) return exists.error();
  if (!*exists) return Out();
  auto ids = AddItemsTx(id, items, UnixNow());
  if (!ids) return ids.error();
  MNEMO_TRY(tx->Commit());
  return Out(std::move(*ids));
}

Result<std::optional<ItemPage>> SqliteStore::ListConversationItems(const std::string& id, const std::string& owner,
                                                             const ListOptions& options) {
  MNEMO_TRY(store_internal::CheckLimit(options));
  std::lock_guard lock(read_mu_);
  auto tx = Transaction::Begin(*reader_, Transaction::Kind::kRead);
  if (!tx) return tx.error();
  auto exists = ConversationExists(*reader_, id, &owner);
  if (!exists) return exists.error();
  if (!*exists) return std::optional<ItemPage>();
  // The cursor: items strictly after `after` in the requested order.
  int64_t bound = options.ascending ? -1 : std::numeric_limits<int64_t>::max();
  if (!options.after.empty()) {
    auto pos = reader_->Prepare("SELECT position FROM conversation_items WHERE conversation_id=?1 AND id=?2");
    if (!pos) return pos.error();
    auto row = pos->Bind(1, id).Bind(2, options.after).Step();
    if (!row) return row.error();
    if (!*row) return MakeError(StatusCode::kInvalidArgument, "no item '%s' in conversation '%s'", options.after.c_str(), id.c_str());
    bound = pos->Int(0);
  }
  auto st = options.ascending
                ? reader_->Prepare(
                      "SELECT id, position, item_json, created_at FROM conversation_items "
                      "WHERE conversation_id=?1 AND position>?2 ORDER BY position ASC LIMIT ?3")
                : reader_->Prepare(
                      "SELECT id, position, item_json, created_at FROM conversation_items "
                      "WHERE conversation_id=?1 AND position<?2 ORDER BY position DESC LIMIT ?3");
  if (!st) return st.error();
  st->Bind(1, id).Bind(2, bound).Bind(3, int64_t{options.limit} + 1);  // one extra row: has_more
  ItemPage page;
  for (;;) {
    auto row = st->Step();
    if (!row) return row.error();
    if (!*row) break;
    if (static_cast<int>(page.items.size()) == options.limit) {
      page.has_more = true;
      break;
    }
    page.items.push_back(ItemFromRow(*st));
  }
  return std::optional<ItemPage>(std::move(page));
}

Result<std::optional<StoredItem>> SqliteStore::GetConversationItem(const std::string& id, const std::string& owner,
                                                             const std::string& item_id) {
  std::lock_guard lock(read_mu_);
  auto st = reader_->Prepare(
      "SELECT i.id, i.position, i.item_json, i.created_at FROM conversation_items i "
      "JOIN conversations c ON c.id=i.conversation_id WHERE i.id=?1 AND c.id=?2 AND c.owner=?3");
  if (!st) return st.error();
  auto row = st->Bind(1, item_id).Bind(2, id).Bind(3, owner).Step();
  if (!row) return row.error();
  if (!*row) return std::optional<StoredItem>();
  return std::optional<StoredItem>(ItemFromRow(*st));
}

Result<bool> SqliteStore::DeleteConversationItem(const std::string& id, const std::string& owner,
                                           const std::string& item_id) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  auto del = writer_->Prepare(
      "DELETE FROM conversation_items WHERE id=?1 AND conversation_id="
      "(SELECT id FROM conversations WHERE id=?2 AND owner=?3)");
  if (!del) return del.error();
  MNEMO_TRY(del->Bind(1, item_id).Bind(2, id).Bind(3, owner).Run());
  bool found = writer_->changes() > 0;
  MNEMO_TRY(tx->Commit());
  return found;
}

Result<bool> SqliteStore::SetConversationSession(const std::string& id, std::optional<int64_t> session_id,
                                           std::optional<int64_t> end_token) {
  std::lock_guard lock(write_mu_);
  auto tx = Transaction::Begin(*writer_, Transaction::Kind::kWrite);
  if (!tx) return tx.error();
  if (!session_id) end_token.reset();
  if (session_id) {
    auto len = SessionLength(*writer_, *session_id);
    if (!len) return len.error();
    if (!end_token || *end_token < 0 || *end_token > *len) {
      return MakeError("conversation '%s': end_token outside session %lld's %lld tokens", id.c_str(),
                       static_cast<long long>(*session_id), static_cast<long long>(*len));
    }
  }
  auto upd = writer_->Prepare("UPDATE conversations SET session_id=?2, end_token=?3 WHERE id=?1");
  if (!upd) return upd.error();
  MNEMO_TRY(upd->Bind(1, id).Bind(2, session_id).Bind(3, end_token).Run());
  bool found = writer_->changes() > 0;
  MNEMO_TRY(tx->Commit());
  return found;
}

}  // namespace mnemo
