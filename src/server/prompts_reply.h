// Completions with several prompts (`prompt: ["a", "b"]`, LangChain's generate): each prompt runs
// as its own request, its n choices from its own session, answering into one part of a
// PromptsReply, which sends one answer once every part has: as OpenAI's, the choices in prompt
// order with index = prompt * n + choice, and usage summed; the first part's failure instead
// (in prompt order). Not streamed: a part's Begin is refused.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "server/http_server.h"

namespace mnemo {

class PromptsReply : public std::enable_shared_from_this<PromptsReply> {
 public:
  // out: the request's reply; count: the prompts; n: the choices each part answers.
  static std::shared_ptr<PromptsReply> Create(std::shared_ptr<http::Reply> out, size_t count, int n);
  // Part i's reply (i < count). Its OnClose runs when the request's client goes away.
  std::shared_ptr<http::Reply> Part(size_t i);
  // Keeps `hold` alive until the answer goes out (the request id's ticket).
  void Hold(std::shared_ptr<void> hold) { hold_ = std::move(hold); }
  // The merged answer of the parts' bodies (exposed for tests): choices re-indexed and
  // concatenated, usage summed member by member, the rest from the first.
  static nlohmann::json Merge(const std::vector<nlohmann::json>& parts, int n);

 private:
  class PartReply;
  PromptsReply(std::shared_ptr<http::Reply> out, size_t count, int n);
  void Done(size_t i, http::Response r);
  void AddCloser(std::function<void()> fn);
  void Closed();

  std::shared_ptr<http::Reply> out_;
  const int n_;
  std::mutex mu_;
  std::vector<std::optional<http::Response>> answers_;  // [count] each part's, once sent
  size_t left_;
  std::vector<std::function<void()>> closers_;  // the parts' OnClose
  bool closed_ = false;                          // the client went away
  std::shared_ptr<void> hold_;
};

}  // namespace mnemo
