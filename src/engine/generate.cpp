#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "sampling/stop.h"

namespace mnemo {
namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Generator::Generator(Model& model, const Tokenizer& tokenizer, DType kv_dtype, int max_context)
    : model_(model),
      tok_(tokenizer),
      max_context_(max_context),
      kv_(model.kv_shape(kv_dtype), BlocksFor(max_context)) {}

Result<GenerateResult> Generator::Generate(const GenerateRequest& req,
                                           const std::function<void(std::string_view)>& on_text) {
  const int n_prompt = static_cast<int>(req.prompt.size());
  const int vocab = model_.config().vocab_size;
  if (n_prompt == 0) return MakeError(StatusCode::kInvalidArgument, "the prompt is empty");
  if (n_prompt >= max_context_) {
    return MakeError(StatusCode::kOutOfRange, "the prompt has %d tokens; the context holds %d", n_prompt, max_context_);
  }
  for (int32_t id : req.prompt) {
    if (id < 0 || id >= vocab) return MakeError(StatusCode::kInvalidArgument, "token id %d is outside the vocabulary [0, %d)", id, vocab);
  }
  if (req.max_tokens < 0) return MakeError(StatusCode::kInvalidArgument, "max_tokens must be >= 0");
  MNEMO_TRY(req.sampling.Validate());
  auto stop = StopMatcher::Create(req.stop);
  if (!stop.ok()) return stop.error();
  auto sampler = Sampler::Create(req.sampling, vocab);
  if (!sampler.ok()) return sampler.error();

  // One sequence over the whole pool, blocks in order.
  std::vector<int32_t> table(BlocksFor(max_context_));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> history = req.prompt;
  std::vector<float> logits;
  GenerateResult out;
  auto step = [&](int from, int to) {
    Batch b;
    std::vector<int32_t> pos(to - from);
    std::iota(pos.begin(), pos.end(), from);
    int i = b.Add(history.data() + from, pos.data(), to - from, false);
    b.seqs[i].block_table.assign(table.begin(), table.begin() + BlocksFor(to));
    b.seqs[i].n_ctx = to;
    model_.Forward(b, kv_, logits);
  };

  double t0 = Now();
  const int chunk = std::max(1, req.prefill_chunk);
  for (int from = 0; from < n_prompt; from += chunk) step(from, std::min(n_prompt, from + chunk));
  double t1 = Now();
  out.prefill_seconds = t1 - t0;

  StreamDecoder decoder(tok_, req.prompt.back());
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    out.text += s;
    if (on_text) on_text(s);
  };
  const int max_new = std::min(req.max_tokens, max_context_ - n_prompt);
  out.finish_reason = FinishReason::kLength;
  for (int g = 0; g < max_new; g++) {
    int32_t id = sampler->Sample(logits, history);
    out.tokens.push_back(id);
    bool is_stop_token = std::find(req.stop_tokens.begin(), req.stop_tokens.end(), id) != req.stop_tokens.end();
    if (is_stop_token || (!req.ignore_eos && tok_.IsEog(id))) {
      out.finish_reason = FinishReason::kStop;
      break;
    }
    auto r = stop->Push(decoder.Push(id));
    emit(r.text);
    if (r.stopped) {
      out.finish_reason = FinishReason::kStop;
      break;
    }
    history.push_back(id);
    if (g + 1 < max_new) step(int(history.size()) - 1, int(history.size()));
  }
  if (!stop->stopped()) {
    auto r = stop->Push(decoder.Flush());
    emit(r.text);
    if (!r.stopped) emit(stop->Flush());
  }
  out.decode_seconds = Now() - t1;
  return out;
}

}  // namespace mnemo
