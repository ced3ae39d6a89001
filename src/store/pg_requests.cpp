// Request-id de-duplication records (X-Mnemo-Request-Id) in PostgreSQL.
#include "store/pg_conn.h"
#include "store/pg_store.h"

namespace mnemo {

using pg::Conn;
using pg::Stmt;

Status PgStore::PutRequestTx(Conn& c, const StoredRequest& r, double now) {
  if (r.request_id.empty()) return MakeError("a request record needs a request id");
  MNEMO_TRY(c.Run(Stmt{"expire_request",
                       "DELETE FROM request_records WHERE owner=$1 AND request_id=$2 AND expires_at<=$3"},
                  {r.owner, r.request_id, now}));
  // A concurrent transaction inserting the same key (another replica committing the same request)
  // makes this wait for its end: it committed, nothing is inserted here; it rolled back, this is.
  auto ins = c.Exec(
      Stmt{"insert_request",
           "INSERT INTO request_records(owner, request_id, body_hash, status, body, created_at, expires_at) "
           "VALUES($1, $2, $3, $4, $5, $6, $7) ON CONFLICT(owner, request_id) DO NOTHING"},
      {r.owner, r.request_id, r.body_hash, r.status, r.body, r.created_at == 0 ? now : r.created_at, r.expires_at});
  if (!ins) return ins.error();
  if (ins->affected() == 0) {
    return MakeError(StatusCode::kAlreadyExists, "request '%s' was answered already", r.request_id.c_str());
  }
  return {};
}

Result<std::optional<StoredRequest>> PgStore::GetRequest(const std::string& owner, const std::string& request_id) {
  std::optional<StoredRequest> out;
  Status st = pool_->With([&](Conn& c) -> Status {
    auto rows = c.Exec(
        Stmt{"get_request",
             "SELECT body_hash, status, body, created_at, expires_at FROM request_records "
             "WHERE owner=$1 AND request_id=$2 AND expires_at>$3"},
        {owner, request_id, UnixNow()});
    if (!rows) return rows.error();
    out.reset();
    if (rows->size() == 0) return {};
    StoredRequest r;
    r.owner = owner;
    r.request_id = request_id;
    r.body_hash = rows->Text(0, 0);
    r.status = static_cast<int>(rows->Int(0, 1));
    r.body = rows->Text(0, 2);
    r.created_at = rows->Double(0, 3);
    r.expires_at = rows->Double(0, 4);
    out = std::move(r);
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<int64_t> PgStore::ExpireRequests(double now) {
  int64_t n = 0;
  Status st = WriteTx([&](Conn& c) -> Status {
    auto r = c.Exec("DELETE FROM request_records WHERE expires_at<=$1", {now});
    if (!r) return r.error();
    n = r->affected();
    return {};
  });
  if (!st.ok()) return st.error();
  return n;
}

}  // namespace mnemo
