// Internals of the Jinja interpreter shared by its .cpp files: the error type used to unwind, tokens,
// the AST, and the filter / test / method tables. Not part of the public API (see jinja.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace mnemo::jinja::internal {

inline constexpr size_t kNoPos = static_cast<size_t>(-1);

// Thrown inside the interpreter and caught at the public API (Template::Parse / Render), where it
// becomes an Error naming the line and column. pos: byte offset in the template source, or kNoPos
// when the thrower does not know it (the nearest enclosing expression then fills it in).
struct JinjaError {
  std::string message;
  size_t pos = kNoPos;
};
[[noreturn]] void Fail(size_t pos, std::string message);
[[noreturn]] void Fail(std::string message);  // position filled in by the caller's node

// "line L, column C" for a byte offset (1-based; columns count bytes).
std::string Where(std::string_view source, size_t pos);

// ---- Tokens -------------------------------------------------------------------------------------

enum class Tok : uint8_t {
  kText,        // raw template text (whitespace control already applied)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword
  kString,      // string literal (unescaped)
  kInt,
  kFloat,
  kOp,          // operator or punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEnd,         // end of input
};

struct Token {
  Tok kind;
  size_t pos;         // byte offset in the source
  std::string text;   // text, name, unescaped string, operator
  int64_t i = 0;      // kInt
  double f = 0;       // kFloat
};

// Splits the source into text and tag tokens, applying {%- -%} {{- -}} {#- -#} and, as Hugging Face's
// environment does, trim_blocks (drop the first newline after a block or comment tag) and
// lstrip_blocks (drop spaces and tabs before a block or comment tag that starts a line).
// {% raw %}...{% endraw %} becomes a text token. Throws JinjaError on unterminated tags or strings.
std::vector<Token> Lex(std::string_view source);

// Jinja's source normalization, applied before Lex: \r\n and \r become \n, and one trailing newline
// is dropped (keep_trailing_newline=False).
std::string NormalizeNewlines(std::string_view source);

// ---- AST ----------------------------------------------------------------------------------------

enum class BinOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat,
  kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn,
  kAnd, kOr,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// Filter: fn(value, args). Test: fn(value, args) -> bool.
using FilterFn = Value (*)(const Value& v, CallArgs& args);
using TestFn = bool (*)(const Value& v, CallArgs& args);
FilterFn FindFilter(std::string_view name);  // nullptr when unknown
TestFn FindTest(std::string_view name);      // nullptr when unknown

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // literal
    kName,     // name
    kList,     // items
    kDict,     // items: key0, value0, key1, value1, ...
    kAttr,     // items[0].name
    kIndex,    // items[0][items[1]]
    kSlice,    // items[0][items[1]:items[2]:items[3]] (null parts absent)
    kCall,     // items[0](items[1..], named)
    kFilter,   // items[0] | name(items[1..], named); filter set
    kTest,     // items[0] is [not] name(items[1..]); test set
    kNeg,      // -items[0]
    kPos,      // +items[0]
    kNot,      // not items[0]
    kBinary,   // items[0] op items[1]
    kCompare,  // chain: items[0] ops[0] items[1] ops[1] items[2] ...
    kTernary,  // items[0] if items[1] else items[2] (items[2] null: undefined)
  };
  Kind kind;
  size_t pos;                                     // byte offset in the source
  Value literal;                                  // kLiteral
  std::string name;                               // kName, kAttr, kFilter, kTest
  std::vector<ExprPtr> items;                     // operands (see Kind)
  std::vector<std::pair<std::string, ExprPtr>> named;  // kCall / kFilter / kTest keyword arguments
  std::vector<BinOp> ops;                         // kBinary: [1]; kCompare: [n - 1]
  FilterFn filter = nullptr;                      // kFilter
  TestFn test = nullptr;                          // kTest
  bool negated = false;                           // kTest: `is not`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind : uint8_t {
    kText,       // text
    kOutput,     // {{ expr }}
    kIf,         // branches: (cond, body)...; a null cond is `else`
    kFor,        // for targets in expr [if cond]: body [else else_body]
    kSet,        // set targets = expr, or set attr_of.name = expr (namespace attribute)
    kSetBlock,   // set targets[0] %}body{% endset
    kMacro,      // macro name(params): body
    kBreak,
    kContinue,
    kScope,      // body rendered as is ({% generation %})
    kFilterBlock,  // {% filter name(args) %}body: expr is the filter applied to a placeholder
    kDo,         // {% do expr %}
  };
  Kind kind;
  size_t pos;
  std::string text;                                   // kText; kMacro name; kSet namespace variable
  ExprPtr expr;                                       // kOutput, kFor iterable, kSet value, kDo, kFilterBlock
  ExprPtr cond;                                       // kFor filter
  std::vector<std::pair<ExprPtr, Body>> branches;     // kIf
  std::vector<std::string> targets;                   // kFor / kSet / kSetBlock names; kSet attr: [attr]
  Body body;                                          // kFor, kSetBlock, kMacro, kScope, kFilterBlock
  Body else_body;                                     // kFor
  std::vector<MacroParam> params;                     // kMacro
};

struct Program {
  std::string source;  // kept for error positions
  Body body;
};

// Parses tokens into a program. Throws JinjaError (unknown tag, filter or test, syntax errors,
// nesting deeper than kMaxNesting: recursion levels plus chained operators, so that
// neither parsing, rendering nor destroying the AST can exhaust the stack).
inline constexpr int kMaxNesting = 256;
Body Parse(const std::vector<Token>& tokens);

// ---- Builtins shared by the evaluator -----------------------------------------------------------

// Bound method `name` of a string, list or dict (e.g. "abc".startswith), or undefined.
Value FindMethod(const Value& self, std::string_view name);

// Argument helpers for builtins: positional index i, or keyword `name`, else `def`.
const Value* Arg(CallArgs& args, size_t i, std::string_view name);
Value ArgOr(CallArgs& args, size_t i, std::string_view name, Value def);

// str helpers (Python semantics; case mapping ASCII only). Need* throw a type error naming `what`.
const std::string& NeedString(const Value& v, const char* what);
int64_t NeedInt(const Value& v, const char* what);
bool IsPySpace(unsigned char c);  // str.isspace for one byte
// str.strip / lstrip / rstrip: whitespace, or the code points of `chars` when it is a string.
std::string Strip(const std::string& s, const Value& chars, bool left, bool right);
std::string AsciiMap(std::string s, int (*f)(int));  // f on every ASCII byte
int Upper(int c);
int Lower(int c);
std::string Title(const std::string& s);
std::string Capitalize(const std::string& s);
std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
List Split(const std::string& s, const Value& sep, int64_t maxsplit);  // sep undefined/none: whitespace
std::string Join(const Value& seq, const std::string& sep, const Value& attribute);

// Limits shared by the evaluator and builtins of one render (thread-local to the rendering thread).
size_t MaxStringBytes();
void CheckStringSize(size_t n);  // throws when n > MaxStringBytes()
void CountIterations(uint64_t n);  // throws when the render's loop budget is spent

// Python-style sequence helpers.
List Iterate(const Value& v);  // list items, dict keys, string code points, undefined -> []; else throws
int64_t Length(const Value& v);
bool Contains(const Value& container, const Value& item);
int Compare(const Value& a, const Value& b);  // -1 / 0 / 1; throws for unorderable types
Value GetItem(const Value& obj, const Value& key);  // obj[key]; missing -> undefined
Value GetAttr(const Value& obj, std::string_view name);  // obj.name; missing -> undefined
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace mnemo::jinja::internal
