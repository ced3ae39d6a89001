// A blocking connection to one Redis server (hiredis), with bounded waits: connecting and every
// command time out (the socket's timeouts), after which the connection is unusable and the caller
// drops it. Used by one thread at a time (the remote tier's worker). Errors are kUnavailable.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

struct redisContext;

namespace mnemo {

struct RedisUrl {
  std::string host;
  int port = 6379;
  int db = 0;  // SELECTed after connecting
};
// redis://HOST[:PORT][/DB]. Errors: kInvalidArgument (no host, a bad port or database number,
// another scheme, a password: not supported).
Result<RedisUrl> ParseRedisUrl(const std::string& url);

class RedisConnection {
 public:
  // Connects (within connect_timeout_s) and selects url.db; each later command must complete
  // within command_timeout_s.
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisUrl& url, double connect_timeout_s,
                                                          double command_timeout_s);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  Status Ping();
  // GETs every key in one pipeline (one round trip): got(i, value) for each key present, in
  // order; absent keys are skipped. The view is valid during the call only.
  Status GetMany(const std::vector<std::string>& keys, const std::function<void(size_t, std::string_view)>& got);
  // SET key value EX ttl_s for each pair, in one pipeline.
  Status SetMany(const std::vector<std::pair<std::string, std::string>>& kv, int ttl_s);
  // Runs a command with string arguments and returns the reply as text (a status, a string, an
  // integer in decimal; an error reply is an Error). For tests and tools (CONFIG, INFO, FLUSHDB).
  Result<std::string> Command(const std::vector<std::string>& args);

 private:
  RedisConnection() = default;
  Status Fail(const char* what);
  redisContext* c_ = nullptr;
};

}  // namespace mnemo
