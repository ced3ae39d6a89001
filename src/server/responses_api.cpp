// The stateful APIs: /v1/responses (previous_response_id, store, conversation, truncation,
// streaming events) and /v1/conversations with their items.
#include <algorithm>
#include <cctype>
#include <functional>
#include <set>

#include "server/api_server.h"
#include "server/http_util.h"
#include "server/logprobs_json.h"
#include "server/request_parse.h"
#include "server/tools.h"

namespace mnemo {

using http::Json;

namespace {

constexpr int kMaxChain = 10000;  // previous_response_id hops followed at most

Json OutputItem(const std::string& id, const std::string& text, const std::string& status) {
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"},
          {"content", Json::array({{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}}})}};
}

// The id of call k's output item: fc_<r> (fc_<r>-<k> after the first) for message msg_<r>.
std::string FunctionCallId(const std::string& msg_id, size_t k) {
  std::string id = "fc_" + msg_id.substr(msg_id.find('_') + 1);
  if (k > 0) id += "-" + std::to_string(k);
  return id;
}

Json FunctionCallItem(const std::string& msg_id, size_t k, const ChatToolCall& c, const std::string& status = "completed") {
  return {{"type", "function_call"}, {"id", FunctionCallId(msg_id, k)}, {"call_id", c.id}, {"name", c.name},
          {"arguments", c.arguments}, {"status", status}};
}

// The request's `text` as the response reports it: its format ({type: text} by default).
Json TextFormat(const Json& request) {
  Json text = {{"format", {{"type", "text"}}}};
  if (request.contains("text") && request["text"].is_object()) {
    const Json& t = request["text"];
    if (t.contains("format") && t["format"].is_object()) text["format"] = t["format"];
    if (t.contains("verbosity") && t["verbosity"].is_string()) text["verbosity"] = t["verbosity"];
  }
  return text;
}

// The response object as the API returns it.
Json ResponseObject(const StoredResponse& r, const Json& request, const Json& output, const Json& usage) {
  Json j = {{"id", r.id},
            {"object", "response"},
            {"created_at", static_cast<int64_t>(r.created_at)},
            {"status", r.status},
            {"error", nullptr},
            {"incomplete_details", r.status == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr)},
            {"instructions", http::ValueOr(request, "instructions", nullptr)},
            {"max_output_tokens", http::ValueOr(request, "max_output_tokens", nullptr)},
            {"model", r.model},
            {"output", output},
            {"parallel_tool_calls", http::ValueOr(request, "parallel_tool_calls", true)},
            {"previous_response_id", r.previous_response_id ? Json(*r.previous_response_id) : Json(nullptr)},
            {"store", http::BoolOr(request, "store", true)},
            {"temperature", http::ValueOr(request, "temperature", 1.0)},
            {"top_p", http::ValueOr(request, "top_p", 1.0)},
            {"text", TextFormat(request)},
            {"tool_choice", http::ValueOr(request, "tool_choice", "auto")},
            {"tools", http::ValueOr(request, "tools", Json::array())},
            {"truncation", http::ValueOr(request, "truncation", "disabled")},
            {"usage", usage},
            {"metadata", http::ValueOr(request, "metadata", Json::object())}};
  if (r.conversation_id) j["conversation"] = {{"id", *r.conversation_id}};
  std::string text;
  for (const auto& it : output) {
    if (!it.is_object() || http::Absent(it, "content") || !it["content"].is_array()) continue;
    for (const auto& part : it["content"]) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) text += part["text"].get<std::string>();
    }
  }
  j["output_text"] = text;
  return j;
}

Json ConversationObject(const StoredConversation& c) {
  return {{"id", c.id}, {"object", "conversation"}, {"created_at", static_cast<int64_t>(c.created_at)},
          {"metadata", Json::parse(c.metadata_json, nullptr, false)}};
}

Json ItemObject(const StoredItem& it) {
  Json j = Json::parse(it.item_json, nullptr, false);
  if (!j.is_object()) j = Json::object();
  j["id"] = it.id;
  return j;
}

ApiError StoreFailure(const Error& e) { return ToApiError(e, "store: "); }

}  // namespace

void ApiServer::CreateResponse(const Req& req, Res& res, const std::string& owner) { RunResponse(req, res, owner, false); }

// POST /v1/responses/input_tokens: the request's prompt rendered as a turn would render it
// (instructions, the chain or conversation, tools), counted; nothing generated, locked or stored.
void ApiServer::CountResponseTokens(const Req& req, Res& res, const std::string& owner) {
  RunResponse(req, res, owner, true);
}

void ApiServer::RunResponse(const Req& req, Res& res, const std::string& owner, bool count_only) {
  Ticket ticket;
  if (!count_only) {
    auto begun = BeginRequest(req, res, owner, "/v1/responses");
    if (!begun) return;  // answered: a retry of a request that ran, or a refused request id
    ticket = std::move(*begun);
  }
  Store* store = service_.store();
  // An output item's id names its response (msg_<r> is in resp_<r>, see msg_id below): a reference
  // to it is one primary-key lookup, owner-checked, whatever the number of stored responses.
  ItemResolver resolve = [store, &owner](const std::string& id, const std::string& p) -> std::variant<Json, ApiError> {
    ApiError missing{404, "invalid_request_error", "Item with id '" + id.substr(0, 80) + "' not found.", p,
                     "item_not_found"};
    // Function calls are fc_<r> and fc_<r>-<k> (output_item below).
    const size_t cut = id.find('_');
    if (cut == std::string::npos || (id.compare(0, cut, "msg") != 0 && id.compare(0, cut, "fc") != 0) || !store) return missing;
    auto r = store->GetResponse("resp_" + id.substr(cut + 1, id.find('-') == std::string::npos ? std::string::npos : id.find('-') - cut - 1), owner);
    if (!r.ok()) return StoreFailure(r.error());
    if (!r->has_value()) return missing;
    Json output = Json::parse((*r)->output_json, nullptr, false);
    if (!output.is_array()) return missing;
    for (const Json& item : output) {
      if (!item.is_object() || http::ValueOr(item, "id", "") != id) continue;
      Json copy = item;
      copy.erase("status");  // stored as an input item: a message with its content parts
      return copy;
    }
    return missing;
  };
  auto parsed = ParseResponseRequest(service_, req.body, owner, resolve);
  if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
  ResponseCall& call = std::get<ResponseCall>(parsed);
  const Json& body = call.body;
  const Json& input_items = call.input_items;
  TurnSpec& spec = call.spec;
  const std::optional<std::string>& instructions = call.instructions;
  const std::shared_ptr<ToolRequest> tools = call.tools;
  const std::optional<std::string>& prev_id = call.previous_response_id;
  const std::optional<std::string>& conv_id = call.conversation_id;
  const std::string& truncation = call.truncation;
  const bool store_it = call.store;
  const bool stream = call.stream;
  std::vector<ChatMessage> history;
  std::vector<bool> history_pins;
  // The fast path: the previous response is the latest turn of its live session, which holds the
  // chain's whole history: only the new turn is rendered (Service::StartAfterResponse).
  std::optional<ApiResult<StartedTurn>> started;
  if (prev_id && truncation == "disabled" && !count_only) {
    TurnSpec fast = spec;
    std::vector<bool> pins;
    AppendMessages(input_items, &fast.messages, &pins);
    // Results must answer calls: the fast path sees only the new items and the previous
    // response's calls (one lookup); a result answering an older call takes the whole-chain path.
    bool answered = true;
    for (const ChatMessage& m : fast.messages) answered = answered && m.role != "tool";
    if (!answered) {
      auto r = store->GetResponse(*prev_id, owner);
      std::vector<ChatMessage> known;
      std::vector<bool> known_pins;
      if (r.ok() && r->has_value()) AppendMessages(Json::parse((*r)->output_json, nullptr, false), &known, &known_pins);
      const size_t n_known = known.size();
      known.insert(known.end(), fast.messages.begin(), fast.messages.end());
      answered = !CheckToolHistory(&known, "input").has_value();
      fast.messages.assign(known.begin() + static_cast<std::ptrdiff_t>(n_known), known.end());
    }
    PrepareToolMessages(service_, &fast.messages);
    if (answered) started = service_.StartAfterResponse(std::move(fast), *prev_id);
  }
  if (prev_id && !started) {
    // One query for the whole chain; it ends where an older link was deleted (the history starts there).
    auto links = store->GetResponseChain(*prev_id, owner, kMaxChain);
    if (!links.ok()) return http::SendError(res, StoreFailure(links.error()));
    const std::vector<ResponseLink>& chain = *links;
    // OpenAI's answer, word for word: agent clients (Codex and its proxies) match this code to
    // resend the whole history instead (a response stored with store: false, deleted, or another
    // key's is not found either).
    if (chain.empty()) {
      return http::SendError(res, http::BadRequest("Previous response with id '" + *prev_id + "' not found.",
                                                   "previous_response_id", "previous_response_not_found"));
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      AppendMessages(Json::parse(it->input_items_json, nullptr, false), &history, &history_pins);
      AppendMessages(Json::parse(it->output_json, nullptr, false), &history, &history_pins);
    }
    if (chain.front().session_id) {
      spec.hint.session = *chain.front().session_id;
      spec.hint.end_token = chain.front().end_token;
    }
  }
  std::optional<StoredConversation> conv;
  if (conv_id) {
    // A conversation is append-only: its turns continue one another, never fork. Another turn (on
    // another replica, or another request here) may be running on it, holding its session's turn
    // lock until its commit: the lock is taken before the items are read, and the conversation
    // read again under it, so a turn that waited reads the other turn's items and continues after
    // them. Before its first turn commits a conversation has no session: its first turns take the
    // conversation's own lock, so that only one of them starts it. (A conversation that moved to
    // another session meanwhile: that one's lock, a few times at most; past that the commit's
    // compare-and-set still guards the session.)
    for (int attempt = 0;; attempt++) {
      auto c = store->GetConversation(*conv_id, owner);
      if (!c.ok()) return http::SendError(res, StoreFailure(c.error()));
      if (!c->has_value()) return http::SendError(res, http::NotFound("Conversation with id '" + *conv_id + "' not found."));
      conv = **c;
      if (count_only) break;  // counting takes no lock: the items as they are now
      const int64_t lock_id = conv->session_id ? *conv->session_id : ConversationLockId(*conv_id);
      if ((spec.lock && spec.lock->id() == lock_id) || attempt == 3) break;
      spec.lock.reset();  // releases the lock it read the conversation under before
      auto l = service_.LockStored(lock_id);
      if (auto* e = std::get_if<ApiError>(&l)) return http::SendError(res, *e);
      spec.lock = std::move(std::get<std::shared_ptr<TurnLock>>(l));
      if (!spec.lock) break;  // no lock to take: the conversation just read is the one to continue
    }
    // Client-chosen item ids are checked before any token is generated (a collision found only at
    // the commit would waste the turn). Ids are scoped to the conversation, so this reveals
    // nothing about other conversations or owners.
    std::set<std::string> seen;
    for (size_t i = 0; i < input_items.size(); i++) {
      const std::string& id = input_items[i]["id"].get_ref<const std::string&>();
      bool taken = !seen.insert(id).second;
      if (!taken) {
        auto got = store->GetConversationItem(*conv_id, owner, id);
        if (!got.ok()) return http::SendError(res, StoreFailure(got.error()));
        taken = got->has_value();
      }
      if (taken) {
        const std::string p = "input[" + std::to_string(i) + "].id";
        return http::SendError(res, ApiError{409, "invalid_request_error",
                                             "The conversation already has an item with id '" + id + "'.", p,
                                             "already_exists"});
      }
    }
    ListOptions lo;
    lo.limit = 10000;
    for (;;) {
      auto page = store->ListConversationItems(*conv_id, owner, lo);
      if (!page.ok()) return http::SendError(res, StoreFailure(page.error()));
      if (!page->has_value()) break;
      for (const auto& it : (*page)->items) AppendMessages(Json::array({ItemObject(it)}), &history, &history_pins);
      if (!(*page)->has_more || (*page)->items.empty()) break;
      lo.after = (*page)->items.back().id;
    }
    if (conv->session_id && conv->end_token) {
      spec.hint.session = *conv->session_id;
      spec.hint.end_token = *conv->end_token;
    }
  }
  std::vector<ChatMessage> messages;
  if (instructions) {
    messages.push_back(ChatMessage{"system", *instructions});
    spec.pinned.push_back(false);
  }
  // The stored session ended with the latest reply of the history: the turn continues after it.
  if (spec.hint.session >= 0) {
    for (size_t i = history.size(); i-- > 0;) {
      if (history[i].role != "assistant") continue;
      spec.hint.reply_message = static_cast<int>(messages.size() + i);
      break;
    }
  }
  messages.insert(messages.end(), history.begin(), history.end());
  spec.pinned.insert(spec.pinned.end(), history_pins.begin(), history_pins.end());
  AppendMessages(input_items, &messages, &spec.pinned);
  if (!started) {
    if (auto e = CheckToolHistory(&messages, "input")) return http::SendError(res, *e);
    PrepareToolMessages(service_, &messages);
  }
  spec.messages = std::move(messages);
  if (count_only) {
    auto toks = service_.Render(spec);
    if (auto* e = std::get_if<ApiError>(&toks)) return http::SendError(res, *e);
    return http::SendJson(res, Json{{"object", "response.input_tokens"}, {"input_tokens", std::get<0>(toks).size()}});
  }
  // truncation "auto": a context longer than the model's keeps the turns selective context picks.
  if (!started && truncation == "auto" && spec.context.budget <= 0) {
    auto toks = service_.Render(spec);
    if (auto* e = std::get_if<ApiError>(&toks)) return http::SendError(res, *e);
    const int max_ctx = service_.engine().max_context();
    if (static_cast<int>(std::get<0>(toks).size()) >= max_ctx) spec.context.budget = std::max(1, max_ctx * 3 / 4);
  }
  std::shared_ptr<TurnLock> conv_lock = spec.lock;
  if (!started) started = service_.Start(spec);
  if (auto* e = std::get_if<ApiError>(&*started)) return http::SendError(res, *e);
  StartedTurn t = std::get<StartedTurn>(*started);
  // A conversation's turn holds its lock to the commit, also when it did not continue the session
  // (a fork): the next turn must read this one's items.
  if (!t.lock) t.lock = std::move(conv_lock);
  if (t.context.applied) metrics_.ContextSelection(t.context.dropped_tokens);
  if (t.windowed) metrics_.WindowedTurn();

  StoredResponse sr;
  // The routing key: the chain's (previous response or conversation), else the front's header.
  std::string key = AffinityKeyOf(prev_id ? *prev_id : conv_id ? *conv_id : std::string());
  if (key.empty()) key = SanitizeAffinityKey(req.get_header_value("X-Mnemo-Affinity"));
  sr.id = NewId("resp_", key);
  sr.owner = owner;
  sr.created_at = static_cast<double>(http::UnixSeconds());
  sr.model = service_.config().model_name;
  sr.status = "in_progress";
  sr.previous_response_id = prev_id;
  sr.conversation_id = conv_id;
  sr.request_json = body.dump();
  sr.input_items_json = input_items.dump();
  const std::string msg_id = "msg_" + sr.id.substr(sr.id.find('_') + 1);  // see `resolve` above
  // Logprobs (include "message.output_text.logprobs"): of the tokens generated so far; reported on
  // the output_text part of the response returned (not stored: GET gives the text alone).
  const bool logprobs = spec.request.logprobs >= 0;
  auto lps = std::make_shared<std::vector<PositionLogprobs>>();
  const Tokenizer* tok = &service_.tokenizer();

  // Another attempt of this request (X-Mnemo-Request-Id) committed first: its answer, sent instead
  // (not streamed: a stream already told its own ids).
  auto replayed = std::make_shared<std::optional<http::Response>>();
  // Where the conversation pointed when its items were read: the commit stores the turn only if it
  // still does (ConversationUpdate::expected).
  std::optional<ConversationPointer> conv_at;
  if (conv) conv_at = ConversationPointer{conv->session_id, conv->end_token};
  // Finishes the response: commits the turn, the response row, conversation items and the
  // request's record (its answer: the response object) at once.
  // given: the reply as a stream already split it into content and calls (else parsed from r).
  auto finish = [this, t, sr, input_items, msg_id, store_it, conv_id, conv_at, owner, tools, logprobs, lps, tok, ticket,
                 replayed, stream](const TurnResult& r,
                                                                                    std::optional<ToolReply> given = std::nullopt) mutable
      -> std::variant<Json, ApiError> {
    metrics_.Turn(r);
    if (r.finish_reason == FinishReason::kError) {
      service_.Commit(t, r, std::nullopt, std::nullopt, owner);  // discards the turn, frees its session
      if (ticket) ticket->Release();  // nothing recorded: a retry runs
      return ToApiError(r.error);
    }
    sr.status = r.finish_reason == FinishReason::kLength ? "incomplete" : "completed";
    const ToolReply reply = given ? std::move(*given) : ExtractToolCalls(service_, *tools, r);
    Json output = Json::array();
    if (reply.calls.empty() || !reply.content.empty()) {
      output.push_back(OutputItem(msg_id, reply.content, sr.status == "completed" ? "completed" : "incomplete"));
    }
    for (size_t k = 0; k < reply.calls.size(); k++) output.push_back(FunctionCallItem(msg_id, k, reply.calls[k]));
    Json usage = http::ResponsesUsage(r);
    sr.output_json = output.dump();
    sr.usage_json = usage.dump();
    std::optional<StoredResponse> row;
    if (store_it) row = sr;
    std::optional<ConversationUpdate> cu;
    if (conv_id) {
      cu = ConversationUpdate{};
      cu->conversation_id = *conv_id;
      cu->expected = conv_at;
      for (const auto& it : input_items) cu->items.push_back(NewItem{it["id"], it.dump()});
      for (const auto& it : output) cu->items.push_back(NewItem{it["id"], it.dump()});
    }
    Json obj = ResponseObject(sr, Json::parse(sr.request_json), output, usage);
    if (logprobs) {
      for (Json& item : obj["output"]) {
        if (item["type"] == "message") item["content"][0]["logprobs"] = http::ResponsesLogprobs(*tok, *lps);
      }
    }
    if (t.context.applied) obj["mnemo_context"] = http::ContextJson(t.context);
    std::optional<StoredRequest> record;
    if (ticket) record = ticket->Record(200, obj.dump());
    auto c = service_.Commit(t, r, std::move(row), std::move(cu), owner, std::move(record));
    if (ticket) ticket->Release();  // a retry from now on finds the record (or runs)
    if (auto* e = std::get_if<ApiError>(&c)) {
      if (!stream) *replayed = ReplayCommitted(ticket);
      return *e;
    }
    return obj;
  };

  auto reply = res.Defer();
  if (!stream) {
    return DriveTurn(t.handle, [=, this]() mutable -> bool {
      TurnEvent ev;
      while (t.handle->TryNext(&ev)) {
        if (ev.kind != TurnEvent::kDone) {
          if (ev.logprobs) lps->push_back(std::move(*ev.logprobs));
          continue;
        }
        auto out = finish(ev.result);
        if (*replayed) {
          reply->Send(std::move(**replayed));
        } else if (auto* e = std::get_if<ApiError>(&out)) {
          reply->Send(http::ErrorResponse(*e));
        } else {
          reply->Send(http::JsonResponse(std::get<Json>(out)));
        }
        return true;
      }
      return false;
    });
  }
  // A stream commits to status 200 with its head, so the head waits for the turn's admission.
  std::shared_ptr<TurnHandle> handle = t.handle;
  reply->OnClose([handle] { handle->Cancel(); });  // the client went away: stop generating
  struct StreamState {
    bool head = false;
    bool alive = true;
    int seq = 0;
    bool message_open = false;
    std::optional<ToolHold> hold;  // across the steps of one stream
    bool forced = false;           // required / a named tool: the reply is calls, streamed as they come
    std::optional<CallStream> calls;
    size_t lp_sent = 0;  // lps' entries that went out with a delta
  };
  auto state = std::make_shared<StreamState>();
  state->hold.emplace(service_, *tools);
  state->forced = tools->choice == ToolChoice::kRequired || tools->choice == ToolChoice::kNamed;
  state->calls.emplace(DetectToolFormat(service_.chat_template()));
  DriveTurn(t.handle, [=, this]() mutable -> bool {
    int& seq = state->seq;
    bool& alive = state->alive;
    auto emit = [&](const std::string& type, Json j) {
      j["type"] = type;
      j["sequence_number"] = seq++;
      if (alive) alive = reply->Write(http::SseEvent(type, j));
    };
    // The message item opens with its first text; with tools the reply is held while it may be a
    // call (ToolHold), and calls become function_call items after it.
    bool& message_open = state->message_open;
    auto open_message = [&] {
      if (message_open) return;
      message_open = true;
      // The item opens with no parts, as OpenAI's: the part follows in content_part.added (the
      // openai package's stream accumulator appends it, so a part here made its snapshot two).
      Json opened = OutputItem(msg_id, "", "in_progress");
      opened["content"] = Json::array();
      emit("response.output_item.added", {{"output_index", 0}, {"item", std::move(opened)}});
      emit("response.content_part.added", {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0},
                                           {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}}});
    };
    // A delta carries the logprobs of the tokens its text came from (those not sent before).
    auto text_delta = [&](const std::string& text) {
      open_message();
      Json lj = Json::array();
      if (logprobs) {
        lj = http::ResponsesLogprobs(*tok, std::span<const PositionLogprobs>(*lps).subspan(state->lp_sent));
        state->lp_sent = lps->size();
      }
      emit("response.output_text.delta", {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0},
                                          {"delta", text}, {"logprobs", std::move(lj)}});
    };
    ToolHold& hold = *state->hold;
    if (!state->head) {
      const StreamOpen open = OpenStream(t, owner, *reply, &alive);
      if (open == StreamOpen::kLater) return false;
      if (open == StreamOpen::kFailed) return true;
      state->head = true;
      Json pending = ResponseObject(sr, Json::parse(sr.request_json), Json::array(), nullptr);
      emit("response.created", {{"response", pending}});
      emit("response.in_progress", {{"response", pending}});
      if (!tools->parse()) open_message();
    }
    TurnEvent ev;
    while (t.handle->TryNext(&ev)) {
      if (ev.kind == TurnEvent::kText) {
        if (ev.logprobs) lps->push_back(std::move(*ev.logprobs));
        if (state->forced) {
          // As OpenAI streams a call: the item with empty arguments once its name is known, then
          // the arguments as they are generated.
          for (const Json& d : state->calls->Feed(ev.text)) {
            const size_t k = d["index"];
            const ChatToolCall& c = state->calls->begun()[k];
            if (d.contains("id")) {
              emit("response.output_item.added", {{"output_index", k}, {"item", FunctionCallItem(msg_id, k, c, "in_progress")}});
            } else {
              emit("response.function_call_arguments.delta", {{"item_id", FunctionCallId(msg_id, k)}, {"output_index", k},
                                                              {"delta", d["function"]["arguments"]}});
            }
          }
        } else {
          const std::string out = hold.Feed(ev.token, ev.text);
          if (!out.empty()) text_delta(out);
        }
        if (!alive) t.handle->Cancel();
        continue;
      }
      // The reply as streamed: under auto, the content sent and held plus the calls at the end;
      // forced, the calls with the ids their events carried.
      std::optional<ToolReply> given;
      std::string unsent;  // content not streamed yet
      if (state->forced) {
        given = ExtractToolCalls(service_, *tools, ev.result);
        const std::vector<ChatToolCall>& begun = state->calls->begun();
        for (size_t k = 0; k < given->calls.size() && k < begun.size(); ++k) given->calls[k].id = begun[k].id;
      } else if (tools->parse()) {
        ToolReply tail = hold.End();
        unsent = tail.content;
        given = ToolReply{hold.released() + tail.content, std::move(tail.calls)};
      }
      auto out = finish(ev.result, std::move(given));  // durable before the final events
      if (!alive) {
        reply->End();
        return true;
      }
      if (auto* e = std::get_if<ApiError>(&out)) {
        emit("error", {{"code", e->code}, {"message", e->message}, {"param", nullptr}});
      } else {
        const Json& resp = std::get<Json>(out);
        size_t index = 0;
        for (const Json& item : resp["output"]) {
          if (item["type"] == "message") {
            const std::string text = item["content"][0]["text"];
            if (!unsent.empty()) text_delta(unsent);
            open_message();
            emit("response.output_text.done", {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0},
                                               {"text", text}, {"logprobs", http::ValueOr(item["content"][0], "logprobs", Json::array())}});
            emit("response.content_part.done", {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0},
                                                {"part", item["content"][0]}});
            emit("response.output_item.done", {{"output_index", 0}, {"item", item}});
          } else {
            // As OpenAI streams a call: the item with empty arguments, the arguments in pieces, done
            // (forced, the first two went out as the call was generated).
            if (!state->forced) {
              Json added = item;
              added["arguments"] = "";
              added["status"] = "in_progress";
              emit("response.output_item.added", {{"output_index", index}, {"item", added}});
              for (const std::string& piece : Utf8Pieces(item["arguments"], 16)) {
                emit("response.function_call_arguments.delta", {{"item_id", item["id"]}, {"output_index", index}, {"delta", piece}});
              }
            }
            emit("response.function_call_arguments.done", {{"item_id", item["id"]}, {"output_index", index}, {"arguments", item["arguments"]}});
            emit("response.output_item.done", {{"output_index", index}, {"item", item}});
          }
          index++;
        }
        emit(resp["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", resp}});
      }
      reply->End();
      return true;
    }
    return false;
  });
}

void ApiServer::GetResponse(const Req& req, Res& res, const std::string& owner) {
  auto r = service_.store()->GetResponse(req.matches[1], owner);
  if (!r.ok()) return http::SendError(res, StoreFailure(r.error()));
  if (!r->has_value()) return http::SendError(res, http::NotFound("Response with id '" + std::string(req.matches[1]) + "' not found."));
  // OpenAI streams a stored response's events for background responses only; answering JSON to a
  // client that reads events left the openai package's retrieve({stream: true}) empty, silently.
  if (req.has_param("stream") && req.get_param_value("stream") == "true") {
    return http::SendError(res, http::BadRequest("Only background responses can be streamed again, and mnemo runs "
                                                 "none (background: true is refused); GET the response without stream",
                                                 "stream", "unsupported_value"));
  }
  const StoredResponse& sr = **r;
  http::SendJson(res, ResponseObject(sr, Json::parse(sr.request_json, nullptr, false), Json::parse(sr.output_json, nullptr, false),
                                     Json::parse(sr.usage_json, nullptr, false)));
}

// POST /v1/responses/{id}/cancel: OpenAI cancels background responses only, and every response
// here ran in the foreground (a stream is cancelled by closing it).
void ApiServer::CancelResponse(const Req& req, Res& res, const std::string& owner) {
  auto r = service_.store()->GetResponse(req.matches[1], owner);
  if (!r.ok()) return http::SendError(res, StoreFailure(r.error()));
  if (!r->has_value()) return http::SendError(res, http::NotFound("Response with id '" + std::string(req.matches[1]) + "' not found."));
  http::SendError(res, http::BadRequest("Only background responses can be cancelled, and mnemo runs none (background: "
                                        "true is refused); a streamed response is cancelled by closing its stream",
                                        "", "unsupported_value"));
}

void ApiServer::DeleteResponse(const Req& req, Res& res, const std::string& owner) {
  auto r = service_.store()->DeleteResponse(req.matches[1], owner);
  if (!r.ok()) return http::SendError(res, StoreFailure(r.error()));
  if (!*r) return http::SendError(res, http::NotFound("Response with id '" + std::string(req.matches[1]) + "' not found."));
  service_.ForgetResponses(owner);  // chains through it now end there
  http::SendJson(res, {{"id", std::string(req.matches[1])}, {"object", "response.deleted"}, {"deleted", true}});
}

namespace {
std::variant<ListOptions, ApiError> ListParams(const http::Request& req) {
  ListOptions lo;
  lo.ascending = false;  // OpenAI lists conversation items and input items newest first by default
  if (req.has_param("limit")) {
    try {
      lo.limit = std::stoi(req.get_param_value("limit"));
    } catch (...) {
      return http::BadRequest("'limit' must be an integer", "limit", "invalid_type");
    }
    if (lo.limit < 1 || lo.limit > 100) return http::BadRequest("'limit' must be between 1 and 100", "limit", "invalid_value");
  }
  if (req.has_param("order")) {
    std::string o = req.get_param_value("order");
    if (o != "asc" && o != "desc") return http::BadRequest("'order' must be 'asc' or 'desc'", "order", "invalid_value");
    lo.ascending = o == "asc";
  }
  if (req.has_param("after")) lo.after = req.get_param_value("after");
  return lo;
}

Json ListObject(const ItemPage& page) {
  Json data = Json::array();
  for (const auto& it : page.items) data.push_back(ItemObject(it));
  return {{"object", "list"}, {"data", data},
          {"first_id", page.items.empty() ? Json(nullptr) : Json(page.items.front().id)},
          {"last_id", page.items.empty() ? Json(nullptr) : Json(page.items.back().id)},
          {"has_more", page.has_more}};
}
}  // namespace

void ApiServer::ListInputItems(const Req& req, Res& res, const std::string& owner) {
  auto lo = ListParams(req);
  if (auto* e = std::get_if<ApiError>(&lo)) return http::SendError(res, *e);
  auto page = service_.store()->ListInputItems(req.matches[1], owner, std::get<ListOptions>(lo));
  if (!page.ok()) return http::SendError(res, ToApiError(page.error(), "", "after"));
  if (!page->has_value()) return http::SendError(res, http::NotFound("Response with id '" + std::string(req.matches[1]) + "' not found."));
  http::SendJson(res, ListObject(**page));
}

void ApiServer::Conversations(const Req& req, Res& res, const std::string& owner) {
  Store& store = *service_.store();
  const std::string conv = req.matches.size() > 1 ? std::string(req.matches[1]) : "";
  const std::string item = req.matches.size() > 3 ? std::string(req.matches[3]) : "";
  const bool items_path = req.matches.size() > 2 && req.matches[2].length() > 0;
  auto not_found = [&] { http::SendError(res, http::NotFound("Conversation with id '" + conv + "' not found.")); };
  auto parse_items = [&](const Json& body, std::vector<NewItem>* out) -> std::optional<ApiError> {
    if (http::Absent(body, "items")) return std::nullopt;
    auto v = InputItems(body["items"], "items");
    if (auto* e = std::get_if<ApiError>(&v)) return *e;
    for (const auto& it : std::get<Json>(v)) out->push_back(NewItem{it["id"], it.dump()});
    return std::nullopt;
  };
  if (conv.empty()) {  // POST /v1/conversations
    auto parsed = http::ParseBody(req.body.empty() ? "{}" : req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
    const Json& body = std::get<Json>(parsed);
    if (auto e = http::CheckFields(body, {{"items", http::kArray}, {"metadata", http::kObject}})) return http::SendError(res, *e);
    StoredConversation c;
    c.owner = owner;
    if (!http::Absent(body, "metadata")) {
      if (auto e = CheckMetadata(body["metadata"])) return http::SendError(res, *e);
      c.metadata_json = body["metadata"].dump();
    }
    std::vector<NewItem> items;
    if (auto e = parse_items(body, &items)) return http::SendError(res, *e);
    c.id = NewId("conv_", SanitizeAffinityKey(req.get_header_value("X-Mnemo-Affinity")));
    auto created = store.CreateConversation(c, items);
    if (!created.ok()) return http::SendError(res, StoreFailure(created.error()));
    return http::SendJson(res, ConversationObject(*created));
  }
  if (!items_path) {
    if (req.method == "GET") {
      auto c = store.GetConversation(conv, owner);
      if (!c.ok()) return http::SendError(res, StoreFailure(c.error()));
      if (!c->has_value()) return not_found();
      return http::SendJson(res, ConversationObject(**c));
    }
    if (req.method == "DELETE") {
      auto d = store.DeleteConversation(conv, owner);
      if (!d.ok()) return http::SendError(res, StoreFailure(d.error()));
      if (!*d) return not_found();
      return http::SendJson(res, {{"id", conv}, {"object", "conversation.deleted"}, {"deleted", true}});
    }
    auto parsed = http::ParseBody(req.body);  // POST: update metadata
    if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
    const Json& body = std::get<Json>(parsed);
    if (auto e = http::CheckFields(body, {{"metadata", http::kObject}})) return http::SendError(res, *e);
    if (http::Absent(body, "metadata")) return http::SendError(res, http::BadRequest("Missing required parameter: 'metadata'.", "metadata", "missing_required_parameter"));
    if (auto e = CheckMetadata(body["metadata"])) return http::SendError(res, *e);
    auto u = store.UpdateConversationMetadata(conv, owner, body["metadata"].dump());
    if (!u.ok()) return http::SendError(res, StoreFailure(u.error()));
    if (!*u) return not_found();
    auto c = store.GetConversation(conv, owner);
    if (!c.ok() || !c->has_value()) return not_found();
    return http::SendJson(res, ConversationObject(**c));
  }
  if (item.empty()) {
    if (req.method == "GET") {
      auto lo = ListParams(req);
      if (auto* e = std::get_if<ApiError>(&lo)) return http::SendError(res, *e);
      auto page = store.ListConversationItems(conv, owner, std::get<ListOptions>(lo));
      if (!page.ok()) return http::SendError(res, ToApiError(page.error(), "", "after"));
      if (!page->has_value()) return not_found();
      return http::SendJson(res, ListObject(**page));
    }
    auto parsed = http::ParseBody(req.body);  // POST: add items
    if (auto* e = std::get_if<ApiError>(&parsed)) return http::SendError(res, *e);
    const Json& body = std::get<Json>(parsed);
    if (auto e = http::CheckFields(body, {{"items", http::kArray}})) return http::SendError(res, *e);
    std::vector<NewItem> items;
    if (auto e = parse_items(body, &items)) return http::SendError(res, *e);
    if (items.empty()) return http::SendError(res, http::BadRequest("'items' must be a non-empty array", "items", "invalid_value"));
    auto ids = store.AddConversationItems(conv, owner, items);
    if (!ids.ok()) return http::SendError(res, StoreFailure(ids.error()));
    if (!ids->has_value()) return not_found();
    ItemPage page;
    for (size_t i = 0; i < items.size(); i++) page.items.push_back(StoredItem{(**ids)[i], 0, items[i].item_json, 0});
    return http::SendJson(res, ListObject(page));
  }
  if (req.method == "GET") {
    auto it = store.GetConversationItem(conv, owner, item);
    if (!it.ok()) return http::SendError(res, StoreFailure(it.error()));
    if (!it->has_value()) return http::SendError(res, http::NotFound("Item with id '" + item + "' not found."));
    return http::SendJson(res, ItemObject(**it));
  }
  auto d = store.DeleteConversationItem(conv, owner, item);  // DELETE: returns the conversation
  if (!d.ok()) return http::SendError(res, StoreFailure(d.error()));
  if (!*d) return http::SendError(res, http::NotFound("Item with id '" + item + "' not found."));
  auto c = store.GetConversation(conv, owner);
  if (!c.ok() || !c->has_value()) return not_found();
  http::SendJson(res, ConversationObject(**c));
}

}  // namespace mnemo
