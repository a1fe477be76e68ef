#pragma once
// Internal to the Jinja engine (jinja_internal.h): the renderer, a tree walk over the parsed
// template. Its evaluation is in jinja_renderer.cc, the builtins it calls (global functions,
// string and dict methods, tests, filters) in jinja_builtins.cc. One Renderer renders once, on
// one thread.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/jinja_internal.h"

namespace gyre::text::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr.
  const Value* Get(size_t index, const char* name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  explicit Renderer(const Body* root) : root_(root) {}

  // Renders the template with `context`'s members as global variables.
  std::string Run(const Json& context);

 private:
  // Counts nested RenderNode/Eval frames so the C++ stack stays bounded.
  struct DepthGuard {
    DepthGuard(int* depth, int line) : depth_(depth) {
      if (++*depth_ > kMaxRenderDepth) {
        --*depth_;
        Fail(line, "template nests too deeply while rendering (macro recursion?)");
      }
    }
    ~DepthGuard() { --*depth_; }
    int* depth_;
  };

  // Statements and expressions (jinja_renderer.cc).
  void Append(std::string* out, const std::string& s, int line);
  Flow RenderBody(const Body& body, Scope* scope, std::string* out);
  Flow RenderNode(const Node& n, Scope* scope, std::string* out);
  Flow RenderNodeUnlocated(const Node& n, Scope* scope, std::string* out);
  void Assign(const std::vector<std::string>& targets, Value v, Scope* scope, int line);
  std::vector<Value> Iterate(const Value& v, int line);
  Flow RenderFor(const Node& n, Scope* scope, std::string* out);
  static std::string TypeName(const Value& v);
  std::string Str(const Value& v, int line);
  Json ToJson(const Value& v, int line);
  const std::string& AsString(const Value& v, int line, const char* what);
  int64_t AsIntArg(const Value& v, int line, const char* what);
  void CheckSize(const Json& j, int line);
  [[noreturn]] void UndefinedError(const Value& v, int line);
  Value Eval(const Expr& e, Scope* scope);
  const Value& EvalView(const Expr& e, Scope* scope, Value* storage);
  Value EvalUncharged(const Expr& e, Scope* scope);
  Args EvalArgs(const Expr& e, Scope* scope);
  Value Method(const Json& receiver, const std::string& name);
  Value GetAttr(const Value& obj, const std::string& name, int line);
  Value GetItem(const Value& obj, const Value& key, int line);
  Value Slice(const Expr& e, Scope* scope);
  bool Compare(const std::string& op, const Value& a, const Value& b, int line);
  int Order(const Json& a, const Json& b, const std::string& op, int line);
  bool Contains(const Value& container, const Value& item, int line);
  Value Arith(const std::string& op, const Value& a, const Value& b, int line);
  Value Call(const Value& callee, const Args& args, int line);
  Value CallMacro(const Node& macro, const Args& args, int line);

  // Builtins (jinja_builtins.cc).
  static bool IsStringMethod(const std::string& n);
  Value CallGlobal(const std::string& name, const Args& args, int line);
  Value CallMethod(const Json& self, const std::string& name, const Args& args, int line);
  bool Test(const std::string& name, const Value& v, const Args& args, int line);
  static void CheckFilterArgs(const std::string& name, const Args& args, int line);
  Value Filter(const std::string& name, const Value& v, const Args& args, int line, Scope* scope);
  Value Attribute(const Value& item, const Value& attribute, int line);
  std::string ToJsonText(const Value& v, const Args& args, int line);

  const Body* root_;
  Scope globals_;
  std::vector<std::unique_ptr<NamespaceMap>> namespaces_;
  int64_t iterations_ = 0;
  uint64_t work_ = 0;
  int call_depth_ = 0;
  int render_depth_ = 0;
};

}  // namespace gyre::text::jinja
