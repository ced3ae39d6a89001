// Stop strings over streamed text, with OpenAI's semantics: generation ends at the first stop
// string, which is not emitted, and neither is anything after it.
//
// Text arrives in pieces (one per token) that may split a stop string, or a UTF-8 character,
// anywhere. Push() emits what can no longer turn out to be part of a stop string and holds back
// the rest: the longest suffix that is a proper prefix of some stop string, or an incomplete
// trailing UTF-8 sequence, whichever is longer. The emitted text never depends on how the stream
// was cut into pieces.
//
// When several stop strings occur, the one that completes first (smallest end offset) wins; on a
// tie the longest (earliest start) wins. So stops {"abcd", "bc"} on "abcd" stop at "a".
//
// A CallStart lifts the stops where a tool call begins (tools under auto): from a call opener on
// the text passes through unmatched, so that a stop such as "\n" cannot cut the call's syntax.
// A stop string that ends before the opener completes still stops there.
//
// Threading: owned by one request, one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mnemo {

// Where a tool call begins in a reply: stop strings do not apply from there on.
struct CallStart {
  std::vector<std::string> anywhere;  // opens a call wherever it occurs ("<tool_call>")
  std::vector<std::string> at_start;  // opens a call as the reply's first non-whitespace text ("{")
  bool control_token = false;         // a control token that does not end generation opens a call
};

class StopMatcher {
 public:
  static constexpr size_t kMaxStops = 4;  // OpenAI's limit on `stop`

  // Checks a request's stop list: at most kMaxStops strings, none empty.
  static Status Validate(const std::vector<std::string>& stops);
  static Result<StopMatcher> Create(std::vector<std::string> stops);
  // `stops` must pass Validate() (checked). No stops: text passes through (UTF-8 hold-back only).
  explicit StopMatcher(std::vector<std::string> stops, CallStart call_start = {});

  struct Output {
    std::string text;      // safe to emit now; may be empty
    bool stopped = false;  // a stop string was hit: `text` is the last text to emit
    bool operator==(const Output&) const = default;
  };

  // Feeds the next piece of generated text. After a stop every call returns {"", true}.
  Output Push(std::string_view piece);
  // End of generation without a stop: returns the held-back text (possibly an incomplete UTF-8
  // sequence, as generated). Returns "" after a stop. The matcher is then empty; later Push calls
  // continue as if on a fresh stream.
  std::string Flush();

  // A call has begun (a CallStart control token, seen by the caller): stops no longer apply, and
  // the text held back for them goes out with the next Push.
  void Lift();
  bool lifted() const { return lifted_; }

  bool stopped() const { return stopped_; }
  // Bytes currently held back.
  size_t held() const { return pending_.size(); }

 private:
  // Feeds one byte to the CallStart watch: true when it completes a call opener.
  bool OpensCall(char c);

  std::vector<std::string> stops_;
  std::vector<std::vector<int32_t>> fail_;  // [stop][len] KMP failure function of each stop
  std::vector<int32_t> state_;  // [stop] longest prefix of the stop that is a suffix of the stream
  std::string pending_;         // held-back tail of the stream; no stop string occurs in it
  bool stopped_ = false;
  CallStart call_start_;
  std::string tail_;          // the stream's last bytes, as many as the longest `anywhere` opener
  std::string start_;         // the stream's text from its first non-whitespace byte, while it may
                              // still be an `at_start` opener
  bool start_done_ = false;   // `start_` can no longer become an at_start opener
  bool lifted_ = false;
};

}  // namespace mnemo
