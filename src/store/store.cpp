// Opening a store (choosing its backend); ids and helpers shared by the backends.
#include "store/store.h"

#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <xxhash.h>

#include "store/pg_store.h"
#include "store/sqlite_store.h"
#include "store/store_internal.h"

namespace mnemo {

Result<std::unique_ptr<Store>> Store::Open(const std::string& spec, const StoreOptions& options) {
  if (IsPostgresSpec(spec)) return PgStore::Open(spec, options);
  return SqliteStore::Open(spec, options);
}

bool Store::IsPostgresSpec(const std::string& spec) {
  return spec.starts_with("postgresql://") || spec.starts_with("postgres://");
}

Result<int64_t> Store::NewSessionId() {
  return MakeError(StatusCode::kFailedPrecondition, "store '%s' is not shared: the engine mints session ids",
                   path_.c_str());
}

Result<Store::IdentityClaim> Store::ClaimTokenIdentity(int64_t identity) {
  auto current = TokenIdentity();
  if (!current.ok()) return current.error();
  if (*current && **current == identity) return IdentityClaim::kSame;
  if (*current) {
    auto any = HasSessions();
    if (!any.ok()) return any.error();
    if (*any) return IdentityClaim::kHeldByOther;
  }
  MNEMO_TRY(SetTokenIdentity(identity));
  return IdentityClaim::kClaimed;
}

Result<std::vector<StoredSession>> Store::LoadSessions() {
  std::vector<StoredSession> all;
  Status st = ForEachSession([&](StoredSession&& s) {
    all.push_back(std::move(s));
    return Status::Ok();
  });
  if (!st) return st.error();
  return all;
}

// ---- the prefix index ----

uint64_t PrefixSeed(const std::string& owner) { return XXH3_64bits(owner.data(), owner.size()); }

std::vector<uint64_t> PrefixHashes(uint64_t seed, std::span<const int32_t> tokens) {
  // The ids' bytes in host order, as the KV tiers hash them: replicas share one architecture.
  const size_t n = tokens.size() / kPrefixChunk;
  std::vector<uint64_t> out(n);
  for (size_t k = 0; k < n; ++k) {
    seed = XXH3_64bits_withSeed(tokens.data() + k * kPrefixChunk, sizeof(int32_t) * kPrefixChunk, seed);
    out[k] = seed;
  }
  return out;
}

std::vector<uint64_t> ShortPrefixHashes(uint64_t seed, std::span<const int32_t> tokens) {
  const size_t n = std::min<size_t>(tokens.size(), kPrefixChunk - 1);
  std::vector<uint64_t> out(n);
  for (size_t p = 1; p <= n; ++p) out[p - 1] = XXH3_64bits_withSeed(tokens.data(), sizeof(int32_t) * p, seed);
  return out;
}

// ---- ids, clock ----

int64_t ConversationLockId(std::string_view conversation_id) {
  const uint64_t h = XXH3_64bits(conversation_id.data(), conversation_id.size());
  return -1 - static_cast<int64_t>(h >> 1);
}

std::string NewId(std::string_view prefix) {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof bytes) {  // getrandom unavailable (old kernel, seccomp): the same source via a file
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && got < sizeof bytes) {
      ssize_t n = read(fd, bytes + got, sizeof bytes - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (fd >= 0) close(fd);
  }
  // Ids guard other users' objects: never hand out a predictable one.
  MNEMO_CHECK_MSG(got == sizeof bytes, "no kernel randomness for ids (getrandom and /dev/urandom failed)");
  static const char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (uint8_t b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

std::string NewId(std::string_view prefix, std::string_view key) {
  if (key.empty()) return NewId(prefix);
  std::string p(prefix);
  p += key;
  p += '_';
  return NewId(p);
}

namespace {
bool IsAlnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
}  // namespace

std::string SanitizeAffinityKey(std::string_view raw) {
  std::string key;
  for (char c : raw) {
    if (key.size() == kMaxAffinityKey) break;
    if (IsAlnum(c)) key += c;
  }
  return key;
}

std::string AffinityKeyOf(std::string_view id) {
  // <prefix>_<key>_<32 hex>: the key sits between the first '_' and the last one.
  const size_t first = id.find('_'), last = id.rfind('_');
  if (first == std::string_view::npos || last == first || id.size() - last - 1 != 32) return "";
  for (char c : id.substr(last + 1)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return "";
  }
  std::string_view key = id.substr(first + 1, last - first - 1);
  if (key.empty() || key.size() > kMaxAffinityKey) return "";
  for (char c : key) {
    if (!IsAlnum(c)) return "";
  }
  return std::string(key);
}

double UnixNow() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// ---- helpers ----

namespace store_internal {

std::vector<uint8_t> EncodeTokens(std::span<const int32_t> tokens) {
  std::vector<uint8_t> out(tokens.size() * 4);
  if constexpr (std::endian::native == std::endian::little) {
    if (!tokens.empty()) std::memcpy(out.data(), tokens.data(), out.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      uint32_t v = static_cast<uint32_t>(tokens[i]);
      for (int k = 0; k < 4; ++k) out[4 * i + k] = static_cast<uint8_t>(v >> (8 * k));
    }
  }
  return out;
}

bool DecodeTokens(std::span<const uint8_t> blob, std::vector<int32_t>& out) {
  if (blob.size() % 4 != 0) return false;
  size_t n = blob.size() / 4, at = out.size();
  out.resize(at + n);
  if constexpr (std::endian::native == std::endian::little) {
    if (n) std::memcpy(out.data() + at, blob.data(), blob.size());
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint32_t v = 0;
      for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(blob[4 * i + k]) << (8 * k);
      out[at + i] = static_cast<int32_t>(v);
    }
  }
  return true;
}

Result<std::string> ItemIdFor(const NewItem& item) {
  auto j = nlohmann::json::parse(item.item_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return MakeError("a conversation item must be a JSON object");
  if (!item.id.empty()) return item.id;
  auto type = j.find("type");
  bool message = type == j.end() || (type->is_string() && type->get<std::string>() == "message");
  return NewId(message ? "msg_" : "item_");
}

Status CheckLimit(const ListOptions& options) {
  if (options.limit < 1 || options.limit > 10000) {
    return MakeError(StatusCode::kInvalidArgument, "list limit must be in [1, 10000], not %d", options.limit);
  }
  return {};
}

Result<ItemPage> PageOf(std::vector<StoredItem> items, const ListOptions& options) {
  MNEMO_TRY(CheckLimit(options));
  if (!options.ascending) std::reverse(items.begin(), items.end());
  size_t start = 0;
  if (!options.after.empty()) {
    auto it = std::find_if(items.begin(), items.end(),
                           [&](const StoredItem& x) { return x.id == options.after; });
    if (it == items.end()) return MakeError(StatusCode::kInvalidArgument, "no item '%s' in this list", options.after.c_str());
    start = static_cast<size_t>(it - items.begin()) + 1;
  }
  ItemPage page;
  size_t stop = std::min(items.size(), start + static_cast<size_t>(options.limit));
  page.items.assign(std::make_move_iterator(items.begin() + start), std::make_move_iterator(items.begin() + stop));
  page.has_more = stop < items.size();
  return page;
}

}  // namespace store_internal
}  // namespace mnemo
