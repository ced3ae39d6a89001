#include "kv/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <charconv>
#include <cstdlib>

namespace mnemo {
namespace {

timeval Tv(double s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

bool ParseInt(std::string_view s, int lo, int hi, int* out) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

}  // namespace

Result<RedisUrl> ParseRedisUrl(const std::string& url) {
  constexpr std::string_view kScheme = "redis://";
  auto bad = [&](const char* why) {
    return Error{std::string("--kv-remote wants redis://HOST[:PORT][/DB]: ") + why, StatusCode::kInvalidArgument};
  };
  if (url.compare(0, kScheme.size(), kScheme) != 0) return bad("another scheme");
  std::string_view rest = std::string_view(url).substr(kScheme.size());
  if (rest.find('@') != std::string_view::npos) return bad("passwords are not supported");
  RedisUrl u;
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && !ParseInt(db, 0, 1 << 20, &u.db)) return bad("a bad database number");
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon != std::string_view::npos && rest.find(']') == std::string_view::npos) {
    if (!ParseInt(rest.substr(colon + 1), 1, 65535, &u.port)) return bad("a bad port");
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return bad("no host");
  u.host = std::string(rest);
  return u;
}

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisUrl& url, double connect_timeout_s,
                                                                  double command_timeout_s) {
  std::unique_ptr<RedisConnection> r(new RedisConnection());
  r->c_ = redisConnectWithTimeout(url.host.c_str(), url.port, Tv(connect_timeout_s));
  if (!r->c_) return MakeError(StatusCode::kUnavailable, "redis: out of memory");
  if (r->c_->err) return r->Fail("connect").error();
  if (redisSetTimeout(r->c_, Tv(command_timeout_s)) != REDIS_OK) return r->Fail("set timeout").error();
  if (url.db != 0) {
    auto st = r->Command({"SELECT", std::to_string(url.db)});
    if (!st.ok()) return st.error();
  }
  return r;
}

RedisConnection::~RedisConnection() {
  if (c_) redisFree(c_);
}

Status RedisConnection::Fail(const char* what) {
  return MakeError(StatusCode::kUnavailable, "redis %s: %s", what, c_ && c_->err ? c_->errstr : "no reply");
}

Status RedisConnection::Ping() {
  auto r = Command({"PING"});
  if (!r.ok()) return r.error();
  return Status::Ok();
}

Result<std::string> RedisConnection::Command(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  Reply r(static_cast<redisReply*>(redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (!r) return Fail(args.empty() ? "command" : args[0].c_str()).error();
  switch (r->type) {
    case REDIS_REPLY_ERROR: return MakeError(StatusCode::kInternal, "redis %s: %s", args[0].c_str(), r->str);
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS: return std::string(r->str, r->len);
    default: return std::string();
  }
}

Status RedisConnection::GetMany(const std::vector<std::string>& keys,
                                const std::function<void(size_t, std::string_view)>& got) {
  for (const auto& k : keys) {
    if (redisAppendCommand(c_, "GET %b", k.data(), k.size()) != REDIS_OK) return Fail("GET");
  }
  for (size_t i = 0; i < keys.size(); i++) {
    void* raw = nullptr;
    if (redisGetReply(c_, &raw) != REDIS_OK) return Fail("GET");
    Reply r(static_cast<redisReply*>(raw));
    if (r->type == REDIS_REPLY_STRING) got(i, std::string_view(r->str, r->len));
    // NIL: absent. An error reply (e.g. a key of another type) is a miss too.
  }
  return Status::Ok();
}

Status RedisConnection::SetMany(const std::vector<std::pair<std::string, std::string>>& kv, int ttl_s) {
  for (const auto& [k, v] : kv) {
    if (redisAppendCommand(c_, "SET %b %b EX %d", k.data(), k.size(), v.data(), v.size(), ttl_s) != REDIS_OK) {
      return Fail("SET");
    }
  }
  Status st = Status::Ok();
  for (size_t i = 0; i < kv.size(); i++) {
    void* raw = nullptr;
    if (redisGetReply(c_, &raw) != REDIS_OK) return Fail("SET");
    Reply r(static_cast<redisReply*>(raw));
    // An error reply (OOM with maxmemory-policy noeviction) loses that put only.
    if (r->type == REDIS_REPLY_ERROR && st.ok()) st = MakeError(StatusCode::kResourceExhausted, "redis SET: %s", r->str);
  }
  return st;
}

}  // namespace mnemo
