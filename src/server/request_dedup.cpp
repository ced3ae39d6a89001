#include "server/request_dedup.h"

#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "server/http_util.h"

namespace mnemo {

// Running attempts by owner + '\n' + request id -> their body hash.
struct RequestDedup::Inflight {
  std::mutex mu;
  std::unordered_map<std::string, std::string> running;
};

namespace {

// Hex SHA-256 of route, a newline and body.
std::string BodyHash(std::string_view route, std::string_view body) { return http::Sha256Hex({route, "\n", body}); }

ApiError Reused() {
  return ApiError{422, "invalid_request_error",
                  "X-Mnemo-Request-Id was used before with a different request; use a new id for a new request.",
                  "", "request_id_reused"};
}

}  // namespace

bool ValidDedupRequestId(std::string_view id) {
  if (id.empty() || id.size() > kMaxDedupRequestId) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

RequestDedup::RequestDedup(Store* store, double ttl_s)
    : store_(store), ttl_s_(ttl_s), inflight_(std::make_shared<Inflight>()) {
  if (store_ && ttl_s_ > 0) cleaner_ = std::thread([this] { Clean(); });
}

RequestDedup::~RequestDedup() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (cleaner_.joinable()) cleaner_.join();
}

RequestDedup::Ticket::~Ticket() { Release(); }

void RequestDedup::Ticket::Release() {
  std::lock_guard lock(inflight_->mu);
  if (released_) return;
  released_ = true;
  inflight_->running.erase(key_);
}

StoredRequest RequestDedup::Ticket::Record(int status, std::string body) const {
  StoredRequest r = base_;
  r.status = status;
  r.body = std::move(body);
  return r;
}

RequestDedup::Outcome RequestDedup::Begin(const std::optional<std::string>& header, const std::string& owner,
                                          std::string_view route, std::string_view body) {
  Outcome out;
  if (!header) return out;
  if (!ValidDedupRequestId(*header)) {
    out.error = ApiError{400, "invalid_request_error",
                         "X-Mnemo-Request-Id must be 1 to 128 printable ASCII characters.", "", "invalid_request_id"};
    return out;
  }
  if (!store_) return out;
  StoredRequest base;
  base.owner = owner;
  base.request_id = *header;
  base.body_hash = BodyHash(route, body);
  const std::string key = owner + '\n' + *header;
  {
    std::lock_guard lock(inflight_->mu);
    auto it = inflight_->running.find(key);
    if (it != inflight_->running.end()) {
      if (it->second != base.body_hash) {
        out.error = Reused();
      } else {
        out.error = ApiError{409, "invalid_request_error",
                             "A request with this X-Mnemo-Request-Id is still running; retry after it ends.", "",
                             "request_in_progress"};
      }
      return out;
    }
    // Claimed before the store is asked: a second attempt arriving meanwhile waits for this one.
    inflight_->running.emplace(key, base.body_hash);
  }
  base.expires_at = UnixNow() + ttl_s_;
  auto ticket = std::make_shared<Ticket>(inflight_, key, base);
  auto stored = store_->GetRequest(owner, *header);
  if (!stored.ok()) {
    out.error = StoreError(stored.error(), "request id lookup: ");
    return out;  // the ticket dies here and releases the id
  }
  if (stored->has_value()) {
    if ((*stored)->body_hash != base.body_hash) {
      out.error = Reused();
    } else {
      out.replay = std::move(**stored);
    }
    return out;
  }
  out.ticket = std::move(ticket);
  return out;
}

std::optional<StoredRequest> RequestDedup::Committed(const Ticket& t) {
  if (!store_) return std::nullopt;
  auto stored = store_->GetRequest(t.base().owner, t.base().request_id);
  if (!stored.ok() || !stored->has_value() || (*stored)->body_hash != t.base().body_hash) return std::nullopt;
  return std::move(**stored);
}

void RequestDedup::Clean() {
  // A quarter of the lifetime between sweeps (records outlive their time by at most that), at
  // least a second and at most ten minutes apart. Expired records are never answered meanwhile:
  // GetRequest skips them.
  const auto period = std::chrono::duration<double>(std::clamp(ttl_s_ / 4, 1.0, 600.0));
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    auto n = store_->ExpireRequests(UnixNow());
    if (!n.ok()) {
      spdlog::warn("request ids: deleting expired records failed: {}", n.error().message);
    } else if (*n > 0) {
      spdlog::debug("request ids: deleted {} expired records", *n);
    }
    lock.lock();
  }
}

}  // namespace mnemo
