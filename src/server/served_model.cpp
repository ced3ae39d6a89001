// ServedModel (service.h): rendering a turn's context and the grammar cache.
#include "server/service.h"

namespace mnemo {

namespace {

ApiError Invalid(std::string message, std::string param) {
  return ApiError{400, "invalid_request_error", std::move(message), std::move(param), ""};
}

}  // namespace

ApiResult<std::string> ServedModel::RenderText(const TurnSpec& spec) const {
  if (spec.prompt) return *spec.prompt;
  if (spec.messages.empty()) return Invalid("messages must not be empty", "messages");
  auto r = template_.Render(spec.messages, /*add_generation_prompt=*/true, spec.template_extra.get());
  if (!r.ok()) return Invalid("cannot render the conversation with the model's chat template: " + r.error().message, "messages");
  return std::move(r.value());
}

std::vector<int32_t> ServedModel::Encode(const TurnSpec& spec, const std::string& text) const {
  if (spec.prompt) return tok_.Encode(text, /*add_special=*/true, /*parse_special=*/false);
  // Templates that write the BOS text themselves must not get a second BOS.
  const bool has_bos_text = tok_.bos() >= 0 && text.rfind(tok_.TokenText(tok_.bos()), 0) == 0;
  return tok_.Encode(text, /*add_special=*/!has_bos_text, /*parse_special=*/true);
}

ApiResult<std::vector<int32_t>> ServedModel::Render(const TurnSpec& spec) const {
  auto text = RenderText(spec);
  if (auto* err = std::get_if<ApiError>(&text)) return *err;
  return Encode(spec, std::get<std::string>(text));
}

Result<std::shared_ptr<grammar::Automaton>> ServedModel::Grammar(const std::string& text) {
  grammar::GrammarCache* cache;
  {
    std::lock_guard<std::mutex> lock(grammar_mu_);
    if (!grammars_) grammars_ = std::make_unique<grammar::GrammarCache>(grammar::TokenIndex::Build(tok_));
    cache = grammars_.get();
  }
  return cache->Get(text);
}

}  // namespace mnemo
