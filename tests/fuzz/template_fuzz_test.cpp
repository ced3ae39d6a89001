// The chat-template fuzz body (template_fuzz_body.h) in the normal build: the committed seed corpus,
// mutations of it, and hostile templates found or feared (each must fail cleanly and quickly).
#include <gtest/gtest.h>

#include <chrono>

#include "fuzz_inputs.h"
#include "template_fuzz_body.h"

namespace mnemo {
namespace {

bool Exercise(const std::string& s) { return test::ExerciseTemplate(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

TEST(TemplateFuzz, SeedCorpus) {
  const auto seeds = test::Corpus("template");
  ASSERT_GE(seeds.size(), 10u);
  int rendered = 0;
  for (const auto& s : seeds) rendered += Exercise(s.bytes);
  // The real templates with real conversations render; the hostile seeds do not.
  EXPECT_GE(rendered, int(seeds.size()) / 2);
  EXPECT_LT(rendered, int(seeds.size()));
}

TEST(TemplateFuzz, Mutations) {
  // The runaway seeds spend a render's whole budget (0.1 to 0.25 s): RunawayTemplatesFailQuickly
  // has them; mutations start from the rest.
  auto seeds = test::Corpus("template");
  std::erase_if(seeds, [](const test::Seed& s) { return s.name.rfind("runaway", 0) == 0; });
  const std::vector<std::string> dict = {"{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "for ", "endfor", "if ",
                                         "endif", "macro ", "endmacro", "set ", "namespace(", "range(", "|tojson",
                                         "|join", "loop.", "messages", "tools", "[", "]", "(", ")", "'", "\"",
                                         "\\", "~", "*", "**", ".", ",", ":", "\0", "\n", "{\"messages\":[", "]}",
                                         "{\"role\":\"tool\",", "\"tool_calls\":[{", "\"content\":[1,{}]"};
  Rng rng(2026);
  const int iters = test::FuzzIters(2000);
  int rendered = 0;
  for (int i = 0; i < iters; i++) {
    const auto& a = seeds[rng.Next() % seeds.size()];
    const auto& b = seeds[rng.Next() % seeds.size()];
    rendered += Exercise(test::Mutate(a.bytes, b.bytes, dict, rng));
  }
  EXPECT_GT(rendered, 0);
  EXPECT_LT(rendered, iters);
}

// Templates that try to run away: each is an Error, well within the time a request may take.
TEST(TemplateFuzz, RunawayTemplatesFailQuickly) {
  const std::string deep_parens = std::string(100000, '(') + "1" + std::string(100000, ')');
  const std::vector<std::string> sources = {
      "{{ " + deep_parens + " }}",
      "{{ " + std::string(100000, '[') + " }}",
      "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",                       // unbounded recursion
      "{% for i in range(1000000000) %}{% endfor %}",                              // long loop
      "{% for i in range(100) %}{% for j in range(100) %}{% for k in range(1000) %}{% endfor %}{% endfor %}{% endfor %}",
      "{{ 'xxxx' * 4611686018427387904 }}",                                        // size * n wrapped to 0
      "{{ ([1, 2, 3, 4] * 4611686018427387904)|length }}",
      "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",  // was 3 GB
      "{{ 'x' * 4000000000 }}",
      "{{ ('x' * 1000000) * 1000 }}",
      "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}{{ ns|tojson }}",
      "{{ range(10000000)|list|join(',') }}",
  };
  for (const auto& src : sources) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(Exercise(src + std::string(1, '\0') + "hi")) << src.substr(0, 120);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0) << src.substr(0, 120);
  }
}

}  // namespace
}  // namespace mnemo
