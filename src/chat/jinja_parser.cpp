// Parser: tokens -> AST, with Jinja2's operator precedence:
//   ternary < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary - + < filters/tests
//   < postfix (.attr [index] (call)) < primary.
#include <initializer_list>

#include "chat/jinja_internal.h"

namespace mnemo::jinja::internal {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body Program() {
    Body body = ParseBody({});
    if (Cur().kind != Tok::kEnd) Fail(Cur().pos, "unexpected tag");
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void Next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool IsOp(const char* op) const { return Cur().kind == Tok::kOp && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().kind == Tok::kName && Cur().text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(Cur().pos, std::string("expected '") + op + "'" + Got());
  }
  std::string ExpectName() {
    if (Cur().kind != Tok::kName) Fail(Cur().pos, "expected a name" + Got());
    std::string s = Cur().text;
    Next();
    return s;
  }
  void ExpectBlockEnd() {
    if (Cur().kind != Tok::kBlockEnd) Fail(Cur().pos, "expected '%}'" + Got());
    Next();
  }
  std::string Got() const {
    switch (Cur().kind) {
      case Tok::kEnd: return ", got end of template";
      case Tok::kVarEnd: return ", got '}}'";
      case Tok::kBlockEnd: return ", got '%}'";
      case Tok::kText: return ", got text";
      default: return ", got '" + Cur().text + "'";
    }
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxNesting) Fail(p->Cur().pos, "template nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  // Loops that wrap an expression in a new node (a + b + c, x.y.z, x | f | g) deepen the tree
  // without recursing: count each wrap as one level until the enclosing parse function returns.
  struct WrapGuard {
    explicit WrapGuard(Parser* p) : p(p) {}
    void Wrap() {
      ++n;
      if (++p->depth_ > kMaxNesting) Fail(p->Cur().pos, "expression nested too deeply");
    }
    ~WrapGuard() { p->depth_ -= n; }
    Parser* p;
    int n = 0;
  };

  static ExprPtr Node(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose keyword is in `stops` (left unconsumed) or the end.
  Body ParseBody(std::initializer_list<const char*> stops) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& tok = Cur();
      if (tok.kind == Tok::kEnd) {
        if (stops.size() > 0) Fail(tok.pos, std::string("missing '{% ") + *(stops.end() - 1) + " %}'");
        return body;
      }
      if (tok.kind == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = tok.pos;
        s->text = tok.text;
        body.push_back(std::move(s));
        Next();
      } else if (tok.kind == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = tok.pos;
        Next();
        s->expr = ParseExpr();
        if (Cur().kind != Tok::kVarEnd) Fail(Cur().pos, "expected '}}'" + Got());
        Next();
        body.push_back(std::move(s));
      } else if (tok.kind == Tok::kBlockBegin) {
        const Token& kw = Peek();
        if (kw.kind != Tok::kName) Fail(kw.pos, "expected a statement name");
        for (const char* stop : stops) {
          if (kw.text == stop) return body;
        }
        Next();
        body.push_back(ParseStatement());
      } else {
        Fail(tok.pos, "unexpected token");
      }
    }
  }

  // At a {% whose keyword is expected to be `name`: consumes "{% name".
  void ExpectTag(const char* name) {
    if (Cur().kind != Tok::kBlockBegin || Peek().text != name) Fail(Cur().pos, std::string("expected '{% ") + name + " %}'");
    Next();
    Next();
  }

  StmtPtr ParseStatement() {
    const Token& kw = Cur();
    const size_t pos = kw.pos;
    const std::string name = kw.text;
    Next();
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    if (name == "if") {
      s->kind = Stmt::Kind::kIf;
      ExprPtr cond = ParseExpr();
      ExpectBlockEnd();
      while (true) {
        Body body = ParseBody({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (Peek().text == "elif") {
          ExpectTag("elif");
          cond = ParseExpr();
          ExpectBlockEnd();
        } else if (Peek().text == "else") {
          ExpectTag("else");
          ExpectBlockEnd();
          s->branches.emplace_back(nullptr, ParseBody({"endif"}));
          ExpectTag("endif");
          break;
        } else {
          ExpectTag("endif");
          break;
        }
      }
      ExpectBlockEnd();
    } else if (name == "for") {
      s->kind = Stmt::Kind::kFor;
      const bool paren = SkipOp("(");
      do {
        s->targets.push_back(ExpectName());
      } while (SkipOp(","));
      if (paren) ExpectOp(")");
      if (!SkipName("in")) Fail(Cur().pos, "expected 'in'" + Got());
      s->expr = ParseTuple(/*with_ternary=*/false);
      if (SkipName("if")) s->cond = ParseExpr();
      if (IsName("recursive")) Fail(Cur().pos, "recursive loops are not supported");
      ExpectBlockEnd();
      ++loop_depth_;
      s->body = ParseBody({"else", "endfor"});
      --loop_depth_;
      if (Peek().text == "else") {
        ExpectTag("else");
        ExpectBlockEnd();
        s->else_body = ParseBody({"endfor"});
      }
      ExpectTag("endfor");
      ExpectBlockEnd();
    } else if (name == "set") {
      const bool paren = SkipOp("(");
      std::string first = ExpectName();
      if (!paren && SkipOp(".")) {
        s->text = first;  // namespace attribute assignment
        s->targets.push_back(ExpectName());
      } else {
        s->targets.push_back(first);
        while (SkipOp(",")) s->targets.push_back(ExpectName());
        if (paren) ExpectOp(")");
      }
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        s->expr = ParseTuple(/*with_ternary=*/true);
        ExpectBlockEnd();
      } else {
        if (!s->text.empty() || s->targets.size() != 1) Fail(Cur().pos, "expected '='" + Got());
        s->kind = Stmt::Kind::kSetBlock;
        ExpectBlockEnd();
        s->body = ParseBody({"endset"});
        ExpectTag("endset");
        ExpectBlockEnd();
      }
    } else if (name == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = ExpectName();
      ExpectOp("(");
      while (!IsOp(")")) {
        MacroParam p;
        p.name = ExpectName();
        if (SkipOp("=")) p.default_value = ParseExpr();
        s->params.push_back(std::move(p));
        if (!SkipOp(",")) break;
      }
      ExpectOp(")");
      ExpectBlockEnd();
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;  // break/continue cannot cross a macro
      s->body = ParseBody({"endmacro"});
      loop_depth_ = saved_loops;
      ExpectTag("endmacro");
      ExpectBlockEnd();
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) Fail(pos, "'" + name + "' outside of a loop");
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
    } else if (name == "generation") {
      s->kind = Stmt::Kind::kScope;
      ExpectBlockEnd();
      s->body = ParseBody({"endgeneration"});
      ExpectTag("endgeneration");
      ExpectBlockEnd();
    } else if (name == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->expr = ParseFilter(Node(Expr::Kind::kLiteral, pos));
      ExpectBlockEnd();
      s->body = ParseBody({"endfilter"});
      ExpectTag("endfilter");
      ExpectBlockEnd();
    } else if (name == "do") {
      s->kind = Stmt::Kind::kDo;
      s->expr = ParseTuple(/*with_ternary=*/true);
      ExpectBlockEnd();
    } else {
      Fail(pos, "unsupported or unknown tag '" + name + "'");
    }
    return s;
  }

  // ---- expressions ----

  // expr [, expr]* (a bare tuple becomes a list).
  ExprPtr ParseTuple(bool with_ternary) {
    const size_t pos = Cur().pos;
    ExprPtr first = with_ternary ? ParseExpr() : ParseOr();
    if (!IsOp(",")) return first;
    auto list = Node(Expr::Kind::kList, pos);
    list->items.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().kind == Tok::kBlockEnd || Cur().kind == Tok::kVarEnd) break;
      list->items.push_back(with_ternary ? ParseExpr() : ParseOr());
    }
    return list;
  }

  ExprPtr ParseExpr() {
    WrapGuard wrap(this);
    DepthGuard guard(this);
    ExprPtr e = ParseOr();
    while (IsName("if")) {
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      auto t = Node(Expr::Kind::kTernary, pos);
      ExprPtr cond = ParseOr();
      ExprPtr other = SkipName("else") ? ParseExpr() : nullptr;
      t->items.push_back(std::move(e));
      t->items.push_back(std::move(cond));
      t->items.push_back(std::move(other));
      e = std::move(t);
    }
    return e;
  }

  ExprPtr Binary(BinOp op, size_t pos, ExprPtr a, ExprPtr b) {
    auto e = Node(Expr::Kind::kBinary, pos);
    e->ops.push_back(op);
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseOr() {
    WrapGuard wrap(this);
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      e = Binary(BinOp::kOr, pos, std::move(e), ParseAnd());
    }
    return e;
  }

  ExprPtr ParseAnd() {
    WrapGuard wrap(this);
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      e = Binary(BinOp::kAnd, pos, std::move(e), ParseNot());
    }
    return e;
  }

  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (IsName("not")) {
      auto e = Node(Expr::Kind::kNot, Cur().pos);
      Next();
      e->items.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    WrapGuard wrap(this);
    const size_t pos = Cur().pos;
    ExprPtr first = ParseMath1();
    ExprPtr chain;
    while (true) {
      BinOp op;
      if (IsOp("==")) op = BinOp::kEq;
      else if (IsOp("!=")) op = BinOp::kNe;
      else if (IsOp("<")) op = BinOp::kLt;
      else if (IsOp("<=")) op = BinOp::kLe;
      else if (IsOp(">")) op = BinOp::kGt;
      else if (IsOp(">=")) op = BinOp::kGe;
      else if (IsName("in")) op = BinOp::kIn;
      else if (IsName("not") && Peek().kind == Tok::kName && Peek().text == "in") op = BinOp::kNotIn;
      else break;
      if (op == BinOp::kNotIn) Next();
      Next();
      wrap.Wrap();
      if (!chain) {
        chain = Node(Expr::Kind::kCompare, pos);
        chain->items.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      chain->items.push_back(ParseMath1());
    }
    return chain ? std::move(chain) : std::move(first);
  }

  ExprPtr ParseMath1() {
    WrapGuard wrap(this);
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const BinOp op = IsOp("+") ? BinOp::kAdd : BinOp::kSub;
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      e = Binary(op, pos, std::move(e), ParseConcat());
    }
    return e;
  }

  ExprPtr ParseConcat() {
    WrapGuard wrap(this);
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      e = Binary(BinOp::kConcat, pos, std::move(e), ParseMath2());
    }
    return e;
  }

  ExprPtr ParseMath2() {
    WrapGuard wrap(this);
    ExprPtr e = ParsePow();
    while (true) {
      BinOp op;
      if (IsOp("*")) op = BinOp::kMul;
      else if (IsOp("/")) op = BinOp::kDiv;
      else if (IsOp("//")) op = BinOp::kFloorDiv;
      else if (IsOp("%")) op = BinOp::kMod;
      else break;
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      e = Binary(op, pos, std::move(e), ParsePow());
    }
    return e;
  }

  ExprPtr ParsePow() {
    WrapGuard wrap(this);
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      wrap.Wrap();
      const size_t pos = Cur().pos;
      Next();
      e = Binary(BinOp::kPow, pos, std::move(e), ParseUnary(true));
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Node(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().pos);
      Next();
      e->items.push_back(ParseUnary(false));
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    DepthGuard guard(this);
    const Token& tok = Cur();
    const size_t pos = tok.pos;
    switch (tok.kind) {
      case Tok::kName: {
        auto e = Node(Expr::Kind::kLiteral, pos);
        if (tok.text == "true" || tok.text == "True") e->literal = Value(true);
        else if (tok.text == "false" || tok.text == "False") e->literal = Value(false);
        else if (tok.text == "none" || tok.text == "None") e->literal = Value::None();
        else {
          e->kind = Expr::Kind::kName;
          e->name = tok.text;
        }
        Next();
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (Cur().kind == Tok::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Next();
        }
        auto e = Node(Expr::Kind::kLiteral, pos);
        e->literal = Value(std::move(s));
        return e;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        auto e = Node(Expr::Kind::kLiteral, pos);
        e->literal = tok.kind == Tok::kInt ? Value(tok.i) : Value(tok.f);
        Next();
        return e;
      }
      case Tok::kOp:
        if (tok.text == "(") {
          Next();
          if (SkipOp(")")) return Node(Expr::Kind::kList, pos);  // empty tuple
          ExprPtr e = ParseExpr();
          if (IsOp(",")) {
            auto list = Node(Expr::Kind::kList, pos);
            list->items.push_back(std::move(e));
            while (SkipOp(",")) {
              if (IsOp(")")) break;
              list->items.push_back(ParseExpr());
            }
            e = std::move(list);
          }
          ExpectOp(")");
          return e;
        }
        if (tok.text == "[") {
          Next();
          auto e = Node(Expr::Kind::kList, pos);
          while (!IsOp("]")) {
            e->items.push_back(ParseExpr());
            if (!SkipOp(",")) break;
          }
          ExpectOp("]");
          return e;
        }
        if (tok.text == "{") {
          Next();
          auto e = Node(Expr::Kind::kDict, pos);
          while (!IsOp("}")) {
            e->items.push_back(ParseExpr());
            ExpectOp(":");
            e->items.push_back(ParseExpr());
            if (!SkipOp(",")) break;
          }
          ExpectOp("}");
          return e;
        }
        break;
      default: break;
    }
    Fail(pos, "expected an expression" + Got());
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    WrapGuard wrap(this);
    while (true) {
      const size_t pos = Cur().pos;
      if (IsOp(".") || IsOp("[") || IsOp("(")) wrap.Wrap();
      if (SkipOp(".")) {
        if (Cur().kind == Tok::kInt) {
          auto idx = Node(Expr::Kind::kIndex, pos);
          auto lit = Node(Expr::Kind::kLiteral, Cur().pos);
          lit->literal = Value(Cur().i);
          Next();
          idx->items.push_back(std::move(e));
          idx->items.push_back(std::move(lit));
          e = std::move(idx);
        } else {
          auto attr = Node(Expr::Kind::kAttr, pos);
          attr->name = ExpectName();
          attr->items.push_back(std::move(e));
          e = std::move(attr);
        }
      } else if (SkipOp("[")) {
        e = ParseSubscript(std::move(e), pos);
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr obj, size_t pos) {
    ExprPtr start = IsOp(":") ? nullptr : ParseExpr();
    if (!SkipOp(":")) {
      ExpectOp("]");
      auto e = Node(Expr::Kind::kIndex, pos);
      e->items.push_back(std::move(obj));
      e->items.push_back(std::move(start));
      return e;
    }
    ExprPtr stop = (IsOp("]") || IsOp(":")) ? nullptr : ParseExpr();
    ExprPtr step;
    if (SkipOp(":") && !IsOp("]")) step = ParseExpr();
    ExpectOp("]");
    auto e = Node(Expr::Kind::kSlice, pos);
    e->items.push_back(std::move(obj));
    e->items.push_back(std::move(start));
    e->items.push_back(std::move(stop));
    e->items.push_back(std::move(step));
    return e;
  }

  // '(' args ')': positional then keyword arguments appended to e->items / e->named.
  void ParseArgs(Expr* e) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) Fail(Cur().pos, "*args and **kwargs are not supported");
      if (Cur().kind == Tok::kName && Peek().kind == Tok::kOp && Peek().text == "=") {
        std::string name = Cur().text;
        Next();
        Next();
        e->named.emplace_back(std::move(name), ParseExpr());
      } else {
        if (!e->named.empty()) Fail(Cur().pos, "positional argument after keyword argument");
        e->items.push_back(ParseExpr());
      }
      if (!SkipOp(",")) break;
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto e = Node(Expr::Kind::kCall, callee->pos);  // errors point at the callee
    e->items.push_back(std::move(callee));
    ParseArgs(e.get());
    return e;
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    WrapGuard wrap(this);
    while (true) {
      if (IsOp("|") || IsName("is") || IsOp("(")) wrap.Wrap();
      if (IsOp("|")) {
        Next();
        e = ParseFilter(std::move(e));
      } else if (IsName("is")) {
        e = ParseTest(std::move(e));
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e));
      } else {
        return e;
      }
    }
  }

  // After '|': name [ '(' args ')' ].
  ExprPtr ParseFilter(ExprPtr value) {
    const size_t pos = Cur().pos;
    auto e = Node(Expr::Kind::kFilter, pos);
    e->name = ExpectName();
    e->filter = FindFilter(e->name);
    if (e->filter == nullptr) Fail(pos, "unknown filter '" + e->name + "'");
    e->items.push_back(std::move(value));
    if (IsOp("(")) ParseArgs(e.get());
    return e;
  }

  ExprPtr ParseTest(ExprPtr value) {
    const size_t pos = Cur().pos;
    Next();  // is
    auto e = Node(Expr::Kind::kTest, pos);
    e->negated = SkipName("not");
    e->name = ExpectName();
    // `is none` / `is true` / `is false` are names of tests, not literals.
    e->test = FindTest(e->name);
    if (e->test == nullptr) Fail(pos, "unknown test '" + e->name + "'");
    e->items.push_back(std::move(value));
    if (IsOp("(")) {
      ParseArgs(e.get());
    } else {
      const Token& tok = Cur();
      const bool arg_start = tok.kind == Tok::kString || tok.kind == Tok::kInt || tok.kind == Tok::kFloat ||
                             (tok.kind == Tok::kOp && (tok.text == "[" || tok.text == "{")) ||
                             (tok.kind == Tok::kName && tok.text != "else" && tok.text != "or" &&
                              tok.text != "and" && tok.text != "if" && tok.text != "in" && tok.text != "not" &&
                              tok.text != "is");
      if (arg_start) e->items.push_back(ParsePostfix(ParsePrimary()));
    }
    return e;
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body Parse(const std::vector<Token>& tokens) { return Parser(tokens).Program(); }

}  // namespace mnemo::jinja::internal
