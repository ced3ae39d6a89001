#include "server/prompts_reply.h"

#include <nlohmann/json.hpp>

namespace mnemo {

using Json = nlohmann::json;

class PromptsReply::PartReply : public http::Reply {
 public:
  PartReply(std::shared_ptr<PromptsReply> all, size_t i) : all_(std::move(all)), i_(i) {}
  void Send(http::Response res) override { all_->Done(i_, std::move(res)); }
  bool Begin(http::Response) override { return false; }  // never streamed (refused at parse)
  bool Write(std::string) override { return false; }
  void End() override {}
  void OnClose(std::function<void()> fn) override { all_->AddCloser(std::move(fn)); }

 private:
  std::shared_ptr<PromptsReply> all_;
  size_t i_;
};

std::shared_ptr<PromptsReply> PromptsReply::Create(std::shared_ptr<http::Reply> out, size_t count, int n) {
  std::shared_ptr<PromptsReply> r(new PromptsReply(std::move(out), count, n));
  // One closer on the request's reply (it keeps one): it runs every part's. Weak: the connection
  // may keep its closer past the answer.
  std::weak_ptr<PromptsReply> weak = r;
  r->out_->OnClose([weak] {
    if (auto self = weak.lock()) self->Closed();
  });
  return r;
}

PromptsReply::PromptsReply(std::shared_ptr<http::Reply> out, size_t count, int n)
    : out_(std::move(out)), n_(n), answers_(count), left_(count) {}

std::shared_ptr<http::Reply> PromptsReply::Part(size_t i) { return std::make_shared<PartReply>(shared_from_this(), i); }

void PromptsReply::AddCloser(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      closers_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void PromptsReply::Closed() {
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    fns.swap(closers_);
  }
  for (auto& fn : fns) fn();
}

Json PromptsReply::Merge(const std::vector<Json>& parts, int n) {
  Json out = parts.at(0);
  out["choices"] = Json::array();
  // Usage: numbers summed, objects (prompt_tokens_details) member by member.
  std::function<void(Json&, const Json&)> add = [&](Json& to, const Json& from) {
    for (auto it = from.begin(); it != from.end(); ++it) {
      if (it->is_number_integer() && to.contains(it.key()) && to[it.key()].is_number_integer()) {
        to[it.key()] = to[it.key()].get<int64_t>() + it->get<int64_t>();
      } else if (it->is_object() && to.contains(it.key()) && to[it.key()].is_object()) {
        add(to[it.key()], *it);
      } else if (!to.contains(it.key())) {
        to[it.key()] = *it;
      }
    }
  };
  for (size_t p = 0; p < parts.size(); p++) {
    for (Json c : parts[p].value("choices", Json::array())) {
      c["index"] = static_cast<int64_t>(p) * n + c.value("index", 0);
      out["choices"].push_back(std::move(c));
    }
    if (p > 0 && parts[p].contains("usage") && out.contains("usage")) add(out["usage"], parts[p]["usage"]);
  }
  return out;
}

void PromptsReply::Done(size_t i, http::Response r) {
  std::vector<Json> bodies;
  http::Response first;
  std::shared_ptr<void> hold;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.at(i) = std::move(r);
    if (--left_ > 0) return;
    hold.swap(hold_);
    for (auto& a : answers_) {
      if (a->status != 200) {  // the first failure, in prompt order, is the answer
        first = std::move(*a);
        break;
      }
      bodies.push_back(Json::parse(a->body, nullptr, false));
    }
    if (bodies.size() == answers_.size()) first = std::move(*answers_[0]);
  }
  hold.reset();  // before the answer: a retry sent right after it is not refused as running
  if (bodies.size() == answers_.size()) first.set_content(Merge(bodies, n_).dump(), "application/json");
  out_->Send(std::move(first));
}

}  // namespace mnemo
