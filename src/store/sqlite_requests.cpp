// Request-id de-duplication records (X-Mnemo-Request-Id).
#include <mutex>

#include "store/sqlite_db.h"
#include "store/sqlite_store.h"

namespace mnemo {

Status SqliteStore::PutRequestTx(const StoredRequest& r, double now) {
  if (r.request_id.empty()) return MakeError("a request record needs a request id");
  auto gone = writer_->Prepare("DELETE FROM request_records WHERE owner=?1 AND request_id=?2 AND expires_at<=?3");
  if (!gone) return gone.error();
  MNEMO_TRY(gone->Bind(1, r.owner).Bind(2, r.request_id).Bind(3, now).Run());
  auto exists = writer_->Prepare("SELECT 1 FROM request_records WHERE owner=?1 AND request_id=?2");
  if (!exists) return exists.error();
  auto row = exists->Bind(1, r.owner).Bind(2, r.request_id).Step();
  if (!row) return row.error();
  if (*row) return MakeError(StatusCode::kAlreadyExists, "request '%s' was answered already", r.request_id.c_str());
  auto ins = writer_->Prepare(
      "INSERT INTO request_records(owner, request_id, body_hash, status, body, created_at, expires_at) "
      "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  if (!ins) return ins.error();
  return ins->Bind(1, r.owner)
      .Bind(2, r.request_id)
      .Bind(3, r.body_hash)
      .Bind(4, int64_t{r.status})
      .Bind(5, r.body)
      .Bind(6, r.created_at == 0 ? now : r.created_at)
      .Bind(7, r.expires_at)
      .Run();
}

Result<std::optional<StoredRequest>> SqliteStore::GetRequest(const std::string& owner, const std::string& request_id) {
  std::lock_guard lock(read_mu_);
  auto st = reader_->Prepare(
      "SELECT body_hash, status, body, created_at, expires_at FROM request_records "
      "WHERE owner=?1 AND request_id=?2 AND expires_at>?3");
  if (!st) return st.error();
  auto row = st->Bind(1, owner).Bind(2, request_id).Bind(3, UnixNow()).Step();
  if (!row) return row.error();
  if (!*row) return std::optional<StoredRequest>();
  StoredRequest r;
  r.owner = owner;
  r.request_id = request_id;
  r.body_hash = st->Text(0);
  r.status = static_cast<int>(st->Int(1));
  r.body = st->Text(2);
  r.created_at = st->Double(3);
  r.expires_at = st->Double(4);
  return std::optional<StoredRequest>(std::move(r));
}

Result<int64_t> SqliteStore::ExpireRequests(double now) {
  std::lock_guard lock(write_mu_);
  auto st = writer_->Prepare("DELETE FROM request_records WHERE expires_at<=?1");
  if (!st) return st.error();
  MNEMO_TRY(st->Bind(1, now).Run());
  return writer_->changes();
}

}  // namespace mnemo
