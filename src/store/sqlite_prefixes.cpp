// The prefix index (store.h): marking a session's log at its full chunks (a short log at its
// length), and finding the session whose marks match a request's longest.
#include "store/sqlite_db.h"
#include "store/sqlite_store.h"
#include "store/store_internal.h"

namespace mnemo {

namespace sqlite {

Status MarkPrefixes(Db& db, int64_t id, std::span<const int32_t> last) {
  // One statement for the owner (the chain's seed), the log's length and its last full mark (short
  // marks are no links of the chain).
  auto head = db.Prepare(
      "SELECT owner, n_tokens, "
      "(SELECT n_tokens FROM session_prefixes WHERE session_id=?1 AND n_tokens % 32 = 0 "
      "  ORDER BY n_tokens DESC LIMIT 1), "
      "(SELECT hash FROM session_prefixes WHERE session_id=?1 AND n_tokens % 32 = 0 "
      "  ORDER BY n_tokens DESC LIMIT 1) "
      "FROM sessions WHERE id=?1");
  if (!head) return head.error();
  auto row = head->Bind(1, id).Step();
  if (!row) return row.error();
  if (!*row) return MakeError("unknown session %lld", static_cast<long long>(id));
  const int64_t n = head->Int(1);
  const int64_t m = head->IsNull(2) ? 0 : head->Int(2);  // marked up to here
  const uint64_t seed = head->IsNull(2) ? PrefixSeed(head->Text(0)) : static_cast<uint64_t>(head->Int(3));
  if (!store_internal::HasMarksToAdd(m, n)) return {};
  // Tokens [m, n): read back what `last` does not hold (the partial chunk before a turn).
  const int64_t held = std::min<int64_t>(static_cast<int64_t>(last.size()), n - m);
  std::vector<int32_t> tail;
  tail.reserve(n - m);
  if (n - held > m) {
    auto ts = db.Prepare(
        "SELECT substr(tokens, max(?2 - turn_begin, 0) * 4 + 1) FROM turns "
        "WHERE session_id=?1 AND turn_end>?2 AND turn_begin<?3 ORDER BY turn_begin");
    if (!ts) return ts.error();
    ts->Bind(1, id).Bind(2, m).Bind(3, n - held);
    for (;;) {
      auto r = ts->Step();
      if (!r) return r.error();
      if (!*r) break;
      if (!store_internal::DecodeTokens(ts->Blob(0), tail)) break;
    }
    tail.resize(std::min<size_t>(tail.size(), n - held - m));
  }
  if (static_cast<int64_t>(tail.size()) != n - held - m) {
    return MakeError(StatusCode::kDataLoss, "session %lld is corrupt: its turns do not hold tokens [%lld, %lld)",
                     static_cast<long long>(id), static_cast<long long>(m), static_cast<long long>(n - held));
  }
  tail.insert(tail.end(), last.end() - held, last.end());
  const std::vector<uint64_t> marks = PrefixHashes(seed, tail);
  // OR IGNORE: a fork at a short mark of its source has copied it already.
  auto ins = db.Prepare("INSERT OR IGNORE INTO session_prefixes(session_id, n_tokens, hash) VALUES(?1, ?2, ?3)");
  if (!ins) return ins.error();
  for (size_t k = 0; k < marks.size(); ++k) {
    ins->Reset();
    MNEMO_TRY(ins->Bind(1, id).Bind(2, m + static_cast<int64_t>(k + 1) * kPrefixChunk)
                  .Bind(3, static_cast<int64_t>(marks[k]))
                  .Run());
  }
  if (n >= kPrefixChunk) return {};
  ins->Reset();
  return ins->Bind(1, id).Bind(2, n).Bind(3, static_cast<int64_t>(ShortPrefixHashes(seed, tail).back())).Run();
}

}  // namespace sqlite

Result<std::optional<PrefixMatch>> SqliteStore::FindPrefix(const std::string& owner, std::span<const uint64_t> hashes,
                                                            std::span<const uint64_t> short_hashes) {
  std::lock_guard lock(read_mu_);
  // From the longest down: the first chunk that matches is the answer (a local probe costs
  // microseconds, so no single statement is needed as on PostgreSQL).
  auto st = reader_->Prepare(
      "SELECT p.session_id, s.n_tokens FROM session_prefixes p JOIN sessions s ON s.id=p.session_id "
      "WHERE p.hash=?1 AND p.n_tokens=?2 AND s.owner=?3 ORDER BY p.session_id DESC LIMIT 1");
  if (!st) return st.error();
  for (size_t k = hashes.size(); k > 0; --k) {
    st->Reset();
    const int64_t n = static_cast<int64_t>(k) * kPrefixChunk;
    auto row = st->Bind(1, static_cast<int64_t>(hashes[k - 1])).Bind(2, n).Bind(3, owner).Step();
    if (!row) return row.error();
    if (*row) return std::optional<PrefixMatch>(PrefixMatch{st->Int(0), n, st->Int(1)});
  }
  for (size_t p = short_hashes.size(); p > 0; --p) {  // then the short marks, the longest first
    st->Reset();
    const int64_t n = static_cast<int64_t>(p);
    auto row = st->Bind(1, static_cast<int64_t>(short_hashes[p - 1])).Bind(2, n).Bind(3, owner).Step();
    if (!row) return row.error();
    if (*row) return std::optional<PrefixMatch>(PrefixMatch{st->Int(0), n, st->Int(1)});
  }
  return std::optional<PrefixMatch>();
}

}  // namespace mnemo
