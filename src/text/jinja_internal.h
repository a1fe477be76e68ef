#pragma once
// Internal to the Jinja engine (jinja.h): the types its stages share. The engine renders a Hugging
// Face chat template in three stages, one file each:
//
//   1. Lex (jinja_lexer.cc): the source is cut into text and tags, whitespace control applied,
//      the inside of each tag tokenised.
//   2. Parse (jinja_parser.cc): recursive descent into the statements and expressions below.
//   3. Render (jinja_renderer.cc): a tree walk over JSON values with jinja2's Undefined semantics
//      and Python's truthiness, comparison and arithmetic; the filters, tests, string and dict
//      methods and global functions it calls are in jinja_builtins.cc, and Python's str, repr
//      and json.dumps semantics in jinja_python.cc.
//
// Errors inside the engine are thrown as JinjaError and turned into a Status at the API edge
// (jinja.cc): an interpreter threads failures through every expression, and a Status per node
// would double the code without making a failure path clearer. Nothing else throws out of the
// engine.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace gyre::text::jinja {

using Json = nlohmann::ordered_json;

// Limits that keep a hostile or broken template from exhausting the process.
inline constexpr size_t kMaxOutputBytes = 16u << 20;  // rendered text, and any one string value
inline constexpr int64_t kMaxIterations = 1000000;    // loop iterations over the whole render
inline constexpr size_t kMaxElements = 1u << 20;      // elements in one constructed list or range
inline constexpr int kMaxParseDepth = 200;            // nested expressions and blocks
inline constexpr int kMaxCallDepth = 64;              // nested macro calls
// Nested statements and expressions, all macros together. Each level is a few C++ frames; under
// AddressSanitizer a level takes about 6 KB of stack, and 1,500 levels overflowed 8 MB.
inline constexpr int kMaxRenderDepth = 256;
inline constexpr int kMaxValueDepth = 512;        // nesting of lists and dicts
inline constexpr uint64_t kMaxWork = 256u << 20;  // bytes and entries of all values produced

// `located` is false for errors from helpers that do not know the line; the renderer adds the
// line of the statement being rendered.
struct JinjaError {
  std::string message;
  bool located = false;
};

[[noreturn]] inline void Fail(int line, const std::string& what) {
  throw JinjaError{"chat template line " + std::to_string(line) + ": " + what, true};
}
[[noreturn]] inline void FailAt(int line, int col, const std::string& what) {
  throw JinjaError{"chat template line " + std::to_string(line) + ", column " +
                       std::to_string(col) + ": " + what,
                   true};
}

// ------------------------------------------------------------------------------------------------
// Lexer output

struct Token {
  enum Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = kEnd;
  std::string text;  // name, decoded string, or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 0;
  int col = 0;
};

struct Segment {
  enum Kind { kText, kVar, kBlock };
  Kind kind = kText;
  std::string text;           // kText
  std::vector<Token> tokens;  // kVar/kBlock, ending with a kEnd token
  int line = 0;
  int col = 0;
};

// ------------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kList,
    kDict,
    kNeg,
    kPos,
    kBinary,
    kConcat,
    kCompare,
    kAnd,
    kOr,
    kNot,
    kCond,
    kFilter,
    kTest,
    kCall
  };
  Kind kind = kLiteral;
  int line = 0;
  Json literal;
  std::string name;           // variable, attribute, operator, filter or test name
  std::vector<ExprPtr> args;  // operands; args[0] is the subject of attr/item/filter/test/call
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: the operators between args
  bool negated = false;          // kTest: `is not`
  int height = 1;                // longest path to a leaf: bounds recursion in Eval
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kScope };
  Kind kind = kText;
  int line = 0;
  std::string text;                                     // kText
  ExprPtr expr;                                         // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf: conditions and bodies
  Body body;                                            // kFor, kSetBlock, kMacro, kScope
  Body else_body;                                       // kIf, kFor
  std::vector<std::string> targets;                     // kFor/kSet names; kSet `ns.attr`: {ns}
  std::string attr;                                     // kSet to a namespace attribute
  ExprPtr filter;                                       // kFor `if` condition
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: names and defaults
};

// ------------------------------------------------------------------------------------------------
// Values

struct Value;
using NamespaceMap = std::map<std::string, Value>;

struct Value {
  enum Kind { kUndefined, kJson, kNamespace, kMacro, kMethod, kFunction };
  Kind kind = kUndefined;
  Json json;                    // kJson; kMethod: the receiver
  NamespaceMap* ns = nullptr;   // kNamespace (owned by the Renderer, shared by every copy)
  const Node* macro = nullptr;  // kMacro
  std::string name;             // kUndefined: what was missing; kMethod/kFunction: which
  // A list that Python holds as a lazy object: a generator (select, map, items filter, reverse)
  // or a dict view (dict.items/keys/values). Iterating one works like a list; the operations
  // where Python's object behaves differently (printing, len or truthiness of a generator,
  // indexing) follow Python or fail.
  enum Lazy { kList, kGenerator, kView };
  Lazy lazy = kList;

  static Value Lazily(Json list, Lazy lazy) {
    Value v = Of(std::move(list));
    v.lazy = lazy;
    return v;
  }

  static Value Of(Json j) {
    Value v;
    v.kind = kJson;
    v.json = std::move(j);
    return v;
  }
  static Value Undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  bool defined() const { return kind != kUndefined; }
  bool is_string() const { return kind == kJson && json.is_string(); }
};

bool IsNumber(const Json& j);  // a number or a bool, as Python's int and float
bool IsInt(const Json& j);     // an integer or a bool
int64_t AsInt(const Json& j);  // throws past INT64_MAX
double AsDouble(const Json& j);
// Python's truthiness.
bool Truthy(const Value& v);
// Python ==.
bool JsonEqual(const Json& a, const Json& b);
bool ValueEqual(const Value& a, const Value& b);
// Number of JSON nodes in `j`, counting stops past `limit`.
size_t CountNodes(const Json& j, size_t limit, int depth = 0);

// ------------------------------------------------------------------------------------------------
// The stages

// The source cut into text and tags (jinja_lexer.cc).
std::vector<Segment> Lex(const std::string& source);
// The template's statements (jinja_parser.cc).
Body Parse(std::vector<Segment> segments);
// The text the template renders with `context`'s members as variables (jinja_renderer.cc).
std::string Render(const Body& root, const Json& context);

}  // namespace gyre::text::jinja
