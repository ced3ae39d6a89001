// Renderer: walks the AST with Jinja2 scoping (a for-loop iteration and a macro call get their own
// frame; if does not), and the public Template API, which turns internal errors into Results (the
// text of exceptions from elsewhere, e.g. the standard library, is logged and never returned).
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>

#include "base/log.h"
#include "chat/jinja.h"
#include "chat/jinja_internal.h"

namespace mnemo::jinja {
namespace internal {
namespace {

struct RenderState {
  const Limits* limits = nullptr;
  uintptr_t stack_base = 0;  // frame address where rendering started (stacks grow down)
  uint64_t iterations = 0;  // loop iterations and range() items so far
  int call_depth = 0;       // nested macro calls
  std::vector<Value> namespaces;  // created by namespace(): cleared at the end to break cycles
};
thread_local RenderState* g_state = nullptr;
const Limits kDefaultLimits;

// Variables of one scope; lookups walk to the parent, assignments stay in this frame.
struct Frame {
  const Frame* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Find(std::string_view name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      for (const auto& [k, v] : f->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void Set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }

[[noreturn]] void BadOperands(const char* op, const Value& a, const Value& b) {
  Fail(std::string("unsupported operand types for ") + op + ": '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

// op(x, y) with int64 overflow detection (Python ints are unbounded; we fail instead).
template <class Op>
int64_t CheckedInt(Op op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op(x, y, &r)) Fail("integer overflow");
  return r;
}
bool AddOv(int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); }
bool SubOv(int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); }
bool MulOv(int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); }

// The size of n copies of a sequence of `size`, saturated (size * n wrapped around to a small
// number for 'xxxx' * 2**62, and the loop below then ran for ever).
uint64_t RepeatedSize(size_t size, int64_t n) {
  uint64_t total;
  return __builtin_mul_overflow(static_cast<uint64_t>(size), static_cast<uint64_t>(n), &total) ? UINT64_MAX : total;
}

Value Repeat(const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value("") : Value(List{});
  if (seq.is_string()) {
    CheckStringSize(RepeatedSize(seq.str().size(), n));
    std::string s;
    for (int64_t i = 0; i < n; ++i) s += seq.str();
    return Value(std::move(s));
  }
  CountIterations(RepeatedSize(seq.list().size(), n));
  List l;
  for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(l));
}

Value Arith(BinOp op, const Value& a, const Value& b) {
  if (op != BinOp::kConcat && (a.is_undefined() || b.is_undefined())) {
    Fail("undefined value used in an arithmetic expression");
  }
  switch (op) {
    case BinOp::kConcat: {
      std::string s = ToStr(a);
      s += ToStr(b);
      CheckStringSize(s.size());
      return Value(std::move(s));
    }
    case BinOp::kAdd:
      if (a.is_string() && b.is_string()) {
        CheckStringSize(a.str().size() + b.str().size());
        return Value(a.str() + b.str());
      }
      if (a.is_list() && b.is_list()) {
        // Copying counts as iterations: doubling a list in a loop grew it to gigabytes otherwise.
        CountIterations(a.list().size() + b.list().size());
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value(std::move(l));
      }
      if (!a.is_number() || !b.is_number()) BadOperands("+", a, b);
      if (IsIntLike(a) && IsIntLike(b)) {
        return Value(CheckedInt(AddOv, a.as_int(), b.as_int()));
      }
      return Value(a.as_float() + b.as_float());
    case BinOp::kMul:
      if ((a.is_string() || a.is_list()) && IsIntLike(b)) return Repeat(a, b.as_int());
      if (IsIntLike(a) && (b.is_string() || b.is_list())) return Repeat(b, a.as_int());
      [[fallthrough]];
    case BinOp::kSub:
    case BinOp::kDiv:
    case BinOp::kFloorDiv:
    case BinOp::kMod:
    case BinOp::kPow: {
      static const char* const kNames[] = {"+", "-", "*", "/", "//", "%", "**"};
      const char* name = kNames[static_cast<int>(op)];
      if (!a.is_number() || !b.is_number()) BadOperands(name, a, b);
      const bool ints = IsIntLike(a) && IsIntLike(b);
      if (ints) {
        const int64_t x = a.as_int();
        const int64_t y = b.as_int();
        switch (op) {
          case BinOp::kSub: return Value(CheckedInt(SubOv, x, y));
          case BinOp::kMul: return Value(CheckedInt(MulOv, x, y));
          case BinOp::kDiv:
            if (y == 0) Fail("division by zero");
            return Value(static_cast<double>(x) / static_cast<double>(y));
          case BinOp::kFloorDiv:
          case BinOp::kMod: {
            if (y == 0) Fail("integer division or modulo by zero");
            if (x == std::numeric_limits<int64_t>::min() && y == -1) Fail("integer overflow");
            int64_t q = x / y;
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward negative infinity
              --q;
              m += y;
            }
            return Value(op == BinOp::kMod ? m : q);
          }
          case BinOp::kPow: {
            if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
            int64_t result = 1;
            for (int64_t i = 0; i < y; ++i) {
              if (__builtin_mul_overflow(result, x, &result)) Fail("integer overflow");
              if (result == 0 || result == 1) break;
            }
            return Value(result);
          }
          default: break;
        }
      }
      const double x = a.as_float();
      const double y = b.as_float();
      switch (op) {
        case BinOp::kSub: return Value(x - y);
        case BinOp::kMul: return Value(x * y);
        case BinOp::kDiv:
          if (y == 0) Fail("float division by zero");
          return Value(x / y);
        case BinOp::kFloorDiv:
          if (y == 0) Fail("float floor division by zero");
          return Value(std::floor(x / y));
        case BinOp::kMod: {
          if (y == 0) Fail("float modulo by zero");
          double m = std::fmod(x, y);
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value(m);
        }
        case BinOp::kPow: return Value(std::pow(x, y));
        default: break;
      }
      break;
    }
    default: break;
  }
  Fail("bad operator");
}

bool CompareOp(BinOp op, const Value& a, const Value& b) {
  switch (op) {
    case BinOp::kEq: return Equals(a, b);
    case BinOp::kNe: return !Equals(a, b);
    case BinOp::kLt: return Compare(a, b) < 0;
    case BinOp::kLe: return Compare(a, b) <= 0;
    case BinOp::kGt: return Compare(a, b) > 0;
    case BinOp::kGe: return Compare(a, b) >= 0;
    case BinOp::kIn: return Contains(b, a);
    case BinOp::kNotIn: return !Contains(b, a);
    default: Fail("bad comparison");
  }
}

// What an expression names, for messages about undefined values.
std::string Describe(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kName: return "'" + e.name + "'";
    case Expr::Kind::kAttr: return Describe(*e.items[0]) + "." + e.name;
    default: return "value";
  }
}

class Evaluator {
 public:
  Evaluator(const Program& program, const Value& context, RenderState* state)
      : program_(program), context_(context), state_(state) {}

  void Run(std::string* out) {
    Frame root;
    root_ = &root;
    Exec(program_.body, root, out);
  }

 private:
  void Emit(std::string* out, std::string_view s) {
    if (out->size() + s.size() > state_->limits->max_output_bytes) Fail("output exceeds the size limit");
    out->append(s);
  }

  Value Lookup(std::string_view name, const Frame& frame) {
    if (const Value* v = frame.Find(name)) return *v;
    if (context_.is_dict()) {
      if (const Value* v = context_.dict().Find(name)) return *v;
    }
    return Global(name);
  }

  Value Global(std::string_view name);
  Value CallMacro(const Stmt& macro, CallArgs& args);

  Flow Exec(const Body& body, Frame& frame, std::string* out) {
    for (const StmtPtr& s : body) {
      const Flow flow = ExecOne(*s, frame, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  // Errors without a position (loop limits, unpacking) get the statement's.
  Flow ExecOne(const Stmt& s, Frame& frame, std::string* out) {
    CheckStack(s.pos);
    return At(s.pos, [&] { return ExecStmt(s, frame, out); });
  }

  Flow ExecStmt(const Stmt& s, Frame& frame, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText: Emit(out, s.text); break;
      case Stmt::Kind::kOutput: {
        const Value v = Eval(*s.expr, frame);
        if (v.is_string()) Emit(out, v.str());
        else Emit(out, ToStr(v));
        break;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (cond == nullptr || Eval(*cond, frame).Truthy()) return Exec(body, frame, out);
        }
        break;
      case Stmt::Kind::kFor: return ExecFor(s, frame, out);
      case Stmt::Kind::kSet: {
        Value v = Eval(*s.expr, frame);
        if (!s.text.empty()) {
          const Value ns = Lookup(s.text, frame);
          if (!ns.is_dict() || !ns.dict().is_namespace) {
            Fail(s.pos, "cannot assign attribute '" + s.targets[0] + "' on '" + s.text + "': not a namespace");
          }
          ns.mutable_dict().Set(s.targets[0], std::move(v));
        } else {
          Assign(s.targets, std::move(v), frame, s.pos);
        }
        break;
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        Exec(s.body, frame, &captured);
        frame.Set(s.targets[0], Value(std::move(captured)));
        break;
      }
      case Stmt::Kind::kMacro: {
        const Stmt* macro = &s;
        frame.Set(s.text, Value::MakeFunction(s.text, [this, macro](CallArgs& args) { return CallMacro(*macro, args); }));
        break;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kScope: return Exec(s.body, frame, out);
      case Stmt::Kind::kFilterBlock: {
        std::string captured;
        Exec(s.body, frame, &captured);
        const Expr& f = *s.expr;
        CallArgs args = EvalArgs(f, 1, frame);
        const Value v = At(f.pos, [&] { return f.filter(Value(std::move(captured)), args); });
        Emit(out, ToStr(v));
        break;
      }
      case Stmt::Kind::kDo: Eval(*s.expr, frame); break;
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& targets, Value v, Frame& frame, size_t pos) {
    if (targets.size() == 1) {
      frame.Set(targets[0], std::move(v));
      return;
    }
    const List items = Iterate(v);
    if (items.size() != targets.size()) {
      Fail(pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) frame.Set(targets[i], items[i]);
  }

  Flow ExecFor(const Stmt& s, Frame& frame, std::string* out) {
    const Value seq = Eval(*s.expr, frame);
    List items = At(s.expr->pos, [&] { return Iterate(seq); });
    if (s.cond) {  // the filter sees the loop variables but not `loop`
      List kept;
      for (Value& item : items) {
        CountIterations(1);
        Frame f{&frame, {}};
        Assign(s.targets, item, f, s.pos);
        if (Eval(*s.cond, f).Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      CountIterations(1);
      Frame f{&frame, {}};
      Assign(s.targets, items[i], f, s.pos);
      Dict loop;
      loop.items.reserve(12);
      loop.items.emplace_back("index", Value(i + 1));
      loop.items.emplace_back("index0", Value(i));
      loop.items.emplace_back("revindex", Value(n - i));
      loop.items.emplace_back("revindex0", Value(n - i - 1));
      loop.items.emplace_back("first", Value(i == 0));
      loop.items.emplace_back("last", Value(i == n - 1));
      loop.items.emplace_back("length", Value(n));
      loop.items.emplace_back("depth", Value(1));
      loop.items.emplace_back("depth0", Value(0));
      loop.items.emplace_back("previtem", i > 0 ? items[i - 1] : Value());
      loop.items.emplace_back("nextitem", i + 1 < n ? items[i + 1] : Value());
      loop.items.emplace_back("cycle", Value::MakeFunction("cycle", [i](CallArgs& args) {
        if (args.positional.empty()) Fail("loop.cycle() needs at least one argument");
        return args.positional[static_cast<size_t>(i) % args.positional.size()];
      }));
      f.vars.emplace_back("loop", Value(std::move(loop)));
      const Flow flow = Exec(s.body, f, out);
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && !s.else_body.empty()) return Exec(s.else_body, frame, out);
    return Flow::kNormal;
  }

  // Runs fn; an error without a position gets `pos`.
  template <class Fn>
  static auto At(size_t pos, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (JinjaError& e) {
      if (e.pos == kNoPos) e.pos = pos;
      throw;
    }
  }

  CallArgs EvalArgs(const Expr& e, size_t first, Frame& frame) {
    CallArgs args;
    for (size_t i = first; i < e.items.size(); ++i) args.positional.push_back(Eval(*e.items[i], frame));
    for (const auto& [name, expr] : e.named) args.named.emplace_back(name, Eval(*expr, frame));
    return args;
  }

  void CheckStack(size_t pos) const {
    const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    if (state_->stack_base > here && state_->stack_base - here > state_->limits->max_stack_bytes) {
      Fail(pos, "template nested too deeply (stack limit)");
    }
  }

  Value Eval(const Expr& e, Frame& frame) {
    CheckStack(e.pos);
    return At(e.pos, [&]() -> Value { return EvalNode(e, frame); });
  }

  Value EvalNode(const Expr& e, Frame& frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return Lookup(e.name, frame);
      case Expr::Kind::kList: {
        List l;
        l.reserve(e.items.size());
        for (const ExprPtr& item : e.items) l.push_back(Eval(*item, frame));
        return Value(std::move(l));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value k = Eval(*e.items[i], frame);
          d.Set(At(e.items[i]->pos, [&] { return DictKey(k); }), Eval(*e.items[i + 1], frame));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kAttr: {
        const Value obj = Eval(*e.items[0], frame);
        if (obj.is_undefined()) Fail(Describe(*e.items[0]) + " is undefined (reading ." + e.name + ")");
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kIndex: {
        const Value obj = Eval(*e.items[0], frame);
        if (obj.is_undefined()) Fail(Describe(*e.items[0]) + " is undefined (indexing it)");
        return GetItem(obj, Eval(*e.items[1], frame));
      }
      case Expr::Kind::kSlice: {
        const Value obj = Eval(*e.items[0], frame);
        if (obj.is_undefined()) Fail(Describe(*e.items[0]) + " is undefined (slicing it)");
        auto part = [&](size_t i) { return e.items[i] ? Eval(*e.items[i], frame) : Value::None(); };
        return Slice(obj, part(1), part(2), part(3));
      }
      case Expr::Kind::kCall: {
        const Value callee = Eval(*e.items[0], frame);
        if (!callee.is_function()) {
          if (callee.is_undefined()) Fail(Describe(*e.items[0]) + " is undefined (calling it)");
          Fail(std::string("'") + callee.TypeName() + "' object is not callable");
        }
        CallArgs args = EvalArgs(e, 1, frame);
        return callee.function().call(args);
      }
      case Expr::Kind::kFilter: {
        const Value v = Eval(*e.items[0], frame);
        CallArgs args = EvalArgs(e, 1, frame);
        return e.filter(v, args);
      }
      case Expr::Kind::kTest: {
        const Value v = Eval(*e.items[0], frame);
        CallArgs args = EvalArgs(e, 1, frame);
        return Value(e.test(v, args) != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = Eval(*e.items[0], frame);
        if (!v.is_number()) Fail(std::string("bad operand type for unary ") + (e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + v.TypeName() + "'");
        if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
        if (v.is_float()) return Value(-v.as_float());
        if (v.as_int() == std::numeric_limits<int64_t>::min()) Fail("integer overflow");
        return Value(-v.as_int());
      }
      case Expr::Kind::kNot: return Value(!Eval(*e.items[0], frame).Truthy());
      case Expr::Kind::kBinary: {
        const BinOp op = e.ops[0];
        Value a = Eval(*e.items[0], frame);
        if (op == BinOp::kAnd) return a.Truthy() ? Eval(*e.items[1], frame) : a;
        if (op == BinOp::kOr) return a.Truthy() ? a : Eval(*e.items[1], frame);
        return Arith(op, a, Eval(*e.items[1], frame));
      }
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.items[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.items[i + 1], frame);
          if (!At(e.items[i + 1]->pos, [&] { return CompareOp(e.ops[i], left, right); })) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kTernary:
        if (Eval(*e.items[1], frame).Truthy()) return Eval(*e.items[0], frame);
        return e.items[2] ? Eval(*e.items[2], frame) : Value();
    }
    Fail("bad expression");
  }

  const Program& program_;
  const Value& context_;
  RenderState* state_;
  const Frame* root_ = nullptr;
};

Value Evaluator::CallMacro(const Stmt& macro, CallArgs& args) {
  if (state_->call_depth >= state_->limits->max_call_depth) Fail("macro calls nested too deeply");
  if (args.positional.size() > macro.params.size()) Fail("macro '" + macro.text + "' takes " + std::to_string(macro.params.size()) + " arguments");
  Frame f{root_, {}};
  std::vector<bool> given(macro.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    f.Set(macro.params[i].name, args.positional[i]);
    given[i] = true;
  }
  for (auto& [name, v] : args.named) {
    size_t k = 0;
    while (k < macro.params.size() && macro.params[k].name != name) ++k;
    if (k == macro.params.size()) Fail("macro '" + macro.text + "' has no argument '" + name + "'");
    f.Set(name, v);
    given[k] = true;
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    if (given[i]) continue;
    const MacroParam& p = macro.params[i];
    f.Set(p.name, p.default_value ? Eval(*p.default_value, f) : Value());
  }
  ++state_->call_depth;
  std::string out;
  try {
    Exec(macro.body, f, &out);
  } catch (...) {
    --state_->call_depth;
    throw;
  }
  --state_->call_depth;
  return Value(std::move(out));
}

Value Evaluator::Global(std::string_view name) {
  if (name == "range") {
    return Value::MakeFunction("range", [](CallArgs& args) {
      std::vector<int64_t> p;
      for (const Value& v : args.positional) {
        if (!IsIntLike(v)) Fail("range() arguments must be integers");
        p.push_back(v.as_int());
      }
      if (p.empty() || p.size() > 3) Fail("range() takes 1 to 3 arguments");
      const int64_t start = p.size() == 1 ? 0 : p[0];
      const int64_t stop = p.size() == 1 ? p[0] : p[1];
      const int64_t step = p.size() == 3 ? p[2] : 1;
      if (step == 0) Fail("range() step must not be zero");
      List l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        CountIterations(1);
        l.push_back(Value(i));
        if ((step > 0 && i > std::numeric_limits<int64_t>::max() - step) ||
            (step < 0 && i < std::numeric_limits<int64_t>::min() - step)) {
          break;
        }
      }
      return Value(std::move(l));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::MakeFunction(std::string(name), [ns](CallArgs& args) {
      Dict d;
      d.is_namespace = ns;
      for (const Value& v : args.positional) {
        if (!v.is_dict()) Fail("namespace() / dict() positional arguments must be dicts");
        for (const auto& [k, x] : v.dict().items) d.Set(k, x);
      }
      for (auto& [k, v] : args.named) d.Set(k, v);
      Value v(std::move(d));
      // {% set ns.self = ns %} would make a reference cycle: remember namespaces to clear them.
      if (ns && g_state != nullptr) g_state->namespaces.push_back(v);
      return v;
    });
  }
  if (name == "raise_exception") {
    return Value::MakeFunction("raise_exception", [](CallArgs& args) -> Value {
      Fail("raise_exception: " + (args.positional.empty() ? std::string() : ToStr(args.positional[0])));
    });
  }
  return Value();
}

}  // namespace

size_t MaxStringBytes() { return (g_state ? g_state->limits : &kDefaultLimits)->max_output_bytes; }

void CheckStringSize(size_t n) {
  if (n > MaxStringBytes()) Fail("string exceeds the size limit");
}

void CountIterations(uint64_t n) {
  if (g_state == nullptr) return;
  const uint64_t max = g_state->limits->max_loop_iterations;
  if (n > max || g_state->iterations > max - n) Fail("loop iteration limit exceeded");  // no wrap-around
  g_state->iterations += n;
}

}  // namespace internal

Result<Template> Template::Parse(std::string_view source) {
  auto program = std::make_shared<internal::Program>();
  program->source = internal::NormalizeNewlines(source);
  try {
    program->body = internal::Parse(internal::Lex(program->source));
  } catch (const internal::JinjaError& e) {
    return MakeError("template syntax error at %s: %s", internal::Where(program->source, e.pos).c_str(),
                     e.message.c_str());
  } catch (const std::bad_alloc&) {
    spdlog::warn("chat template: parsing ran out of memory");
    return MakeError("template parse failed: out of memory");
  } catch (const std::exception& e) {
    // Library text names internal types and values: it goes to the log, never to a caller (whose
    // message may reach a client).
    spdlog::warn("chat template: parsing stopped by an exception: {}", e.what());
    return MakeError("template parse failed: an internal error stopped the parser");
  } catch (...) {
    spdlog::warn("chat template: parsing stopped by an unknown exception");
    return MakeError("template parse failed: an internal error stopped the parser");
  }
  Template t;
  t.program_ = std::move(program);
  return t;
}

Result<std::string> Template::Render(const Value& context, const Limits& limits) const {
  internal::RenderState state;
  state.limits = &limits;
  state.stack_base = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  internal::RenderState* saved = internal::g_state;
  internal::g_state = &state;
  std::string out;
  Result<std::string> result = Error{};
  try {
    internal::Evaluator(*program_, context, &state).Run(&out);
    result = std::move(out);
  } catch (const internal::JinjaError& e) {
    result = MakeError("%s (template %s)", e.message.c_str(), internal::Where(program_->source, e.pos).c_str());
  } catch (const std::bad_alloc&) {
    spdlog::warn("chat template: rendering ran out of memory");
    result = MakeError("template rendering failed: out of memory");
  } catch (const std::exception& e) {  // as in Parse: the library's text is logged, not returned
    spdlog::warn("chat template: rendering stopped by an exception: {}", e.what());
    result = MakeError("template rendering failed: an internal error stopped the renderer");
  } catch (...) {
    spdlog::warn("chat template: rendering stopped by an unknown exception");
    result = MakeError("template rendering failed: an internal error stopped the renderer");
  }
  for (const Value& ns : state.namespaces) ns.mutable_dict().items.clear();  // break cycles
  internal::g_state = saved;
  return result;
}

const std::string& Template::source() const { return program_->source; }

}  // namespace mnemo::jinja
