// One request-parsing fuzz input, shared by the libFuzzer target (request_fuzz.cpp) and the gtest
// that replays the seed corpus and mutates it (request_fuzz_test.cpp).
//
// Input: a request body, read as POST /v1/chat/completions, /v1/completions and /v1/responses
// would (server/request_parse.h), for a model with the stories260K vocabulary and, in turn, the
// fallback template and Qwen 2.5's (which renders tools itself). What parses is then rendered to
// tokens as the turn would be (ServedModel::Render): for a response, its first turn.
//
// Property: every body gives a call or an ApiError with a 4xx status, an OpenAI error type and a
// message free of library exception text; nothing crashes or throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_vocab.h"
#include "server/request_parse.h"
#include "server/tools.h"

namespace mnemo::test {

struct FuzzModels {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::unique_ptr<ServedModel>> models;
};

// The models, made once: stories260K's vocabulary with the fallback template and with Qwen 2.5's.
inline FuzzModels& RequestFuzzModels() {
  static FuzzModels* m = [] {
    auto* out = new FuzzModels;
    auto file = gguf::GgufFile::Open(std::string(MNEMO_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
    if (!file.ok()) __builtin_trap();
    auto vocab = gguf::ReadVocab(*file);
    if (!vocab.ok()) __builtin_trap();
    auto tok = Tokenizer::Create(*vocab);
    if (!tok.ok()) __builtin_trap();
    out->tokenizer = std::move(*tok);
    out->models.push_back(std::make_unique<ServedModel>(*out->tokenizer, ChatTemplate::Fallback()));
    std::ifstream f(std::string(MNEMO_CHAT_TEMPLATES_DIR) + "/qwen2.5-instruct.jinja", std::ios::binary);
    auto qwen = ChatTemplate::Create(std::string(std::istreambuf_iterator<char>(f), {}), "", "<|im_end|>");
    if (!qwen.ok()) __builtin_trap();
    out->models.push_back(std::make_unique<ServedModel>(*out->tokenizer, std::move(*qwen)));
    return out;
  }();
  return *m;
}

// A rejection must be a client error in OpenAI's shape, its message written for the client: library
// exception text (nlohmann's "[json.exception.type_error.302] ...", std::stoi's "stoi") that the
// body did not carry itself (messages quote the names of unknown members) means an exception was
// caught and passed on.
inline void CheckRejection(const ApiError& e, const std::string& body) {
  if (e.status < 400 || e.status > 499) __builtin_trap();
  if (e.type != "invalid_request_error" || e.message.empty()) __builtin_trap();
  for (const char* leak : {"json.exception", "basic_string", "stoi", "stod", "stoll", "what()"}) {
    if (e.message.find(leak) != std::string::npos && body.find(leak) == std::string::npos) __builtin_trap();
  }
}

// Renders a parsed turn; a rendering error is a rejection too.
inline void CheckRender(const ServedModel& model, const TurnSpec& spec, const std::string& body) {
  auto toks = model.Render(spec);
  if (auto* e = std::get_if<ApiError>(&toks)) return CheckRejection(*e, body);
  for (int32_t t : std::get<std::vector<int32_t>>(toks)) {
    if (t < 0 || t >= model.tokenizer().n_vocab()) __builtin_trap();
  }
}

// Returns how many of the three endpoints accepted the body. Never crashes on any input.
inline int ExerciseRequest(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  FuzzModels& fm = RequestFuzzModels();
  ServedModel& model = *fm.models[size % fm.models.size()];
  int accepted = 0;

  auto chat = ParseChatCompletion(model, body, "owner");
  if (auto* e = std::get_if<ApiError>(&chat)) {
    CheckRejection(*e, body);
  } else {
    CheckRender(model, std::get<ChatCall>(chat).spec, body);
    accepted++;
  }

  auto completion = ParseCompletion(model, body, "owner");
  if (auto* e = std::get_if<ApiError>(&completion)) {
    CheckRejection(*e, body);
  } else {
    CheckRender(model, std::get<CompletionCall>(completion).spec, body);
    accepted++;
  }

  // No stored items: every reference is unknown (404).
  ItemResolver none = [](const std::string& id, const std::string& param) -> std::variant<nlohmann::json, ApiError> {
    return ApiError{404, "invalid_request_error", "Item not found.", param, "item_not_found"};
  };
  auto response = ParseResponseRequest(model, body, "owner", none);
  if (auto* e = std::get_if<ApiError>(&response)) {
    if (e->status != 404) CheckRejection(*e, body);
  } else {
    // The first turn of a response, as CreateResponse assembles it without a stored history.
    ResponseCall& call = std::get<ResponseCall>(response);
    std::vector<ChatMessage> messages;
    if (call.instructions) {
      messages.push_back(ChatMessage{"system", *call.instructions});
      call.spec.pinned.push_back(false);
    }
    AppendMessages(call.input_items, &messages, &call.spec.pinned);
    if (auto e = CheckToolHistory(&messages, "input")) {
      CheckRejection(*e, body);
    } else {
      PrepareToolMessages(model, &messages);
      call.spec.messages = std::move(messages);
      CheckRender(model, call.spec, body);
      accepted++;
    }
  }
  return accepted;
}

}  // namespace mnemo::test
