// Posting a JSON body to a test server (server_process.h) and reading the answer: the parsed body,
// or a stream's events.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mnemo::testing {

// The data: payloads of an SSE body up to [DONE] (both APIs: Responses' lines carry an event name
// first).
inline std::vector<nlohmann::json> Events(const std::string& body) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    out.push_back(nlohmann::json::parse(data, nullptr, false));
  }
  return out;
}

// POSTs `body` to `path` on 127.0.0.1:port and expects status `expect` (a test failure otherwise,
// with the body sent and the answer). Returns the answer parsed (discarded when it is not JSON), or,
// for a body with "stream": true answered 200, its events as an array; null when no answer came.
inline nlohmann::json PostJson(int port, const std::string& path, const nlohmann::json& body, int expect = 200) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << path << ": no response";
    return nullptr;
  }
  EXPECT_EQ(r->status, expect) << body.dump() << " -> " << r->body;
  const bool stream = body.is_object() && body.contains("stream") && body["stream"] == true;
  if (stream && r->status == 200) return Events(r->body);
  return nlohmann::json::parse(r->body, nullptr, false);
}

}  // namespace mnemo::testing
