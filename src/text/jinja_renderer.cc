// The Jinja engine's third stage (jinja_internal.h): a tree walk over JSON values (ordered
// objects, like Python dicts) with jinja2's Undefined semantics and Python's truthiness, str(),
// comparison and arithmetic. The builtins it calls are in jinja_builtins.cc.

#include "text/jinja_renderer.h"

#include <algorithm>
#include <cmath>

#include "text/jinja_python.h"

namespace gyre::text::jinja {

bool IsNumber(const Json& j) { return j.is_number() || j.is_boolean(); }
bool IsInt(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
int64_t AsInt(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) throw JinjaError{"integer out of 64-bit range"};
    return static_cast<int64_t>(u);
  }
  return j.get<int64_t>();
}
double AsDouble(const Json& j) {
  return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
}

bool Truthy(const Value& v) {
  if (v.kind == Value::kUndefined) return false;
  if (v.lazy == Value::kGenerator) return true;  // a Python generator is always true
  if (v.kind != Value::kJson) return true;
  const Json& j = v.json;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return AsInt(j) != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0.0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !j.empty();
    default:
      return true;
  }
}

bool JsonEqual(const Json& a, const Json& b) {
  if (IsNumber(a) && IsNumber(b)) {
    if (IsInt(a) && IsInt(b)) return AsInt(a) == AsInt(b);
    return AsDouble(a) == AsDouble(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!JsonEqual(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !JsonEqual(v, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool ValueEqual(const Value& a, const Value& b) {
  if (a.lazy != Value::kList || b.lazy != Value::kList) return false;
  if (a.kind == Value::kJson && b.kind == Value::kJson) return JsonEqual(a.json, b.json);
  if (a.kind != b.kind) return false;
  if (a.kind == Value::kUndefined) return true;
  if (a.kind == Value::kNamespace) return a.ns == b.ns;
  if (a.kind == Value::kMacro) return a.macro == b.macro;
  return false;
}

size_t CountNodes(const Json& j, size_t limit, int depth) {
  if (depth > kMaxValueDepth) throw JinjaError{"value nested more than 512 deep"};
  size_t n = 1;
  if (j.is_array() || j.is_object()) {
    for (const auto& item : j) {
      n += CountNodes(item, limit - std::min(n, limit), depth + 1);
      if (n > limit) return n;
    }
  }
  return n;
}

std::string Renderer::Run(const Json& context) {
  for (const char* fn : {"raise_exception", "strftime_now", "namespace", "dict", "range"}) {
    Value f;
    f.kind = Value::kFunction;
    f.name = fn;
    globals_.vars[fn] = f;
  }
  for (const auto& [k, v] : context.items()) globals_.vars[k] = Value::Of(v);
  std::string out;
  if (RenderBody(*root_, &globals_, &out) != Flow::kNormal) {
    throw JinjaError{"chat template: 'break' or 'continue' outside a loop", true};
  }
  return out;
}

void Renderer::Append(std::string* out, const std::string& s, int line) {
  if (out->size() + s.size() > kMaxOutputBytes) Fail(line, "output over 16 MiB");
  work_ += s.size();
  if (work_ > kMaxWork) Fail(line, "template does too much work (over 256M value bytes)");
  out->append(s);
}

Flow Renderer::RenderBody(const Body& body, Scope* scope, std::string* out) {
  for (const Node& n : body) {
    const Flow f = RenderNode(n, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Flow Renderer::RenderNode(const Node& n, Scope* scope, std::string* out) {
  DepthGuard guard(&render_depth_, n.line);
  try {
    return RenderNodeUnlocated(n, scope, out);
  } catch (const JinjaError& e) {
    if (e.located) throw;
    Fail(n.line, e.message);
  }
}

Flow Renderer::RenderNodeUnlocated(const Node& n, Scope* scope, std::string* out) {
  switch (n.kind) {
    case Node::kText:
      Append(out, n.text, n.line);
      return Flow::kNormal;
    case Node::kOutput:
      Append(out, Str(Eval(*n.expr, scope), n.line), n.line);
      return Flow::kNormal;
    case Node::kIf:
      for (const auto& [cond, body] : n.branches) {
        if (Truthy(Eval(*cond, scope))) return RenderBody(body, scope, out);
      }
      return RenderBody(n.else_body, scope, out);
    case Node::kFor:
      return RenderFor(n, scope, out);
    case Node::kSet: {
      Value v = Eval(*n.expr, scope);
      if (!n.attr.empty()) {
        const Value* target = scope->Find(n.targets[0]);
        if (target == nullptr || target->kind != Value::kNamespace) {
          Fail(n.line, "cannot assign attribute '" + n.attr + "' on '" + n.targets[0] +
                           "', which is not a namespace()");
        }
        (*target->ns)[n.attr] = std::move(v);
      } else {
        Assign(n.targets, std::move(v), scope, n.line);
      }
      return Flow::kNormal;
    }
    case Node::kSetBlock: {
      std::string captured;
      Scope inner{{}, scope};
      RenderBody(n.body, &inner, &captured);
      scope->vars[n.targets[0]] = Value::Of(captured);
      return Flow::kNormal;
    }
    case Node::kMacro: {
      Value m;
      m.kind = Value::kMacro;
      m.macro = &n;
      m.name = n.name;
      scope->vars[n.name] = m;
      return Flow::kNormal;
    }
    case Node::kBreak:
      return Flow::kBreak;
    case Node::kContinue:
      return Flow::kContinue;
    case Node::kScope:
      return RenderBody(n.body, scope, out);
  }
  return Flow::kNormal;
}

void Renderer::Assign(const std::vector<std::string>& targets, Value v, Scope* scope, int line) {
  if (targets.size() == 1) {
    scope->vars[targets[0]] = std::move(v);
    return;
  }
  std::vector<Value> items = Iterate(v, line);
  if (items.size() != targets.size()) {
    Fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                   std::to_string(targets.size()) + " names");
  }
  for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = std::move(items[i]);
}

// The items a for loop visits: list items, dict keys, string characters; Undefined is empty.
std::vector<Value> Renderer::Iterate(const Value& v, int line) {
  std::vector<Value> items;
  if (v.kind == Value::kUndefined) return items;
  if (v.kind == Value::kNamespace) Fail(line, "a namespace is not iterable");
  if (v.kind != Value::kJson) Fail(line, "'" + v.name + "' is not iterable");
  if (v.json.is_array()) {
    for (const Json& j : v.json) items.push_back(Value::Of(j));
  } else if (v.json.is_object()) {
    for (const auto& [k, item] : v.json.items()) items.push_back(Value::Of(k));
  } else if (v.json.is_string()) {
    for (std::string& cp : CodePoints(v.json.get<std::string>())) items.push_back(Value::Of(cp));
  } else {
    Fail(line, TypeName(v) + " object is not iterable");
  }
  return items;
}

Flow Renderer::RenderFor(const Node& n, Scope* scope, std::string* out) {
  std::vector<Value> all = Iterate(Eval(*n.expr, scope), n.line);
  std::vector<Value> items;
  if (n.filter) {
    for (Value& v : all) {
      Scope probe{{}, scope};
      Assign(n.targets, v, &probe, n.line);
      if (Truthy(Eval(*n.filter, &probe))) items.push_back(std::move(v));
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) return RenderBody(n.else_body, scope, out);
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    if (++iterations_ > kMaxIterations) Fail(n.line, "more than 1000000 loop iterations");
    Scope inner{{}, scope};
    Assign(n.targets, items[i], &inner, n.line);
    Json loop = Json::object();
    loop["index"] = i + 1;
    loop["index0"] = i;
    loop["revindex"] = length - i;
    loop["revindex0"] = length - i - 1;
    loop["first"] = i == 0;
    loop["last"] = i == length - 1;
    loop["length"] = length;
    loop["depth"] = 1;
    loop["depth0"] = 0;
    Value lv = Value::Of(std::move(loop));
    if (i > 0 && items[i - 1].kind == Value::kJson) lv.json["previtem"] = items[i - 1].json;
    if (i + 1 < length && items[i + 1].kind == Value::kJson) {
      lv.json["nextitem"] = items[i + 1].json;
    }
    inner.vars["loop"] = std::move(lv);
    const Flow f = RenderBody(n.body, &inner, out);
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

std::string Renderer::TypeName(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "Undefined";
    case Value::kNamespace:
      return "'Namespace'";
    case Value::kMacro:
      return "'Macro'";
    case Value::kMethod:
    case Value::kFunction:
      return "'function'";
    case Value::kJson:
      break;
  }
  switch (v.json.type()) {
    case Json::value_t::null:
      return "'NoneType'";
    case Json::value_t::boolean:
      return "'bool'";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "'int'";
    case Json::value_t::number_float:
      return "'float'";
    case Json::value_t::string:
      return "'str'";
    case Json::value_t::array:
      return "'list'";
    case Json::value_t::object:
      return "'dict'";
    default:
      return "'bytes'";
  }
}

std::string Renderer::Str(const Value& v, int line) {
  if (v.lazy != Value::kList) {
    Fail(line, std::string("unsupported: printing a ") +
                   (v.lazy == Value::kGenerator ? "generator" : "dict view") +
                   " (Python prints an object, not its items); add |list");
  }
  switch (v.kind) {
    case Value::kUndefined:
      return "";
    case Value::kJson:
      if (v.json.is_string()) return v.json.get<std::string>();
      return PyRepr(v.json);
    default:
      Fail(line, "unsupported: printing a " + TypeName(v) + " value");
  }
}

Json Renderer::ToJson(const Value& v, int line) {
  if (v.lazy != Value::kList) Fail(line, "unsupported: a generator or dict view inside a value");
  if (v.kind == Value::kJson) return v.json;
  if (v.kind == Value::kUndefined) {
    Fail(line, "unsupported: an undefined value ('" + v.name + "') inside a list or dict");
  }
  Fail(line, "unsupported: a " + TypeName(v) + " value inside a list or dict");
}

const std::string& Renderer::AsString(const Value& v, int line, const char* what) {
  if (!v.is_string()) Fail(line, std::string(what) + " expects a string, got " + TypeName(v));
  return v.json.get_ref<const std::string&>();
}

int64_t Renderer::AsIntArg(const Value& v, int line, const char* what) {
  if (v.kind != Value::kJson || !IsInt(v.json)) {
    Fail(line, std::string(what) + " expects an integer, got " + TypeName(v));
  }
  return AsInt(v.json);
}

void Renderer::CheckSize(const Json& j, int line) {
  if (j.is_string() && j.get_ref<const std::string&>().size() > kMaxOutputBytes) {
    Fail(line, "string value over 16 MiB");
  }
  if ((j.is_array() || j.is_object()) && CountNodes(j, kMaxElements) > kMaxElements) {
    Fail(line, "value with more than 1048576 elements");
  }
}

void Renderer::UndefinedError(const Value& v, int line) {
  Fail(line, "'" + v.name + "' is undefined");
}

// Every value an expression produces is charged to the render's work budget (string bytes,
// list and dict entries), so loops over large values end with an error instead of running for
// hours within the other limits.
Value Renderer::Eval(const Expr& e, Scope* scope) {
  DepthGuard guard(&render_depth_, e.line);
  Value v = EvalUncharged(e, scope);
  if (v.kind == Value::kJson) {
    work_ += v.json.is_string() ? v.json.get_ref<const std::string&>().size() : 1;
    if (v.json.is_array() || v.json.is_object()) work_ += v.json.size();
    if (work_ > kMaxWork) Fail(e.line, "template does too much work (over 256M value bytes)");
  }
  return v;
}

// The value of `e` without copying it when `e` names a variable (templates read `messages` in
// every iteration); otherwise evaluates into *storage.
const Value& Renderer::EvalView(const Expr& e, Scope* scope, Value* storage) {
  if (e.kind == Expr::kName) {
    const Value* v = scope->Find(e.name);
    if (v != nullptr) return *v;
  }
  *storage = Eval(e, scope);
  return *storage;
}

Value Renderer::EvalUncharged(const Expr& e, Scope* scope) {
  switch (e.kind) {
    case Expr::kLiteral:
      return Value::Of(e.literal);
    case Expr::kName: {
      const Value* v = scope->Find(e.name);
      if (v == nullptr) return Value::Undefined(e.name);
      return *v;
    }
    case Expr::kAttr: {
      Value storage;
      return GetAttr(EvalView(*e.args[0], scope, &storage), e.name, e.line);
    }
    case Expr::kItem: {
      Value storage;
      const Value& obj = EvalView(*e.args[0], scope, &storage);
      return GetItem(obj, Eval(*e.args[1], scope), e.line);
    }
    case Expr::kSlice:
      return Slice(e, scope);
    case Expr::kList: {
      Json list = Json::array();
      for (const ExprPtr& a : e.args) list.push_back(ToJson(Eval(*a, scope), e.line));
      CheckSize(list, e.line);
      return Value::Of(std::move(list));
    }
    case Expr::kDict: {
      Json dict = Json::object();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        const Value k = Eval(*e.args[i], scope);
        if (!k.is_string()) Fail(e.line, "unsupported: dict keys other than strings");
        dict[k.json.get<std::string>()] = ToJson(Eval(*e.args[i + 1], scope), e.line);
      }
      CheckSize(dict, e.line);
      return Value::Of(std::move(dict));
    }
    case Expr::kNeg:
    case Expr::kPos: {
      const Value v = Eval(*e.args[0], scope);
      if (v.kind == Value::kUndefined) UndefinedError(v, e.line);
      if (v.kind != Value::kJson || !IsNumber(v.json)) {
        Fail(e.line, "bad operand type for unary " + std::string(e.kind == Expr::kNeg ? "-" : "+") +
                         ": " + TypeName(v));
      }
      if (e.kind == Expr::kPos) return Value::Of(IsInt(v.json) ? Json(AsInt(v.json)) : v.json);
      if (IsInt(v.json)) {
        const int64_t i = AsInt(v.json);
        if (i == INT64_MIN) Fail(e.line, "integer overflow");
        return Value::Of(-i);
      }
      return Value::Of(-v.json.get<double>());
    }
    case Expr::kBinary:
      return Arith(e.name, Eval(*e.args[0], scope), Eval(*e.args[1], scope), e.line);
    case Expr::kConcat: {
      std::string s = Str(Eval(*e.args[0], scope), e.line) + Str(Eval(*e.args[1], scope), e.line);
      if (s.size() > kMaxOutputBytes) Fail(e.line, "string value over 16 MiB");
      return Value::Of(std::move(s));
    }
    case Expr::kCompare: {
      Value left = Eval(*e.args[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = Eval(*e.args[i + 1], scope);
        if (!Compare(e.ops[i], left, right, e.line)) return Value::Of(false);
        left = std::move(right);
      }
      return Value::Of(true);
    }
    case Expr::kAnd: {
      Value a = Eval(*e.args[0], scope);
      return Truthy(a) ? Eval(*e.args[1], scope) : a;
    }
    case Expr::kOr: {
      Value a = Eval(*e.args[0], scope);
      return Truthy(a) ? a : Eval(*e.args[1], scope);
    }
    case Expr::kNot:
      return Value::Of(!Truthy(Eval(*e.args[0], scope)));
    case Expr::kCond:
      if (Truthy(Eval(*e.args[1], scope))) return Eval(*e.args[0], scope);
      if (e.args[2]) return Eval(*e.args[2], scope);
      return Value::Undefined("the else branch of a conditional expression");
    case Expr::kFilter: {
      Value storage;
      const Value& subject = EvalView(*e.args[0], scope, &storage);
      return Filter(e.name, subject, EvalArgs(e, scope), e.line, scope);
    }
    case Expr::kTest: {
      Value storage;
      const Value& subject = EvalView(*e.args[0], scope, &storage);
      const bool r = Test(e.name, subject, EvalArgs(e, scope), e.line);
      return Value::Of(e.negated ? !r : r);
    }
    case Expr::kCall: {
      Value callee = Eval(*e.args[0], scope);
      return Call(callee, EvalArgs(e, scope), e.line);
    }
  }
  Fail(e.line, "unknown expression");
}

Args Renderer::EvalArgs(const Expr& e, Scope* scope) {
  Args a;
  for (size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(Eval(*e.args[i], scope));
  for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, Eval(*v, scope));
  return a;
}

Value Renderer::Method(const Json& receiver, const std::string& name) {
  Value m;
  m.kind = Value::kMethod;
  m.json = receiver;
  m.name = name;
  return m;
}

// jinja2's getattr: attribute (a method) first, then item.
Value Renderer::GetAttr(const Value& obj, const std::string& name, int line) {
  if (obj.kind == Value::kUndefined) {
    Fail(line, "'" + obj.name + "' is undefined (reading its attribute '" + name + "')");
  }
  if (obj.kind == Value::kNamespace) {
    auto it = obj.ns->find(name);
    return it == obj.ns->end() ? Value::Undefined(name) : it->second;
  }
  if (obj.kind != Value::kJson) return Value::Undefined(name);
  const Json& j = obj.json;
  if (j.is_object()) {
    if (name == "items" || name == "keys" || name == "values" || name == "get") {
      return Method(j, name);
    }
    auto it = j.find(name);
    if (it != j.end()) return Value::Of(*it);
    return Value::Undefined(name);
  }
  if (j.is_string() && IsStringMethod(name)) return Method(j, name);
  return Value::Undefined(name);
}

Value Renderer::GetItem(const Value& obj, const Value& key, int line) {
  if (obj.kind == Value::kUndefined) {
    Fail(line, "'" + obj.name + "' is undefined (reading an item of it)");
  }
  if (obj.lazy != Value::kList) return Value::Undefined("item of a generator or dict view");
  if (obj.kind == Value::kNamespace && key.is_string()) {
    return GetAttr(obj, key.json.get<std::string>(), line);
  }
  if (obj.kind != Value::kJson || key.kind != Value::kJson) return Value::Undefined("item");
  const Json& j = obj.json;
  if (j.is_object()) {
    if (!key.json.is_string()) return Value::Undefined("item");
    auto it = j.find(key.json.get<std::string>());
    if (it != j.end()) return Value::Of(*it);
    return GetAttr(obj, key.json.get<std::string>(), line);
  }
  if ((j.is_array() || j.is_string()) && IsInt(key.json)) {
    int64_t i = AsInt(key.json);
    if (j.is_array()) {
      const int64_t n = static_cast<int64_t>(j.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("index " + std::to_string(AsInt(key.json)));
      return Value::Of(j[static_cast<size_t>(i)]);
    }
    const std::vector<std::string> cps = CodePoints(j.get<std::string>());
    const int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined("index " + std::to_string(AsInt(key.json)));
    return Value::Of(cps[static_cast<size_t>(i)]);
  }
  if (key.is_string()) return GetAttr(obj, key.json.get<std::string>(), line);
  return Value::Undefined("item");
}

Value Renderer::Slice(const Expr& e, Scope* scope) {
  Value storage;
  const Value& obj = EvalView(*e.args[0], scope, &storage);
  if (obj.kind == Value::kUndefined) UndefinedError(obj, e.line);
  if (obj.lazy != Value::kList) return Value::Undefined("slice of a generator or dict view");
  int64_t bounds[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  for (int k = 0; k < 3; ++k) {
    if (!e.args[k + 1]) continue;
    const Value v = Eval(*e.args[k + 1], scope);
    if (v.kind == Value::kJson && v.json.is_null()) continue;
    bounds[k] = AsIntArg(v, e.line, "a slice bound");
    given[k] = true;
  }
  const int64_t step = bounds[2];
  if (step == 0) Fail(e.line, "slice step cannot be zero");
  if (obj.kind != Value::kJson || !(obj.json.is_array() || obj.json.is_string())) {
    Fail(e.line, TypeName(obj) + " object is not subscriptable with a slice");
  }
  std::vector<std::string> cps;
  const bool is_string = obj.json.is_string();
  if (is_string) cps = CodePoints(obj.json.get<std::string>());
  const int64_t n = static_cast<int64_t>(is_string ? cps.size() : obj.json.size());
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](int64_t v, bool has, int64_t def_pos, int64_t def_neg) {
    if (!has) return step > 0 ? def_pos : def_neg;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t start = adjust(bounds[0], given[0], 0, n - 1);
  const int64_t stop = adjust(bounds[1], given[1], n, -1);
  Json out = is_string ? Json("") : Json::array();
  std::string text;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (is_string) {
      text += cps[static_cast<size_t>(i)];
    } else {
      out.push_back(obj.json[static_cast<size_t>(i)]);
    }
  }
  if (is_string) out = text;
  return Value::Of(std::move(out));
}

bool Renderer::Compare(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return ValueEqual(a, b);
  if (op == "!=") return !ValueEqual(a, b);
  if (op == "in" || op == "not in") {
    const bool r = Contains(b, a, line);
    return op == "in" ? r : !r;
  }
  if (a.kind != Value::kJson || b.kind != Value::kJson) {
    if (a.kind == Value::kUndefined) UndefinedError(a, line);
    if (b.kind == Value::kUndefined) UndefinedError(b, line);
    Fail(line, "'" + op + "' not supported between " + TypeName(a) + " and " + TypeName(b));
  }
  if (a.lazy != Value::kList || b.lazy != Value::kList) {
    Fail(line, "'" + op + "' not supported for generators or dict views");
  }
  const int c = Order(a.json, b.json, op, line);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

int Renderer::Order(const Json& a, const Json& b, const std::string& op, int line) {
  if (IsNumber(a) && IsNumber(b)) {
    if (IsInt(a) && IsInt(b)) return AsInt(a) < AsInt(b) ? -1 : AsInt(a) > AsInt(b);
    const double x = AsDouble(a), y = AsDouble(b);
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!JsonEqual(a[i], b[i])) return Order(a[i], b[i], op, line);
    }
    return a.size() < b.size() ? -1 : a.size() > b.size();
  }
  Fail(line, "'" + op + "' not supported between " + TypeName(Value::Of(a)) + " and " +
                 TypeName(Value::Of(b)));
}

bool Renderer::Contains(const Value& container, const Value& item, int line) {
  if (container.kind == Value::kUndefined) return false;
  if (container.kind != Value::kJson) Fail(line, "'in' needs a string, list or dict");
  const Json& c = container.json;
  if (c.is_string()) {
    if (!item.is_string()) {
      Fail(line, "'in <string>' requires string as left operand, not " + TypeName(item));
    }
    return c.get_ref<const std::string&>().find(item.json.get_ref<const std::string&>()) !=
           std::string::npos;
  }
  if (c.is_array()) {
    for (const Json& j : c) {
      if (ValueEqual(Value::Of(j), item)) return true;
    }
    return false;
  }
  if (c.is_object()) return item.is_string() && c.contains(item.json.get<std::string>());
  Fail(line, "argument of type " + TypeName(container) + " is not iterable");
}

Value Renderer::Arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.kind == Value::kUndefined) UndefinedError(a, line);
  if (b.kind == Value::kUndefined) UndefinedError(b, line);
  auto unsupported = [&]() {
    Fail(line, "unsupported operand types for " + op + ": " + TypeName(a) + " and " + TypeName(b));
  };
  if (a.kind != Value::kJson || b.kind != Value::kJson) unsupported();
  if (a.lazy != Value::kList || b.lazy != Value::kList) unsupported();
  const Json& x = a.json;
  const Json& y = b.json;
  if (op == "+") {
    if (x.is_string() && y.is_string()) {
      if (x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size() >
          kMaxOutputBytes) {
        Fail(line, "string value over 16 MiB");
      }
      return Value::Of(x.get<std::string>() + y.get<std::string>());
    }
    if (x.is_array() && y.is_array()) {
      Json r = x;
      for (const Json& j : y) r.push_back(j);
      CheckSize(r, line);
      return Value::Of(std::move(r));
    }
  }
  if (op == "*" && (((x.is_string() || x.is_array()) && IsInt(y)) ||
                    ((y.is_string() || y.is_array()) && IsInt(x)))) {
    const Json& seq = IsInt(y) ? x : y;
    const int64_t times = std::max<int64_t>(0, AsInt(IsInt(y) ? y : x));
    const size_t unit = seq.is_string() ? seq.get_ref<const std::string&>().size() : seq.size();
    if (unit > 0 && static_cast<uint64_t>(times) > kMaxOutputBytes / unit) {
      Fail(line, "repeated value too large");
    }
    if (seq.is_string()) {
      std::string r;
      for (int64_t i = 0; i < times; ++i) r += seq.get_ref<const std::string&>();
      return Value::Of(std::move(r));
    }
    Json r = Json::array();
    for (int64_t i = 0; i < times; ++i) {
      for (const Json& j : seq) r.push_back(j);
    }
    CheckSize(r, line);
    return Value::Of(std::move(r));
  }
  if (!IsNumber(x) || !IsNumber(y)) {
    if (op == "%" && x.is_string()) Fail(line, "unsupported: '%' string formatting");
    unsupported();
  }
  const bool ints = IsInt(x) && IsInt(y);
  if (op == "/") {
    if (AsDouble(y) == 0) Fail(line, "division by zero");
    return Value::Of(AsDouble(x) / AsDouble(y));
  }
  if (ints) {
    const int64_t i = AsInt(x), j = AsInt(y);
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(i, j, &r);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(i, j, &r);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(i, j, &r);
    } else if (op == "//" || op == "%") {
      if (j == 0) Fail(line, "integer division or modulo by zero");
      if (i == INT64_MIN && j == -1) Fail(line, "integer overflow");
      int64_t q = i / j, m = i % j;
      if (m != 0 && ((m < 0) != (j < 0))) {
        --q;
        m += j;
      }
      r = op == "//" ? q : m;
    } else if (op == "**") {
      if (j < 0) return Value::Of(std::pow(static_cast<double>(i), static_cast<double>(j)));
      r = 1;
      for (int64_t k = 0; k < j && !overflow; ++k) {
        overflow = __builtin_mul_overflow(r, i, &r);
        if (r == 0 || r == 1) break;
      }
      if (i == -1) r = (j % 2) ? -1 : 1;
    }
    if (overflow) Fail(line, "integer overflow (Python integers are unbounded; Gyre's are 64-bit)");
    return Value::Of(r);
  }
  const double p = AsDouble(x), q = AsDouble(y);
  if (op == "+") return Value::Of(p + q);
  if (op == "-") return Value::Of(p - q);
  if (op == "*") return Value::Of(p * q);
  if (op == "**") return Value::Of(std::pow(p, q));
  if (q == 0) Fail(line, "float division or modulo by zero");
  const double fl = std::floor(p / q);
  if (op == "//") return Value::Of(fl);
  double m = std::fmod(p, q);
  if (m != 0 && ((m < 0) != (q < 0))) m += q;
  return Value::Of(m);
}

Value Renderer::Call(const Value& callee, const Args& args, int line) {
  switch (callee.kind) {
    case Value::kUndefined:
      Fail(line, "'" + callee.name + "' is undefined (called as a function)");
    case Value::kMethod:
      return CallMethod(callee.json, callee.name, args, line);
    case Value::kFunction:
      return CallGlobal(callee.name, args, line);
    case Value::kMacro:
      return CallMacro(*callee.macro, args, line);
    default:
      Fail(line, TypeName(callee) + " object is not callable");
  }
}

Value Renderer::CallMacro(const Node& macro, const Args& args, int line) {
  if (++call_depth_ > kMaxCallDepth) Fail(line, "macro calls nested more than 64 deep");
  if (args.positional.size() > macro.params.size()) {
    Fail(line,
         "macro '" + macro.name + "' takes " + std::to_string(macro.params.size()) + " arguments");
  }
  Scope scope{{}, &globals_};
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const auto& [pname, def] = macro.params[i];
    const Value* given = args.Get(i, pname.c_str());
    if (given != nullptr) {
      scope.vars[pname] = *given;
    } else if (def) {
      scope.vars[pname] = Eval(*def, &scope);
    } else {
      scope.vars[pname] = Value::Undefined(pname);
    }
  }
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (const auto& p : macro.params) known = known || p.first == k;
    if (!known) Fail(line, "macro '" + macro.name + "' has no parameter '" + k + "'");
  }
  std::string out;
  RenderBody(macro.body, &scope, &out);
  --call_depth_;
  return Value::Of(std::move(out));
}

std::string Render(const Body& root, const Json& context) {
  Renderer renderer(&root);
  return renderer.Run(context);
}

}  // namespace gyre::text::jinja
