// Jinja subset: semantics against jinja2 (expected strings are what jinja2 3.1 renders in
// transformers' chat-template environment), error positions, limits, and robustness.
#include <gtest/gtest.h>

#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "base/rng.h"
#include "chat/jinja.h"

namespace mnemo::jinja {
namespace {

Result<std::string> RenderJson(const std::string& src, const std::string& context_json, const Limits& limits = {}) {
  auto t = Template::Parse(src);
  if (!t.ok()) return t.error();
  return t->Render(Value::FromJson(nlohmann::ordered_json::parse(context_json)), limits);
}

struct Case {
  const char* name;
  const char* source;
  const char* context;   // JSON object
  const char* expected;  // rendered text
};

// Cases and outputs cross-checked with jinja2 (trim_blocks, lstrip_blocks, loopcontrols,
// json.dumps tojson).
const Case kCases[] = {
    {"Text", R"J(plain text)J", R"J({})J", R"J(plain text)J"},
    {"Output", R"J(a{{ x }}b)J", R"J({"x": "X"})J", R"J(aXb)J"},
    {"UndefinedPrintsNothing", R"J([{{ missing }}])J", R"J({})J", R"J([])J"},
    {"NoneAndBools", R"J({{ none }} {{ true }} {{ false }} {{ None }} {{ True }})J", R"J({})J", R"J(None True False None True)J"},
    {"IntArithmetic", R"J({{ 1 + 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 * 3 - 1 }} {{ -4 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ true + 1 }})J", R"J({})J", R"J(3 3 1 5 -4 -4 2 1024 2)J"},
    {"FloatArithmetic", R"J({{ 1.5 + 1 }} {{ 7 / 2 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 3.0 * 2 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }})J", R"J({})J", R"J(2.5 3.5 0.5 3.0 0.5 6.0 0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.0001)J"},
    {"StringEscapes", R"J({{ 'a\nb\t"c"' }}|{{ "it's" }}|{{ 'x\u00e9\x41\101\q' }}|{{ 'ab' 'cd' }})J", R"J({})J", R"J(a
b	"c"|it's|xéAA\q|abcd)J"},
    {"Comment", R"J(a{# gone #}b{#- strip -#}  c)J", R"J({})J", R"J(abc)J"},
    {"TrimBlocks", R"J({% if true %}
x
{% endif %}
y)J", R"J({})J", R"J(x
y)J"},
    {"LstripBlocks", R"J(a
    {% if true %}
    b
    {% endif %}
c)J", R"J({})J", R"J(a
    b
c)J"},
    {"MinusStripsWhitespace", R"J(a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %})J", R"J({})J", R"J(abcd)J"},
    {"OutputTagKeepsNewline", R"J({{ 'a' }}
{{ 'b' }}
)J", R"J({})J", R"J(a
b)J"},
    {"PlusDisablesTrimAndLstrip", R"J(  {% if true %}x{% endif %}  {% if true %}y{% endif %}
  {#- c #}  z
	{% if true +%}
w
  {%+ if true %}v{% endif %}{% endif %})J", R"J({})J", R"J(x  y  z

w
  v)J"},
    {"CrLfNormalized", "a\r\nb\r{% if true %}\r\nc{% endif %}\r\n", R"J({})J", R"J(a
b
c)J"},
    {"IfElifElse", R"J({% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %})J", R"J({})J", R"J(one,two,many,)J"},
    {"LoopVariables", R"J({% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o','e') }};{% endfor %})J", R"J({"items": ["a", "b", "c"]})J", R"J(10TrueFalse33bo;21FalseFalse32ace;32FalseTrue31bo;)J"},
    {"ForElse", R"J({% for x in [] %}x{% else %}empty{% endfor %})J", R"J({})J", R"J(empty)J"},
    {"ForFilter", R"J({% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ loop.index }}:{{ x }}{% if not loop.last %},{% endif %}{% endfor %})J", R"J({})J", R"J(1:2,2:4)J"},
    {"ForOverItemsWithFilter", R"J({% for k, v in d.items() if k != 'b' %}{{ k }}={{ v }};{% endfor %})J", R"J({"d": {"a": 1, "b": 2, "c": 3}})J", R"J(a=1;c=3;)J"},
    {"BreakContinue", R"J({% for n in [1, 2, 3, 4] %}{% if n == 2 %}{% continue %}{% endif %}{% if n == 4 %}{% break %}{% endif %}{{ n }}{% endfor %})J", R"J({})J", R"J(13)J"},
    {"SetScoping", R"J({% set a = 1 %}{% for x in [1] %}{% set a = 2 %}{{ a }}{% endfor %}{{ a }}{% if true %}{% set b = 3 %}{% endif %}{{ b }})J", R"J({})J", R"J(213)J"},
    {"LoopSetDoesNotCarryOver", R"J({% for i in [1, 2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}[{{ x }}])J", R"J({})J", R"J([][])J"},
    {"Namespace", R"J({% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.seen = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.seen }})J", R"J({})J", R"J(6 True)J"},
    {"NamespaceAttributeAdded", R"J({% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }})J", R"J({})J", R"J(x)J"},
    {"DictIteration", R"J({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %})J", R"J({"d": {"x": 1, "y": "z"}})J", R"J(x=1;y=z;xy)J"},
    {"TupleTargets", R"J({% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% set x, y = 1, 2 %}{{ x }}{{ y }})J", R"J({})J", R"J(3712)J"},
    {"Comparisons", R"J({{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'a' != 'a' }}{{ 3 > 2 }}{{ 1 >= 1 }}{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }})J", R"J({})J", R"J(TrueFalseTrueFalseTrueTrueTrueFalseTrueTrueTrueTrue)J"},
    {"Equality", R"J({{ {'a': 1} == {'a': 1} }}{{ [1, [2]] == [1, [2]] }}{{ none == none }}{{ 'a' == 1 }}{{ m == msgs[0] }})J", R"J({"m": {"role": "user", "content": "Hello"}, "msgs": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"}]})J", R"J(TrueTrueTrueFalseTrue)J"},
    {"Logic", R"J({{ true and false }}{{ true or false }}{{ not true }}{{ not (1 == 2) }}{{ 0 or 'x' }}{{ 'a' and 'b' }}{{ [] or none }})J", R"J({})J", R"J(FalseTrueFalseTruexbNone)J"},
    {"In", R"J({{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}{{ not 'q' in d }}{{ 'a' in undefined_thing }})J", R"J({"d": {"k": 1}})J", R"J(TrueTrueTrueTrueTrueFalse)J"},
    {"Tests", R"J({{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ n is none }}{{ s is string }}{{ n is not none }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ 4 is divisibleby(3) }}{{ d is mapping }}{{ s is iterable }}{{ 1 is number }}{{ true is boolean }}{{ s is lower }}{{ 1 is integer }}{{ 1.0 is float }}{{ 2 is even }}{{ 'x' is eq 'x' }})J", R"J({"x": 1, "n": null, "s": "s", "d": {}})J", R"J(TrueFalseTrueTrueTrueFalseTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrue)J"},
    {"Ternary", R"J({{ 'yes' if flag else 'no' }}{{ 'a' if false }}|{{ 1 if false else 2 if false else 3 }})J", R"J({"flag": true})J", R"J(yes|3)J"},
    {"ConcatOperator", R"J({{ 'n=' ~ 3 ~ true ~ none ~ 1.5 ~ missing }})J", R"J({})J", R"J(n=3TrueNone1.5)J"},
    {"Subscripts", R"J({{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ 'hello'[1:3] }}{{ d['k'] }}{{ d.k }}{{ xs[10] }}{{ xs.1 }})J", R"J({"xs": [1, 2, 3], "d": {"k": "v"}})J", R"J(13[2, 3][1, 2]elvv2)J"},
    {"SliceSteps", R"J({{ xs[::-1] }}{{ xs[::2] }}{{ xs[1::2] }}{{ xs[-1:0:-1] }}{{ xs[:-2:-1] }}{{ 'abc'[::-1] }}{{ xs[-100:100] }}{{ xs[3:1] }})J", R"J({"xs": [1, 2, 3, 4, 5]})J", R"J([5, 4, 3, 2, 1][1, 3, 5][2, 4][5, 4, 3, 2][5]cba[1, 2, 3, 4, 5][])J"},
    {"Literals", R"J({{ [1, 'a'] }}{{ {'k': 1}['k'] }}{{ {'a': [1, {'b': none}]} }}{{ {0: 'zero', 512: 'x'}[512] }})J", R"J({})J", R"J([1, 'a']1{'a': [1, {'b': None}]}x)J"},
    {"IntDictKeys", R"J({% set m = {0: 0, 512: 128, 1024: 256} %}{% for k, v in m | dictsort %}{% if 600 <= k %}{{ v }},{% endif %}{% endfor %}{{ m[512] }}{{ 512 in m }}{{ m.get(0) }}{{ m | tojson }})J", R"J({})J", R"J(256,128True0{"0": 0, "512": 128, "1024": 256})J"},
    {"Filters", R"J({{ '  x  ' | trim }}|{{ xs | length }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ xs | join('-') }}|{{ xs | first }}{{ xs | last }}|{{ missing | default('d') }}|{{ 5 | string }}|{{ '' | default('e', true) }}|{{ none | default('f') }})J", R"J({"xs": [1, 2, 3]})J", R"J(x|3|ABab|1-2-3|13|d|5|e|None)J"},
    {"FilterBindsTighterThanPlus", R"J({{ 'a' + ' b ' | trim + 'c' }})J", R"J({})J", R"J(abc)J"},
    {"StringMethods", R"J({{ ' x '.strip() }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('x') }}{{ 'ab'.upper() }}{{ 'hello world'.title() }}{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|{{ 'abc'.startswith(('x','a')) }}{{ 'AbC'.lower() }})J", R"J({})J", R"J(xTrueFalseABHello Worldx | x|Trueabc)J"},
    {"StripCharacters", R"J([{{ '\n\nx\n'.strip('\n') }}][{{ 'xxay'.lstrip('x') }}][{{ 'ayyx'.rstrip('xy') }}][{{ ' a '.strip(none) }}])J", R"J({})J", R"J([x][ay][a][a])J"},
    {"Split", R"J({{ 'a<b>c<b>'.split('<b>') }}{{ ' a  b '.split() }}{{ 'x'.split(',') }}{{ 'r</think>a'.split('</think>')[-1] }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.rsplit(' ', 1) }})J", R"J({})J", R"J(['a', 'c', '']['a', 'b']['x']a['a', 'b,c']['a b', 'c'])J"},
    {"DictMethods", R"J({{ d.get('k') }}{{ d.get('q', 'dflt') }}{{ d.get('q') }}{{ d.keys() | list }}{{ d.values() | list }})J", R"J({"d": {"k": "v"}})J", R"J(vdfltNone['k']['v'])J"},
    {"ToJson", R"J({{ {'a': [1, 'x', none, true, 1.5, 'é"\\\n']} | tojson }})J", R"J({})J", R"J({"a": [1, "x", null, true, 1.5, "é\"\\\n"]})J"},
    {"ToJsonOptions", R"J({{ {'b': [1, {'c': 'x'}], 'a': {}, 'e': []} | tojson(indent=4) }}{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}{{ [1,2] | tojson(separators=(',', ':')) }}{{ 'é' | tojson(ensure_ascii=true) }})J", R"J({})J", R"J({
    "b": [
        1,
        {
            "c": "x"
        }
    ],
    "a": {},
    "e": []
}{"a": 2, "b": 1}[1,2]"\u00e9")J"},
    {"Range", R"J({% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 8, 3) | list }}{{ range(3, -1, -1) | list }}{{ range(0, 3, -1) | list }})J", R"J({})J", R"J(012[1, 4, 7][3, 2, 1, 0][])J"},
    {"Macro", R"J({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} {{ greet() }})J", R"J({})J", R"J(Hi a! Hi b? Hi c. Hi !)J"},
    {"MacroSeesTopLevel", R"J({% set t = 'x' %}{% macro m() %}{{ t }}{% endmacro %}{{ m() }})J", R"J({})J", R"J(x)J"},
    {"SetBlock", R"J({% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}])J", R"J({})J", R"J([inner 2])J"},
    {"FilterBlock", R"J({% filter upper %}abc{{ 'd' }}{% endfilter %})J", R"J({})J", R"J(ABCD)J"},
    {"MoreFilters", R"J({{ 'abc' | replace('b', 'X') }}{{ 'aaa'.replace('a', 'b', 2) }}{{ [3,1,2] | sort }}{{ [3,1,2] | sort(reverse=true) }}{{ ['b','A','a'] | sort }}{{ [1,2,2,3] | unique | list }}{{ [1,2] | reverse | list }}{{ 'ab' | reverse }})J", R"J({})J", R"J(aXcbba[1, 2, 3][3, 2, 1]['A', 'a', 'b'][1, 2, 3][2, 1]ba)J"},
    {"NumberFilters", R"J({{ [1,2,3] | sum }}{{ [1,5,3] | max }}{{ [4,2,3] | min }}{{ '3' | int + 1 }}{{ 'x' | int }}{{ '2.5' | float }}{{ -3 | abs }}{{ 2.567 | round(2) }}{{ 2.5 | round }}{{ 3.5 | round }})J", R"J({})J", R"J(652402.532.572.04.0)J"},
    {"Dictsort", R"J({% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %})J", R"J({"d": {"b": 1, "a": 2}})J", R"J(a2b1b1a2)J"},
    {"Map", R"J({{ xs | map(attribute='n') | list }}{{ ['a','b'] | map('upper') | list }}{{ xs | map(attribute='n') | join(',') }})J", R"J({"xs": [{"n": 1}, {"n": 2}]})J", R"J([1, 2]['A', 'B']1,2)J"},
    {"SelectAttr", R"J({{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ (msgs | selectattr('role', 'equalto', 'user') | list)[-1].content }}{{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | list }}{{ none | selectattr('x') | list }}{% for i in items | selectattr('on') %}{{ i.n }}{% endfor %})J", R"J({"msgs": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"}], "items": [{"n": 1, "on": true}, {"n": 2, "on": false}, {"n": 3}]})J", R"J(2 Who are you['Hi there'][]1)J"},
    {"Indent", R"J({{ 'line1\nline2\n\nline3' | indent(2) }}|{{ 'a\nb' | indent(4, true) }})J", R"J({})J", R"J(line1
  line2

  line3|    a
    b)J"},
    {"FormatAndRepeat", R"J({{ '{} is {}'.format('x', 1) }}{{ 'ab' * 3 }}{{ [0] * 2 }}{{ 'x' ~ 1 }})J", R"J({})J", R"J(x is 1ababab[0, 0]x1)J"},
    {"CaseFilters", R"J({{ 'hello' | capitalize }}{{ 'hello WORLD' | title }}{{ 'a b c' | wordcount }}{{ '<a>' | e }})J", R"J({})J", R"J(HelloHello World3&lt;a&gt;)J"},
    {"ReassignGlobal", R"J({{ messages[0]['role'] }}{% set messages = messages[1:] %}{{ messages | length }})J", R"J({"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"}]})J", R"J(user2)J"},
    {"ReverseIteration", R"J({% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}{{ messages[-1].content }})J", R"J({"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"}]})J", R"J(uauWho are you)J"},
    {"Utf8CodePoints", R"J({{ 'é' | length }}{{ 'héllo'[1] }}{{ 'héllo'[1:3] }}{{ 'héllo' | reverse }})J", R"J({})J", R"J(1éélolléh)J"},
    {"Raw", R"J({% raw %}{{ not rendered }}{% endraw %})J", R"J({})J", R"J({{ not rendered }})J"},
    {"AttributeOfNoneIsUndefined", R"J({{ x.y is defined }}{{ 'abc'.foo is defined }}{{ s.content.content is defined }})J", R"J({"x": null, "s": {"content": "text"}})J", R"J(FalseFalseFalse)J"},
    {"UndefinedIsEmptyIterable", R"J({% for x in undefined_thing %}x{% endfor %}{{ undefined_thing | length }}{{ undefined_thing | list }})J", R"J({})J", R"J(0[])J"},
    {"ContentPartsToJson", R"J({{ m.content if m.content is string else m.content | tojson }})J", R"J({"m": {"content": [{"type": "text", "text": "hi"}]}})J", R"J([{"type": "text", "text": "hi"}])J"},
};

TEST(Jinja, RendersLikeJinja2) {
  for (const Case& c : kCases) {
    auto r = RenderJson(c.source, c.context);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.error().message;
    EXPECT_EQ(*r, c.expected) << c.name;
  }
}

struct ErrorCase {
  const char* name;
  const char* source;
  const char* context;
  const char* message;  // expected in the error
  const char* where;    // expected position text
};

const ErrorCase kErrors[] = {
    {"AttributeOfUndefined", R"J({{ x.y.z }})J", R"J({})J", R"J('x' is undefined)J", R"J(line 1, column 5)J"},
    {"TypeError", R"J({{ 1 + 'a' }})J", R"J({})J", R"J(unsupported operand types for +: 'int' and 'str')J", R"J(line 1, column 6)J"},
    {"CallUndefined", R"J({{ foo() }})J", R"J({})J", R"J('foo' is undefined)J", R"J(line 1)J"},
    {"NotIterable", R"J({% for x in 5 %}{% endfor %})J", R"J({})J", R"J('int' object is not iterable)J", R"J(line 1, column 13)J"},
    {"RaiseException", R"J(ab
{{ raise_exception('boom') }})J", R"J({})J", R"J(raise_exception: boom)J", R"J(line 2, column 4)J"},
    {"SyntaxMissingExpression", R"J({% if %}{% endif %})J", R"J({})J", R"J(expected an expression)J", R"J(line 1, column 7)J"},
    {"UnknownFilter", R"J({{ x | nosuchfilter }})J", R"J({})J", R"J(unknown filter 'nosuchfilter')J", R"J(line 1, column 8)J"},
    {"UnknownTest", R"J({{ x is nosuchtest }})J", R"J({})J", R"J(unknown test 'nosuchtest')J", R"J(line 1)J"},
    {"MismatchedEnd", R"J({% for x in xs %}{% endif %})J", R"J({})J", R"J(unknown tag 'endif')J", R"J(line 1)J"},
    {"MissingEnd", R"J({% if true %}x)J", R"J({})J", R"J(missing '{% endif %}')J", R"J(line 1)J"},
    {"UnterminatedString", R"J({{ 'unterminated }})J", R"J({})J", R"J(unterminated string literal)J", R"J(line 1, column 4)J"},
    {"UnterminatedTag", R"J(x {{ a )J", R"J({})J", R"J(unterminated '{{')J", R"J(line 1, column 3)J"},
    {"DivisionByZero", R"J({{ 1 / 0 }})J", R"J({})J", R"J(division by zero)J", R"J(line 1)J"},
    {"UnsupportedTag", R"J({% extends 'a' %})J", R"J({})J", R"J(unsupported or unknown tag 'extends')J", R"J(line 1)J"},
    {"NotANamespace", R"J({% set d = {'a': 1} %}{% set d.a = 2 %})J", R"J({})J", R"J(not a namespace)J", R"J(line 1)J"},
    {"BreakOutsideLoop", R"J({% break %})J", R"J({})J", R"J('break' outside of a loop)J", R"J(line 1)J"},
    {"IntegerOverflow", R"J({{ 9223372036854775807 + 1 }})J", R"J({})J", R"J(integer overflow)J", R"J(line 1)J"},
};

TEST(Jinja, ErrorsNameTheProblemAndPosition) {
  for (const ErrorCase& c : kErrors) {
    auto r = RenderJson(c.source, c.context);
    ASSERT_FALSE(r.ok()) << c.name << " rendered: " << *r;
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << c.name << ": " << r.error().message;
    EXPECT_NE(r.error().message.find(c.where), std::string::npos) << c.name << ": " << r.error().message;
  }
}

TEST(Jinja, GenerationBlockRendersItsBody) {
  auto r = RenderJson("a{% generation %}b{{ 1 }}{% endgeneration %}c", "{}");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "ab1c");
}

TEST(Jinja, ContextFromCppValuesAndFunctions) {
  auto t = Template::Parse("{{ greet(name, punct='!') }} {{ xs | length }} {{ d.k }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  Dict ctx;
  ctx.Set("name", Value("Ada"));
  ctx.Set("xs", Value(List{Value(1), Value(2.5), Value::None()}));
  Dict d;
  d.Set("k", Value(true));
  ctx.Set("d", Value(std::move(d)));
  ctx.Set("greet", Value::MakeFunction("greet", [](CallArgs& args) {
            std::string punct;
            for (const auto& [k, v] : args.named) {
              if (k == "punct") punct = v.str();
            }
            return Value("Hi " + args.positional.at(0).str() + punct);
          }));
  auto r = t->Render(Value(std::move(ctx)));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "Hi Ada! 3 True");
}

TEST(Jinja, FormatsFloatsLikePython) {
  EXPECT_EQ(FormatFloat(1.0), "1.0");
  EXPECT_EQ(FormatFloat(0.1), "0.1");
  EXPECT_EQ(FormatFloat(-2.5), "-2.5");
  EXPECT_EQ(FormatFloat(1e16), "1e+16");
  EXPECT_EQ(FormatFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(FormatFloat(1.5e-5), "1.5e-05");
  EXPECT_EQ(FormatFloat(0.0001), "0.0001");
  EXPECT_EQ(FormatFloat(123456789.125), "123456789.125");
  EXPECT_EQ(FormatFloat(1e300 * 1e10), "inf");
}

TEST(Jinja, OutputLimit) {
  Limits limits;
  limits.max_output_bytes = 1000;
  auto r = RenderJson("{% for i in range(1000) %}0123456789{% endfor %}", "{}", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("size limit"), std::string::npos) << r.error().message;
  // Strings built in expressions are capped too (doubling would otherwise take all memory).
  r = RenderJson("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                 "{}", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("size limit"), std::string::npos) << r.error().message;
  r = RenderJson("{{ 'x' * 100000000000 }}", "{}", limits);
  ASSERT_FALSE(r.ok());
}

TEST(Jinja, LoopLimit) {
  Limits limits;
  limits.max_loop_iterations = 1000;
  auto r = RenderJson("{% for i in range(40) %}{% for j in range(40) %}{% endfor %}{% endfor %}", "{}", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("iteration limit"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("line 1, column"), std::string::npos) << r.error().message;
  r = RenderJson("{{ range(100000000000) | length }}", "{}", limits);
  ASSERT_FALSE(r.ok());
  r = RenderJson("{% for i in range(20) %}{% for j in range(20) %}{% endfor %}{% endfor %}ok", "{}", limits);
  ASSERT_TRUE(r.ok()) << r.error().message;
}

TEST(Jinja, RecursiveMacroIsStopped) {
  auto r = RenderJson("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("nested too deeply"), std::string::npos) << r.error().message;
  // Bounded recursion works.
  r = RenderJson("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}", "{}");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "54321");
}

TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  const int n = 100000;
  const std::string cases[] = {
      "{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}",
      "{{ " + std::string(n, '[') + std::string(n, ']') + " }}",
      "{{ " + std::string(n, '-') + "1 }}",
      "{{ x" + std::string(n, '.') + " }}",
  };
  for (const std::string& src : cases) {
    auto t = Template::Parse(src);
    EXPECT_FALSE(t.ok()) << src.substr(0, 20);
  }
  std::string nots = "{{ ";
  std::string plus = "{{ 1";
  std::string attrs = "{{ x";
  std::string filters = "{{ x";
  std::string ifs;
  for (int i = 0; i < 20000; ++i) {
    nots += "not ";
    plus += " + 1";
    attrs += ".a";
    filters += " | trim";
    ifs += "{% if true %}";
  }
  for (const std::string& src : {nots + "x }}", plus + " }}", attrs + " }}", filters + " }}", ifs}) {
    auto t = Template::Parse(src);
    ASSERT_FALSE(t.ok()) << src.substr(0, 20);
    EXPECT_NE(t.error().message.find("nested too deeply"), std::string::npos) << t.error().message;
  }
}

TEST(Jinja, SelfReferencingNamespaceIsAnError) {
  auto r = RenderJson("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}", "{}");
  ASSERT_FALSE(r.ok());
  r = RenderJson("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "{}");
  ASSERT_FALSE(r.ok());
}

TEST(Jinja, DeepJsonIsCut) {
  std::string deep;
  for (int i = 0; i < 1000; ++i) deep += "[";
  for (int i = 0; i < 1000; ++i) deep += "]";
  auto r = RenderJson("{{ x | length }}", "{\"x\": " + deep + "}");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "1");
}

// Random soups of template fragments: every one parses or fails cleanly, and renders or fails
// cleanly, within the limits.
// Exceptions from outside the renderer (here a context function; in production the standard
// library) were returned with their what() text, which reached clients through request errors.
TEST(Jinja, ForeignExceptionTextIsNotReturned) {
  auto t = Template::Parse("a{{ f() }}b");
  ASSERT_TRUE(t.ok());
  for (int kind = 0; kind < 3; kind++) {
    Dict ctx;
    ctx.Set("f", Value::MakeFunction("f", [kind](CallArgs&) -> Value {
              if (kind == 0) throw std::runtime_error("basic_string::_M_create at /srv/secret/path");
              if (kind == 1) throw std::bad_alloc();
              throw 42;
            }));
    auto r = t->Render(Value(std::move(ctx)));
    ASSERT_FALSE(r.ok()) << kind;
    const std::string& m = r.error().message;
    EXPECT_EQ(m.rfind("template rendering failed: ", 0), 0u) << m;
    EXPECT_EQ(m.find("basic_string"), std::string::npos) << m;
    EXPECT_EQ(m.find("/srv"), std::string::npos) << m;
    EXPECT_EQ(m.find("bad_alloc"), std::string::npos) << m;
  }
  // The renderer is left usable (its thread state restored).
  auto ok = RenderJson("{{ x }}", R"({"x": 1})");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "1");
}

TEST(Jinja, RandomTemplatesNeverCrash) {
  static const char* const kPieces[] = {
      "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", " if ", " for ", " in ", " endif ",
      " endfor ", " else ", " elif ", " set ", " = ", " x ", " messages ", " loop ", ".index", "[0]", "[1:]",
      "[::-1]", "(", ")", "[", "]", "{", "}", ",", ":", "'s'", "\"t\"", " 1 ", " 2.5 ", " + ", " - ", " * ",
      " / ", " // ", " % ", " ~ ", " == ", " != ", " < ", " and ", " or ", " not ", " is ", " defined ",
      " none ", " | ", "trim", "length", "tojson", "join", "default", "items", "(indent=2)", "\n", "  ",
      "text", " macro ", " endmacro ", " m ", " ns ", "namespace(a=1)", ".a", " raise_exception('e') ",
      " range(5) ", " range(100000) ", " break ", " continue ", " raw ", " endraw ", "'",
  };
  const int n_pieces = sizeof(kPieces) / sizeof(kPieces[0]);
  Rng rng(1234);
  Limits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_loop_iterations = 1 << 14;
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "x": 3})");
  const Value context = Value::FromJson(ctx);
  int parsed = 0, rendered = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string src;
    const int len = 1 + static_cast<int>(rng.Next() % 24);
    for (int i = 0; i < len; ++i) src += kPieces[rng.Next() % n_pieces];
    auto t = Template::Parse(src);
    if (!t.ok()) continue;
    ++parsed;
    auto r = t->Render(context, limits);
    rendered += r.ok();
  }
  EXPECT_GT(parsed, 1000);
  EXPECT_GT(rendered, 500);
}

}  // namespace
}  // namespace mnemo::jinja
