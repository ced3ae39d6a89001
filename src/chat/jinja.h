// A small interpreter for the subset of Jinja2 that Hugging Face chat templates use
// (tokenizer_config.json `chat_template`, GGUF `tokenizer.chat_template`).
//
// It renders like transformers' apply_chat_template environment: ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, the loopcontrols extension, and a `tojson` filter that is Python's
// json.dumps (ensure_ascii=False). Supported:
//   - {{ }}, {% %}, {# #}, whitespace control ({%- -%} {{- -}} {#- -#}, {%+ +%}), {% raw %}
//   - if / elif / else; for x in xs [if cond] ... [else] (loop.index, index0, revindex, revindex0,
//     first, last, length, previtem, nextitem, cycle()), tuple targets (for k, v in d.items());
//     break / continue; set x = ..., set a, b = ..., set ns.attr = ..., {% set x %}...{% endset %};
//     macro (positional, keyword and default arguments); {% filter f %}; {% do %}; {% generation %}
//   - literals: strings (Python escapes), ints, floats, true/false/none (and True/False/None),
//     lists, tuples (as lists), dicts
//   - operators: + - * / // % ** ~, == != < <= > >= (chained), in, not in, and, or, not,
//     `x if c else y`, attribute and item access, slicing with steps, calls with keyword arguments
//   - tests: defined undefined none boolean true false integer float number string mapping iterable
//     sequence callable sameas eq/equalto/== ne/!= lt/< le/<= gt/> ge/>= in odd even divisibleby
//     lower upper
//   - filters: abs attr capitalize count default/d dictsort e/escape first float indent int items
//     join last length list lower map max min reject rejectattr replace reverse round safe select
//     selectattr sort string sum title tojson trim unique upper wordcount
//   - globals: range, namespace, dict, raise_exception, plus whatever the context supplies
//   - str methods: strip lstrip rstrip split rsplit splitlines startswith endswith lower upper title
//     capitalize replace find rfind count join isdigit isalpha isalnum isspace isupper islower
//     format ({} fields only); dict: items keys values get; list: index count
// Not supported (a parse error, so unsupported templates fail at load): extends / block / include /
// import, call blocks, recursive loops, *args / **kwargs.
// Known differences from Python/Jinja2 (none matter for the chat templates tested): tuples are lists
// (`(1, 2)` prints as [1, 2]); ints are 64-bit (overflow is an error); case mapping (upper, lower,
// title, capitalize) is ASCII only; `|safe` returns the string unchanged (no Markup, so no
// HTML-escaping on concatenation); lists are eager (no generators).
//
// Safety: a template can never crash the process or run unbounded. Every error (syntax, unknown
// filter, type errors, raise_exception, limits) comes back as an Error with "line L, column C".
// Parser nesting is capped (256 levels, counting chained operators), macro calls are capped in depth,
// stack use, loop iterations and output size are capped per render (Limits).
//
// Thread safety: a Template is immutable after Parse; Render may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "chat/jinja_value.h"

namespace mnemo::jinja {

namespace internal {
struct Program;
}

struct Limits {
  size_t max_output_bytes = 16u << 20;       // rendered text, and any string built while rendering
  // For-loop iterations, range() items and list elements copied (+, *) per render. Real templates
  // use a few per message. 2^18 take 0.1 to 0.25 s (nested loops, -O2); 2^20 took 0.7 to 1.4 s, on
  // every request, for a hostile template from a GGUF file.
  uint64_t max_loop_iterations = 1u << 18;
  int max_call_depth = 64;                   // nested macro calls
  size_t max_stack_bytes = 1u << 20;         // stack the renderer may use (deep nesting, recursive
                                             // macros); the calling thread needs this much plus ~64 KiB
};

class Template {
 public:
  // Parses a template. Errors: syntax errors, unknown filters or tests, unsupported tags.
  static Result<Template> Parse(std::string_view source);

  // Renders with `context` (a dict: its keys become global variables, e.g. messages, bos_token).
  // Errors name the position; raise_exception('msg') gives "...: msg". An exception from
  // elsewhere (the standard library, a context function) is an Error in our own words ("template
  // rendering failed: ..."); its text goes to the log only.
  Result<std::string> Render(const Value& context, const Limits& limits = {}) const;

  const std::string& source() const;

 private:
  std::shared_ptr<const internal::Program> program_;
};

}  // namespace mnemo::jinja
