// The Jinja engine's second stage (jinja_internal.h): recursive descent into statements
// (if/for/set/macro/...) and expressions, following jinja2's parser precedence (or < and < not <
// comparisons < + - < ~ < * / // % < ** < unary, postfix, filters and tests).

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_internal.h"

namespace gyre::text::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body ParseTemplate() {
    std::string end;
    Body body = ParseBody({}, &end, 0, 0, "");
    return body;
  }

 private:
  // Parses nodes until a block tag whose first name is in `ends` (returned in *end, tokens
  // positioned after it). At the end of input with `ends` non-empty, fails naming the opener.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end, int open_line, int depth,
                 const std::string& opener) {
    if (depth > kMaxParseDepth) Fail(open_line, "blocks nested too deeply");
    Body body;
    while (seg_ < segments_.size()) {
      Segment& s = segments_[seg_];
      if (s.kind == Segment::kText) {
        Node n;
        n.kind = Node::kText;
        n.line = s.line;
        n.text = s.text;
        body.push_back(std::move(n));
        ++seg_;
        continue;
      }
      tokens_ = &s.tokens;
      tok_ = 0;
      if (s.kind == Segment::kVar) {
        Node n;
        n.kind = Node::kOutput;
        n.line = s.line;
        n.expr = ParseExpression(0);
        ExpectEnd();
        body.push_back(std::move(n));
        ++seg_;
        continue;
      }
      const Token& first = Peek();
      if (first.type != Token::kName) FailAt(first.line, first.col, "expected a tag name");
      const std::string tag = first.text;
      if (std::find(ends.begin(), ends.end(), tag) != ends.end()) {
        ++tok_;
        *end = tag;
        ++seg_;
        return body;
      }
      ++tok_;
      ++seg_;
      body.push_back(ParseTag(tag, first, depth));
    }
    if (!ends.empty()) {
      Fail(open_line, "'" + opener + "' is never closed (expected '" + ends.back() + "')");
    }
    return body;
  }

  Node ParseTag(const std::string& tag, const Token& first, int depth) {
    Node n;
    n.line = first.line;
    if (tag == "if") {
      n.kind = Node::kIf;
      ExprPtr cond = ParseExpression(0, /*no_cond=*/true);
      ExpectEnd();
      while (true) {
        std::string end;
        Body body = ParseBody({"elif", "else", "endif"}, &end, n.line, depth + 1, "if");
        n.branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = ParseExpression(0, /*no_cond=*/true);
          ExpectEnd();
          continue;
        }
        if (end == "else") {
          ExpectEnd();
          n.else_body = ParseBody({"endif"}, &end, n.line, depth + 1, "if");
        }
        ExpectEnd();
        break;
      }
    } else if (tag == "for") {
      n.kind = Node::kFor;
      n.targets = ParseTargets();
      ExpectName("in");
      n.expr = ParseExpression(0, /*no_cond=*/true);
      if (PeekName("if")) {
        ++tok_;
        n.filter = ParseExpression(0, /*no_cond=*/true);
      }
      if (PeekName("recursive")) {
        FailAt(Peek().line, Peek().col, "unsupported: recursive for loops");
      }
      ExpectEnd();
      std::string end;
      n.body = ParseBody({"else", "endfor"}, &end, n.line, depth + 1, "for");
      if (end == "else") {
        ExpectEnd();
        n.else_body = ParseBody({"endfor"}, &end, n.line, depth + 1, "for");
      }
      ExpectEnd();
    } else if (tag == "set") {
      const Token& t = Peek();
      if (t.type != Token::kName) FailAt(t.line, t.col, "expected a name after 'set'");
      if (tok_ + 1 < tokens_->size() && (*tokens_)[tok_ + 1].text == "." &&
          (*tokens_)[tok_ + 1].type == Token::kOp) {
        n.targets = {t.text};
        tok_ += 2;
        const Token& a = Peek();
        if (a.type != Token::kName) FailAt(a.line, a.col, "expected an attribute name");
        n.attr = a.text;
        ++tok_;
      } else {
        n.targets = ParseTargets();
      }
      if (Peek().type == Token::kEnd) {
        if (n.targets.size() != 1 || !n.attr.empty()) {
          FailAt(t.line, t.col, "a block set takes one plain name");
        }
        ExpectEnd();
        n.kind = Node::kSetBlock;
        std::string end;
        n.body = ParseBody({"endset"}, &end, n.line, depth + 1, "set");
        ExpectEnd();
      } else {
        n.kind = Node::kSet;
        ExpectOp("=");
        n.expr = ParseTupleOrExpression();
        ExpectEnd();
      }
    } else if (tag == "macro") {
      n.kind = Node::kMacro;
      const Token& t = Peek();
      if (t.type != Token::kName) FailAt(t.line, t.col, "expected a macro name");
      n.name = t.text;
      ++tok_;
      ExpectOp("(");
      while (!PeekOp(")")) {
        const Token& p = Peek();
        if (p.type != Token::kName) FailAt(p.line, p.col, "expected a parameter name");
        ++tok_;
        ExprPtr def;
        if (PeekOp("=")) {
          ++tok_;
          def = ParseExpression(0);
        }
        n.params.emplace_back(p.text, std::move(def));
        if (!PeekOp(",")) break;
        ++tok_;
      }
      ExpectOp(")");
      ExpectEnd();
      std::string end;
      n.body = ParseBody({"endmacro"}, &end, n.line, depth + 1, "macro");
      if (Peek().type == Token::kName && Peek().text == n.name) ++tok_;
      ExpectEnd();
    } else if (tag == "break" || tag == "continue") {
      n.kind = tag == "break" ? Node::kBreak : Node::kContinue;
      ExpectEnd();
    } else if (tag == "generation") {
      // transformers' AssistantTracker: the body renders as is.
      n.kind = Node::kScope;
      ExpectEnd();
      std::string end;
      n.body = ParseBody({"endgeneration"}, &end, n.line, depth + 1, "generation");
      ExpectEnd();
    } else if (tag == "elif" || tag == "else" || tag == "endif" || tag == "endfor" ||
               tag == "endset" || tag == "endmacro" || tag == "endgeneration") {
      FailAt(first.line, first.col, "unexpected '" + tag + "': no open block here expects it");
    } else {
      FailAt(first.line, first.col, "unsupported tag '" + tag + "'");
    }
    return n;
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = PeekOp("(");
    if (paren) ++tok_;
    while (true) {
      const Token& t = Peek();
      if (t.type != Token::kName) FailAt(t.line, t.col, "expected a variable name");
      names.push_back(t.text);
      ++tok_;
      if (!PeekOp(",")) break;
      ++tok_;
    }
    if (paren) ExpectOp(")");
    return names;
  }

  const Token& Peek() const { return (*tokens_)[tok_]; }
  bool PeekOp(const char* op) const { return Peek().type == Token::kOp && Peek().text == op; }
  bool PeekName(const char* name) const {
    return Peek().type == Token::kName && Peek().text == name;
  }
  void ExpectOp(const char* op) {
    if (!PeekOp(op)) Unexpected(std::string("'") + op + "'");
    ++tok_;
  }
  void ExpectName(const char* name) {
    if (!PeekName(name)) Unexpected(std::string("'") + name + "'");
    ++tok_;
  }
  void ExpectEnd() {
    if (Peek().type != Token::kEnd) Unexpected("the end of the tag");
  }
  [[noreturn]] void Unexpected(const std::string& expected) const {
    const Token& t = Peek();
    const std::string got = t.type == Token::kEnd      ? "the end of the tag"
                            : t.type == Token::kString ? "a string"
                                                       : "'" + t.text + "'";
    FailAt(t.line, t.col, "expected " + expected + ", got " + got);
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // `a, b` as a list (set targets' right-hand side).
  ExprPtr ParseTupleOrExpression() {
    const int line = Peek().line;
    ExprPtr first = ParseExpression(0);
    if (!PeekOp(",")) return first;
    ExprPtr list = Make(Expr::kList, line);
    list->args.push_back(std::move(first));
    while (PeekOp(",")) {
      ++tok_;
      if (Peek().type == Token::kEnd) break;
      list->args.push_back(ParseExpression(0));
    }
    return list;
  }

  void Deeper(int depth) const {
    if (depth > kMaxParseDepth) FailAt(Peek().line, Peek().col, "expression nested too deeply");
  }

  ExprPtr ParseExpression(int depth, bool no_cond = false) {
    Deeper(depth);
    ExprPtr e = ParseOr(depth + 1);
    if (no_cond) return e;
    while (PeekName("if")) {
      const int line = Peek().line;
      ++tok_;
      ExprPtr cond = ParseOr(depth + 1);
      ExprPtr other;
      if (PeekName("else")) {
        ++tok_;
        other = ParseExpression(depth + 1);
      }
      ExprPtr c = Make(Expr::kCond, line);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = Seal(std::move(c));
    }
    return e;
  }

  ExprPtr ParseOr(int depth) {
    Deeper(depth);
    ExprPtr e = ParseAnd(depth + 1);
    while (PeekName("or")) {
      ExprPtr b = Make(Expr::kOr, Peek().line);
      ++tok_;
      b->args.push_back(std::move(e));
      b->args.push_back(ParseAnd(depth + 1));
      e = Seal(std::move(b));
    }
    return e;
  }

  ExprPtr ParseAnd(int depth) {
    Deeper(depth);
    ExprPtr e = ParseNot(depth + 1);
    while (PeekName("and")) {
      ExprPtr b = Make(Expr::kAnd, Peek().line);
      ++tok_;
      b->args.push_back(std::move(e));
      b->args.push_back(ParseNot(depth + 1));
      e = Seal(std::move(b));
    }
    return e;
  }

  ExprPtr ParseNot(int depth) {
    Deeper(depth);
    if (PeekName("not")) {
      ExprPtr n = Make(Expr::kNot, Peek().line);
      ++tok_;
      n->args.push_back(ParseNot(depth + 1));
      return Seal(std::move(n));
    }
    return ParseCompare(depth + 1);
  }

  ExprPtr ParseCompare(int depth) {
    Deeper(depth);
    const int line = Peek().line;
    ExprPtr first = ParseMath1(depth + 1);
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.type == Token::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                   t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = t.text;
        ++tok_;
      } else if (PeekName("in")) {
        op = "in";
        ++tok_;
      } else if (PeekName("not") && tok_ + 1 < tokens_->size() &&
                 (*tokens_)[tok_ + 1].type == Token::kName && (*tokens_)[tok_ + 1].text == "in") {
        op = "not in";
        tok_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(ParseMath1(depth + 1));
    }
    return cmp ? Seal(std::move(cmp)) : std::move(first);
  }

  // Records e's height and rejects trees deeper than the renderer may recurse: a chain such as
  // `1+1+...+1` is parsed by a loop, not recursion, so the parse depth alone does not bound it.
  ExprPtr Seal(ExprPtr e) {
    for (const ExprPtr& a : e->args) {
      if (a) e->height = std::max(e->height, a->height + 1);
    }
    for (const auto& kv : e->kwargs) e->height = std::max(e->height, kv.second->height + 1);
    if (e->height > kMaxParseDepth) {
      FailAt(Peek().line, Peek().col, "expression nested too deeply");
    }
    return e;
  }

  ExprPtr Binary(const std::string& op, int line, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(op == "~" ? Expr::kConcat : Expr::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseMath1(int depth) {
    Deeper(depth);
    ExprPtr e = ParseConcat(depth + 1);
    while (PeekOp("+") || PeekOp("-")) {
      const std::string op = Peek().text;
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary(op, line, std::move(e), ParseConcat(depth + 1)));
    }
    return e;
  }

  ExprPtr ParseConcat(int depth) {
    Deeper(depth);
    ExprPtr e = ParseMath2(depth + 1);
    while (PeekOp("~")) {
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary("~", line, std::move(e), ParseMath2(depth + 1)));
    }
    return e;
  }

  ExprPtr ParseMath2(int depth) {
    Deeper(depth);
    ExprPtr e = ParsePow(depth + 1);
    while (PeekOp("*") || PeekOp("/") || PeekOp("//") || PeekOp("%")) {
      const std::string op = Peek().text;
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary(op, line, std::move(e), ParsePow(depth + 1)));
    }
    return e;
  }

  ExprPtr ParsePow(int depth) {
    Deeper(depth);
    ExprPtr e = ParseUnary(depth + 1, true);
    while (PeekOp("**")) {
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary("**", line, std::move(e), ParseUnary(depth + 1, true)));
    }
    return e;
  }

  ExprPtr ParseUnary(int depth, bool with_filter) {
    Deeper(depth);
    ExprPtr e;
    if (PeekOp("-") || PeekOp("+")) {
      e = Make(PeekOp("-") ? Expr::kNeg : Expr::kPos, Peek().line);
      ++tok_;
      e->args.push_back(ParseUnary(depth + 1, false));
      e = Seal(std::move(e));
    } else {
      e = ParsePrimary(depth + 1);
    }
    e = ParsePostfix(std::move(e), depth + 1);
    if (with_filter) e = ParseFilterExpr(std::move(e), depth + 1);
    return e;
  }

  ExprPtr ParsePrimary(int depth) {
    Deeper(depth);
    const Token& t = Peek();
    switch (t.type) {
      case Token::kName: {
        ++tok_;
        ExprPtr e = Make(Expr::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->literal = true;
        } else if (t.text == "false" || t.text == "False") {
          e->literal = false;
        } else if (t.text == "none" || t.text == "None") {
          e->literal = nullptr;
        } else {
          e->kind = Expr::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::kString: {
        ExprPtr e = Make(Expr::kLiteral, t.line);
        std::string s;
        while (Peek().type == Token::kString) s += (*tokens_)[tok_++].text;
        e->literal = s;
        return e;
      }
      case Token::kInt: {
        ++tok_;
        ExprPtr e = Make(Expr::kLiteral, t.line);
        e->literal = t.int_value;
        return e;
      }
      case Token::kFloat: {
        ++tok_;
        ExprPtr e = Make(Expr::kLiteral, t.line);
        e->literal = t.float_value;
        return e;
      }
      case Token::kOp:
        if (t.text == "(") {
          ++tok_;
          if (PeekOp(")")) {
            ++tok_;
            ExprPtr e = Make(Expr::kList, t.line);  // the empty tuple
            return e;
          }
          ExprPtr e = ParseExpression(depth + 1);
          if (PeekOp(",")) {
            ExprPtr list = Make(Expr::kList, t.line);
            list->args.push_back(std::move(e));
            while (PeekOp(",")) {
              ++tok_;
              if (PeekOp(")")) break;
              list->args.push_back(ParseExpression(depth + 1));
            }
            e = Seal(std::move(list));
          }
          ExpectOp(")");
          return e;
        }
        if (t.text == "[") {
          ++tok_;
          ExprPtr e = Make(Expr::kList, t.line);
          while (!PeekOp("]")) {
            e->args.push_back(ParseExpression(depth + 1));
            if (!PeekOp(",")) break;
            ++tok_;
          }
          ExpectOp("]");
          return Seal(std::move(e));
        }
        if (t.text == "{") {
          ++tok_;
          ExprPtr e = Make(Expr::kDict, t.line);
          while (!PeekOp("}")) {
            e->args.push_back(ParseExpression(depth + 1));
            ExpectOp(":");
            e->args.push_back(ParseExpression(depth + 1));
            if (!PeekOp(",")) break;
            ++tok_;
          }
          ExpectOp("}");
          return Seal(std::move(e));
        }
        break;
      default:
        break;
    }
    Unexpected("an expression");
  }

  void ParseCallArgs(Expr* call, int depth) {
    ExpectOp("(");
    while (!PeekOp(")")) {
      if (PeekOp("*") || PeekOp("**")) {
        FailAt(Peek().line, Peek().col, "unsupported: *args/**kwargs in a call");
      }
      if (Peek().type == Token::kName && tok_ + 1 < tokens_->size() &&
          (*tokens_)[tok_ + 1].type == Token::kOp && (*tokens_)[tok_ + 1].text == "=") {
        const std::string key = Peek().text;
        tok_ += 2;
        call->kwargs.emplace_back(key, ParseExpression(depth + 1));
      } else {
        if (!call->kwargs.empty()) {
          FailAt(Peek().line, Peek().col, "positional argument after a keyword argument");
        }
        call->args.push_back(ParseExpression(depth + 1));
      }
      if (!PeekOp(",")) break;
      ++tok_;
    }
    ExpectOp(")");
  }

  ExprPtr ParsePostfix(ExprPtr e, int depth) {
    while (true) {
      Deeper(depth);
      const Token& t = Peek();
      if (PeekOp(".")) {
        ++tok_;
        const Token& a = Peek();
        ExprPtr g;
        if (a.type == Token::kName) {
          g = Make(Expr::kAttr, a.line);
          g->name = a.text;
        } else if (a.type == Token::kInt) {
          g = Make(Expr::kItem, a.line);
          ExprPtr idx = Make(Expr::kLiteral, a.line);
          idx->literal = a.int_value;
          g->args.push_back(nullptr);
          g->args.push_back(std::move(idx));
        } else {
          Unexpected("an attribute name");
        }
        ++tok_;
        if (g->kind == Expr::kAttr) {
          g->args.push_back(std::move(e));
        } else {
          g->args[0] = std::move(e);
        }
        e = Seal(std::move(g));
      } else if (PeekOp("[")) {
        ++tok_;
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!PeekOp(":") && !PeekOp("]")) parts[k] = ParseExpression(depth + 1);
          if (k < 2 && PeekOp(":")) {
            is_slice = true;
            ++tok_;
          } else {
            break;
          }
        }
        ExpectOp("]");
        ExprPtr g = Make(is_slice ? Expr::kSlice : Expr::kItem, t.line);
        if (!is_slice && !parts[0]) FailAt(t.line, t.col, "expected an index inside []");
        g->args.push_back(std::move(e));
        g->args.push_back(std::move(parts[0]));
        if (is_slice) {
          g->args.push_back(std::move(parts[1]));
          g->args.push_back(std::move(parts[2]));
        }
        e = Seal(std::move(g));
      } else if (PeekOp("(")) {
        ExprPtr c = Make(Expr::kCall, t.line);
        c->args.push_back(std::move(e));
        ParseCallArgs(c.get(), depth + 1);
        e = Seal(std::move(c));
      } else {
        return e;
      }
    }
  }

  std::string DottedName() {
    const Token& t = Peek();
    if (t.type != Token::kName) Unexpected("a filter or test name");
    std::string name = t.text;
    ++tok_;
    while (PeekOp(".") && tok_ + 1 < tokens_->size() && (*tokens_)[tok_ + 1].type == Token::kName) {
      name += "." + (*tokens_)[tok_ + 1].text;
      tok_ += 2;
    }
    return name;
  }

  ExprPtr ParseFilterExpr(ExprPtr e, int depth) {
    while (true) {
      Deeper(depth);
      if (PeekOp("|")) {
        const int line = Peek().line;
        ++tok_;
        ExprPtr f = Make(Expr::kFilter, line);
        f->name = DottedName();
        f->args.push_back(std::move(e));
        if (PeekOp("(")) ParseCallArgs(f.get(), depth + 1);
        e = Seal(std::move(f));
      } else if (PeekName("is")) {
        const int line = Peek().line;
        ++tok_;
        ExprPtr test = Make(Expr::kTest, line);
        if (PeekName("not")) {
          test->negated = true;
          ++tok_;
        }
        test->name = DottedName();
        test->args.push_back(std::move(e));
        // As jinja2: `x is none is number` is an error (a test cannot take `is` as argument).
        if (PeekName("is"))
          FailAt(Peek().line, Peek().col, "cannot chain multiple tests with 'is'");
        const Token& n = Peek();
        if (PeekOp("(")) {
          ParseCallArgs(test.get(), depth + 1);
        } else if ((n.type == Token::kName || n.type == Token::kString || n.type == Token::kInt ||
                    n.type == Token::kFloat || PeekOp("[") || PeekOp("{")) &&
                   !(n.type == Token::kName &&
                     (n.text == "else" || n.text == "or" || n.text == "and" || n.text == "if" ||
                      n.text == "in" || n.text == "is" || n.text == "not"))) {
          test->args.push_back(ParsePostfix(ParsePrimary(depth + 1), depth + 1));
        }
        e = Seal(std::move(test));
      } else if (PeekOp("(")) {
        ExprPtr c = Make(Expr::kCall, Peek().line);
        c->args.push_back(std::move(e));
        ParseCallArgs(c.get(), depth + 1);
        e = Seal(std::move(c));
      } else {
        return e;
      }
    }
  }

  std::vector<Segment> segments_;
  size_t seg_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t tok_ = 0;
};

}  // namespace

Body Parse(std::vector<Segment> segments) { return Parser(std::move(segments)).ParseTemplate(); }

}  // namespace gyre::text::jinja
