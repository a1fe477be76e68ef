// The Jinja engine's builtins (jinja_renderer.h): the global functions (raise_exception,
// strftime_now, namespace, dict, range), string and dict methods, tests and filters that the
// renderer calls, as jinja2 and Python define them.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>

#include "text/jinja_python.h"
#include "text/jinja_renderer.h"

namespace gyre::text::jinja {

bool Renderer::IsStringMethod(const std::string& n) {
  static const char* kNames[] = {
      "strip",   "lstrip",  "rstrip",     "split",   "startswith", "endswith", "replace", "upper",
      "lower",   "title",   "capitalize", "find",    "rfind",      "count",    "join",    "rsplit",
      "isdigit", "isalpha", "isspace",    "islower", "isupper",    "format"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

Value Renderer::CallGlobal(const std::string& name, const Args& args, int line) {
  if (name == "raise_exception") {
    const Value* msg = args.Get(0, "message");
    throw JinjaError{"chat template raised an exception: " + (msg ? Str(*msg, line) : ""), true};
  }
  if (name == "strftime_now") {
    const Value* fmt = args.Get(0, "format");
    if (fmt == nullptr) Fail(line, "strftime_now() needs a format");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n =
        std::strftime(buf, sizeof(buf), AsString(*fmt, line, "strftime_now").c_str(), &tm);
    return Value::Of(std::string(buf, n));
  }
  if (name == "namespace" || name == "dict") {
    NamespaceMap map;
    for (const Value& p : args.positional) {
      if (p.kind != Value::kJson || !p.json.is_object()) {
        Fail(line, name + "() takes keyword arguments or a dict");
      }
      for (const auto& [k, v] : p.json.items()) map[k] = Value::Of(v);
    }
    for (const auto& [k, v] : args.keyword) map[k] = v;
    if (name == "dict") {
      Json d = Json::object();
      for (const auto& [k, v] : map) d[k] = ToJson(v, line);
      CheckSize(d, line);
      return Value::Of(std::move(d));
    }
    namespaces_.push_back(std::make_unique<NamespaceMap>(std::move(map)));
    Value ns;
    ns.kind = Value::kNamespace;
    ns.ns = namespaces_.back().get();
    return ns;
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    const size_t n = args.positional.size();
    if (n == 1) {
      stop = AsIntArg(args.positional[0], line, "range()");
    } else if (n == 2 || n == 3) {
      start = AsIntArg(args.positional[0], line, "range()");
      stop = AsIntArg(args.positional[1], line, "range()");
      if (n == 3) step = AsIntArg(args.positional[2], line, "range()");
    } else {
      Fail(line, "range() takes 1 to 3 integers");
    }
    if (step == 0) Fail(line, "range() step must not be zero");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= kMaxElements) Fail(line, "range() over 1048576 elements");
      out.push_back(i);
      if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
    }
    return Value::Of(std::move(out));
  }
  Fail(line, "unknown function '" + name + "'");
}

Value Renderer::CallMethod(const Json& self, const std::string& name, const Args& args, int line) {
  if (self.is_object()) {
    if (name == "items") {
      Json out = Json::array();
      for (const auto& [k, v] : self.items()) out.push_back(Json::array({k, v}));
      CheckSize(out, line);
      return Value::Lazily(std::move(out), Value::kView);
    }
    if (name == "keys" || name == "values") {
      Json out = Json::array();
      for (const auto& [k, v] : self.items()) out.push_back(name == "keys" ? Json(k) : v);
      return Value::Lazily(std::move(out), Value::kView);
    }
    // get
    const Value* key = args.Get(0, "key");
    if (key == nullptr) Fail(line, "get() needs a key");
    if (key->is_string()) {
      auto it = self.find(key->json.get<std::string>());
      if (it != self.end()) return Value::Of(*it);
    }
    const Value* def = args.Get(1, "default");
    return def ? *def : Value::Of(nullptr);
  }
  const std::string& s = self.get_ref<const std::string&>();
  const Value* a0 = args.Get(0, "");
  const Value* a1 = args.Get(1, "");
  auto opt_string = [&](const Value* v, const char* what) -> const std::string* {
    if (v == nullptr || (v->kind == Value::kJson && v->json.is_null())) return nullptr;
    return &AsString(*v, line, what);
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value::Of(PyStrip(s, opt_string(a0, name.c_str()), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = args.Get(0, "sep");
    const Value* maxv = args.Get(1, "maxsplit");
    const int64_t maxsplit = maxv ? AsIntArg(*maxv, line, "split()") : -1;
    if (name == "rsplit" && maxsplit >= 0) Fail(line, "unsupported: rsplit with maxsplit");
    std::vector<std::string> parts;
    try {
      parts = PySplit(s, opt_string(sep, "split()"), maxsplit);
    } catch (const JinjaError&) {
      Fail(line, "split(): empty separator");
    }
    Json out = Json::array();
    for (std::string& p : parts) out.push_back(std::move(p));
    return Value::Of(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    if (a0 == nullptr) Fail(line, name + "() needs an argument");
    std::vector<std::string> options;
    if (a0->kind == Value::kJson && a0->json.is_array()) {
      for (const Json& j : a0->json) {
        if (!j.is_string()) Fail(line, name + "() takes strings");
        options.push_back(j.get<std::string>());
      }
    } else {
      options.push_back(AsString(*a0, line, name.c_str()));
    }
    if (args.positional.size() > 1) Fail(line, "unsupported: " + name + "() with start/end");
    for (const std::string& o : options) {
      if (name == "startswith"
              ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0) {
        return Value::Of(true);
      }
    }
    return Value::Of(false);
  }
  if (name == "replace") {
    if (a0 == nullptr || a1 == nullptr) Fail(line, "replace() needs two arguments");
    const Value* count = args.Get(2, "count");
    return Value::Of(PyReplace(s, AsString(*a0, line, "replace()"),
                               AsString(*a1, line, "replace()"),
                               count ? AsIntArg(*count, line, "replace()") : -1));
  }
  if (name == "upper") return Value::Of(AsciiUpper(s));
  if (name == "lower") return Value::Of(AsciiLower(s));
  if (name == "title") return Value::Of(AsciiTitle(s));
  if (name == "capitalize") return Value::Of(AsciiCapitalize(s));
  if (name == "find" || name == "rfind" || name == "count") {
    if (a0 == nullptr) Fail(line, name + "() needs an argument");
    if (args.positional.size() > 1) Fail(line, "unsupported: " + name + "() with start/end");
    const std::string& sub = AsString(*a0, line, name.c_str());
    if (name == "count") {
      if (sub.empty()) return Value::Of(static_cast<int64_t>(CodePointCount(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::Of(n);
    }
    const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) return Value::Of(-1);
    return Value::Of(static_cast<int64_t>(CodePointCount(s.substr(0, p))));
  }
  if (name == "join") {
    if (a0 == nullptr) Fail(line, "join() needs an argument");
    std::string out;
    bool first = true;
    for (const Value& v : Iterate(*a0, line)) {
      if (!first) out += s;
      out += AsString(v, line, "str.join()");
      first = false;
      if (out.size() > kMaxOutputBytes) Fail(line, "string value over 16 MiB");
    }
    return Value::Of(std::move(out));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    bool any_cased = false, ok = !s.empty();
    for (const std::string& cp : CodePoints(s)) {
      const char32_t c = Decode(cp);
      if (c >= 0x80 && name != "isspace")
        Fail(line, "unsupported: " + name + "() on non-ASCII text");
      if (name == "isdigit") ok = ok && c >= '0' && c <= '9';
      if (name == "isalpha") ok = ok && IsAsciiAlpha(static_cast<char>(c));
      if (name == "isspace") ok = ok && IsPySpace(c);
      if (name == "islower") {
        ok = ok && !(c >= 'A' && c <= 'Z');
        any_cased = any_cased || (c >= 'a' && c <= 'z');
      }
      if (name == "isupper") {
        ok = ok && !(c >= 'a' && c <= 'z');
        any_cased = any_cased || (c >= 'A' && c <= 'Z');
      }
    }
    if (name == "islower" || name == "isupper") ok = ok && any_cased;
    return Value::Of(ok);
  }
  Fail(line, "unsupported string method '" + name + "'");
}

// ---- tests

bool Renderer::Test(const std::string& name, const Value& v, const Args& args, int line) {
  const bool is_json = v.kind == Value::kJson;
  const Json& j = v.json;
  static const char* kNoArgs[] = {"defined",  "undefined", "none",   "string",   "mapping",
                                  "iterable", "sequence",  "number", "integer",  "float",
                                  "boolean",  "true",      "false",  "callable", "odd",
                                  "even",     "lower",     "upper"};
  for (const char* k : kNoArgs) {
    if (name == k && (!args.positional.empty() || !args.keyword.empty())) {
      Fail(line, "test '" + name + "' takes no arguments");
    }
  }
  if (name == "defined") return v.defined();
  if (name == "undefined") return !v.defined();
  if (name == "none") return is_json && j.is_null();
  if (name == "string") return is_json && j.is_string();
  if (name == "mapping") return (is_json && j.is_object()) || v.kind == Value::kNamespace;
  if (name == "iterable") {
    return v.kind == Value::kUndefined ||
           (is_json && (j.is_array() || j.is_object() || j.is_string()));
  }
  if (name == "sequence") {
    return is_json && v.lazy == Value::kList && (j.is_array() || j.is_object() || j.is_string());
  }
  if (name == "number") return is_json && IsNumber(j);
  if (name == "integer") return is_json && j.is_number_integer();
  if (name == "float") return is_json && j.is_number_float();
  if (name == "boolean") return is_json && j.is_boolean();
  if (name == "true") return is_json && j.is_boolean() && j.get<bool>();
  if (name == "false") return is_json && j.is_boolean() && !j.get<bool>();
  if (name == "callable") {
    return v.kind == Value::kMacro || v.kind == Value::kMethod || v.kind == Value::kFunction;
  }
  if (name == "odd" || name == "even") {
    const int64_t i = AsIntArg(v, line, "the odd/even test");
    return name == "odd" ? (i % 2 != 0) : (i % 2 == 0);
  }
  if (name == "divisibleby") {
    const Value* d = args.Get(0, "num");
    if (d == nullptr) Fail(line, "divisibleby needs a number");
    const int64_t n = AsIntArg(*d, line, "divisibleby");
    if (n == 0) Fail(line, "divisibleby 0");
    return AsIntArg(v, line, "divisibleby") % n == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string& s = Str(v, line);
    return name == "lower" ? AsciiLower(s) == s : AsciiUpper(s) == s;
  }
  static const std::map<std::string, std::string> kCompareTests = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="},        {"ne", "!="}, {"!=", "!="},
      {"lt", "<"},  {"lessthan", "<"}, {"le", "<="},        {"gt", ">"},  {"greaterthan", ">"},
      {"ge", ">="}, {"in", "in"},      {"sameas", "sameas"}};
  auto it = kCompareTests.find(name);
  if (it != kCompareTests.end()) {
    const Value* other = args.Get(0, "other");
    if (other == nullptr) Fail(line, "test '" + name + "' needs an argument");
    if (it->second == "sameas") {
      // Python `is`: identity holds for None/True/False, which is what templates compare.
      return v.kind == Value::kJson && other->kind == Value::kJson &&
             ((j.is_null() && other->json.is_null()) ||
              (j.is_boolean() && other->json.is_boolean() && j == other->json));
    }
    if (it->second == "in") return Contains(*other, v, line);
    return Compare(it->second, v, *other, line);
  }
  Fail(line, "unsupported test '" + name + "'");
}

// ---- filters

// The keyword parameters of each filter with fixed parameters, in positional order (jinja2's
// signatures); passing another keyword or too many positional arguments fails as in Python.
void Renderer::CheckFilterArgs(const std::string& name, const Args& args, int line) {
  static const std::map<std::string, std::vector<std::string>> kParams = {
      {"safe", {}},
      {"default", {"default_value", "boolean"}},
      {"d", {"default_value", "boolean"}},
      {"length", {}},
      {"count", {}},
      {"tojson", {"indent", "ensure_ascii", "separators", "sort_keys"}},
      {"string", {}},
      {"trim", {"chars"}},
      {"lower", {}},
      {"upper", {}},
      {"capitalize", {}},
      {"title", {}},
      {"replace", {"old", "new", "count"}},
      {"e", {}},
      {"escape", {}},
      {"first", {}},
      {"last", {}},
      {"list", {}},
      {"reverse", {}},
      {"join", {"d", "attribute"}},
      {"items", {}},
      {"int", {"default", "base"}},
      {"float", {"default"}},
      {"abs", {}},
  };
  auto it = kParams.find(name);
  if (it == kParams.end()) {
    if (name == "map") {
      for (const auto& kv : args.keyword) {
        if (kv.first != "attribute" && kv.first != "default") {
          Fail(line, "filter 'map' got an unexpected keyword argument '" + kv.first + "'");
        }
      }
    } else if (!args.keyword.empty()) {
      Fail(line, "filter '" + name + "' takes no keyword arguments");
    }
    return;
  }
  const std::vector<std::string>& params = it->second;
  if (args.positional.size() > params.size()) {
    Fail(line,
         "filter '" + name + "' takes at most " + std::to_string(params.size()) + " arguments");
  }
  for (const auto& kv : args.keyword) {
    auto p = std::find(params.begin(), params.end(), kv.first);
    if (p == params.end()) {
      Fail(line, "filter '" + name + "' got an unexpected keyword argument '" + kv.first + "'");
    }
    if (static_cast<size_t>(p - params.begin()) < args.positional.size()) {
      Fail(line, "filter '" + name + "' got multiple values for '" + kv.first + "'");
    }
  }
}

Value Renderer::Filter(const std::string& name, const Value& v, const Args& args, int line,
                       Scope* scope) {
  CheckFilterArgs(name, args, line);
  if (name == "safe") return v;
  if (name == "default" || name == "d") {
    const Value* def = args.Get(0, "default_value");
    const Value* boolean = args.Get(1, "boolean");
    const bool use_default = !v.defined() || (boolean && Truthy(*boolean) && !Truthy(v));
    if (use_default) return def ? *def : Value::Of("");
    return v;
  }
  if (name == "length" || name == "count") {
    if (v.kind == Value::kUndefined) return Value::Of(0);
    if (v.lazy == Value::kGenerator) Fail(line, "object of type 'generator' has no len()");
    if (v.kind == Value::kNamespace) Fail(line, "object of type 'Namespace' has no len()");
    if (v.kind == Value::kJson && v.json.is_string()) {
      return Value::Of(static_cast<int64_t>(CodePointCount(v.json.get<std::string>())));
    }
    if (v.kind == Value::kJson && (v.json.is_array() || v.json.is_object())) {
      return Value::Of(static_cast<int64_t>(v.json.size()));
    }
    Fail(line, "object of type " + TypeName(v) + " has no len()");
  }
  if (name == "tojson") {
    if (v.lazy != Value::kList) Fail(line, "Object of type generator is not JSON serializable");
    return Value::Of(ToJsonText(v, args, line));
  }
  if (name == "string") return Value::Of(Str(v, line));
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    const std::string s = Str(v, line);
    if (chars && !(chars->kind == Value::kJson && chars->json.is_null())) {
      return Value::Of(PyStrip(s, &AsString(*chars, line, "trim"), true, true));
    }
    return Value::Of(PyStrip(s, nullptr, true, true));
  }
  if (name == "lower") return Value::Of(AsciiLower(Str(v, line)));
  if (name == "upper") return Value::Of(AsciiUpper(Str(v, line)));
  if (name == "capitalize") return Value::Of(AsciiCapitalize(Str(v, line)));
  if (name == "title") return Value::Of(JinjaTitle(Str(v, line)));
  if (name == "replace") {
    const Value* old = args.Get(0, "old");
    const Value* rep = args.Get(1, "new");
    const Value* count = args.Get(2, "count");
    if (old == nullptr || rep == nullptr) Fail(line, "replace needs two arguments");
    return Value::Of(PyReplace(Str(v, line), Str(*old, line), Str(*rep, line),
                               count ? AsIntArg(*count, line, "replace") : -1));
  }
  if (name == "e" || name == "escape") {
    std::string out;
    for (char c : Str(v, line)) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out.push_back(c);
      }
    }
    return Value::Of(std::move(out));
  }
  if (name == "first" || name == "last") {
    if (name == "last" && v.lazy == Value::kGenerator) {
      Fail(line, "'generator' object is not reversible");
    }
    std::vector<Value> items = Iterate(v, line);
    if (items.empty()) return Value::Undefined(name + " of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    Json out = Json::array();
    for (const Value& item : Iterate(v, line)) out.push_back(ToJson(item, line));
    return Value::Of(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> cps = CodePoints(v.json.get<std::string>());
      std::string out;
      for (size_t i = cps.size(); i-- > 0;) out += cps[i];
      return Value::Of(std::move(out));
    }
    std::vector<Value> items = Iterate(v, line);
    Json out = Json::array();
    for (size_t i = items.size(); i-- > 0;) out.push_back(ToJson(items[i], line));
    return Value::Lazily(std::move(out), Value::kGenerator);
  }
  if (name == "join") {
    const Value* sep = args.Get(0, "d");
    const Value* attribute = args.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(v, line)) {
      if (!first) out += sep ? Str(*sep, line) : "";
      out += Str(attribute ? Attribute(item, *attribute, line) : item, line);
      first = false;
      if (out.size() > kMaxOutputBytes) Fail(line, "string value over 16 MiB");
    }
    return Value::Of(std::move(out));
  }
  if (name == "items") {
    if (v.kind == Value::kUndefined) return Value::Of(Json::array());
    if (!(v.kind == Value::kJson && v.json.is_object())) {
      Fail(line, "items filter expects a mapping, got " + TypeName(v));
    }
    Value items = CallMethod(v.json, "items", Args{}, line);
    items.lazy = Value::kGenerator;
    return items;
  }
  if (name == "int") {
    const Value* def = args.Get(0, "default");
    const Value* base = args.Get(1, "base");
    if (base != nullptr &&
        !(base->kind == Value::kJson && IsInt(base->json) && AsInt(base->json) == 10)) {
      Fail(line, "unsupported: int filter with a base other than 10");
    }
    const Value fallback = def ? *def : Value::Of(0);
    if (v.kind != Value::kJson) return fallback;
    if (IsInt(v.json)) return Value::Of(AsInt(v.json));
    if (v.json.is_number_float()) {
      const double d = v.json.get<double>();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
      return Value::Of(static_cast<int64_t>(d));
    }
    if (v.json.is_string()) {
      const std::string s = PyStrip(v.json.get<std::string>(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end == s.c_str() + s.size() && errno == 0)
        return Value::Of(static_cast<int64_t>(i));
      errno = 0;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(d) &&
          std::fabs(d) < 9.2e18) {
        return Value::Of(static_cast<int64_t>(d));
      }
    }
    return fallback;
  }
  if (name == "float") {
    const Value* def = args.Get(0, "default");
    const Value fallback = def ? *def : Value::Of(0.0);
    if (v.kind != Value::kJson) return fallback;
    if (IsNumber(v.json)) return Value::Of(AsDouble(v.json));
    if (v.json.is_string()) {
      const std::string s = PyStrip(v.json.get<std::string>(), nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::Of(d);
    }
    return fallback;
  }
  if (name == "abs") {
    if (v.kind != Value::kJson || !IsNumber(v.json)) Fail(line, "abs expects a number");
    if (IsInt(v.json)) {
      const int64_t i = AsInt(v.json);
      if (i == INT64_MIN) Fail(line, "integer overflow");
      return Value::Of(i < 0 ? -i : i);
    }
    return Value::Of(std::fabs(v.json.get<double>()));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "selectattr" || name == "select";
    size_t next = 0;
    const Value* attribute = nullptr;
    if (by_attr) {
      attribute = args.Get(next++, "");
      if (attribute == nullptr) Fail(line, name + " needs an attribute name");
    }
    const Value* test = args.Get(next++, "");
    Args test_args;
    for (size_t i = next; i < args.positional.size(); ++i) {
      test_args.positional.push_back(args.positional[i]);
    }
    Json out = Json::array();
    for (const Value& item : Iterate(v, line)) {
      const Value subject = by_attr ? Attribute(item, *attribute, line) : item;
      const bool r = test ? Test(AsString(*test, line, name.c_str()), subject, test_args, line)
                          : Truthy(subject);
      if (r == keep) out.push_back(ToJson(item, line));
    }
    return Value::Lazily(std::move(out), Value::kGenerator);
  }
  if (name == "map") {
    const Value* attribute = nullptr;
    for (const auto& [k, val] : args.keyword) {
      if (k == "attribute") attribute = &val;
    }
    const Value* def = nullptr;
    for (const auto& [k, val] : args.keyword) {
      if (k == "default") def = &val;
    }
    Json out = Json::array();
    for (const Value& item : Iterate(v, line)) {
      Value r;
      if (attribute != nullptr) {
        r = Attribute(item, *attribute, line);
        if (!r.defined() && def != nullptr) r = *def;
      } else {
        if (args.positional.empty()) Fail(line, "map needs a filter name or attribute=");
        Args rest;
        for (size_t i = 1; i < args.positional.size(); ++i)
          rest.positional.push_back(args.positional[i]);
        r = Filter(AsString(args.positional[0], line, "map"), item, rest, line, scope);
      }
      out.push_back(ToJson(r, line));
    }
    return Value::Lazily(std::move(out), Value::kGenerator);
  }
  Fail(line, "unsupported filter '" + name + "'");
}

// jinja2's attribute lookup for filters: dotted path, integers index lists.
Value Renderer::Attribute(const Value& item, const Value& attribute, int line) {
  if (attribute.kind == Value::kJson && IsInt(attribute.json))
    return GetItem(item, attribute, line);
  Value cur = item;
  const std::string& path = AsString(attribute, line, "attribute");
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.kind == Value::kUndefined) return cur;
    cur = GetItem(cur, Value::Of(part), line);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

std::string Renderer::ToJsonText(const Value& v, const Args& args, int line) {
  if (v.kind != Value::kJson) {
    Fail(line, "Object of type " + TypeName(v) + " is not JSON serializable");
  }
  DumpStyle style;
  const Value* indent = args.Get(0, "indent");
  if (indent != nullptr && !(indent->kind == Value::kJson && indent->json.is_null())) {
    style.has_indent = true;
    style.item_sep = ",";
    if (indent->is_string()) {
      style.indent = indent->json.get<std::string>();
    } else {
      const int64_t n = AsIntArg(*indent, line, "tojson indent");
      style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 64)), ' ');
    }
  }
  for (const auto& [k, val] : args.keyword) {
    if (k == "separators" && !(val.kind == Value::kJson && val.json.is_null())) {
      if (!(val.kind == Value::kJson && val.json.is_array() && val.json.size() == 2 &&
            val.json[0].is_string() && val.json[1].is_string())) {
        Fail(line, "tojson separators must be a pair of strings");
      }
      style.item_sep = val.json[0].get<std::string>();
      style.key_sep = val.json[1].get<std::string>();
    } else if (k == "sort_keys") {
      style.sort_keys = Truthy(val);
    } else if (k == "ensure_ascii") {
      if (Truthy(val)) Fail(line, "unsupported: tojson(ensure_ascii=True)");
    } else if (k != "indent") {
      Fail(line, "tojson has no argument '" + k + "'");
    }
  }
  std::string out;
  PyJsonDump(v.json, style, 0, &out);
  return out;
}

}  // namespace gyre::text::jinja
