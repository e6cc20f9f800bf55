#include "jinja/interp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "jinja/builtins.h"

namespace sieve::jinja {

Value Interp::lookup(const std::string& name) const {
  for (size_t i = scopes.size(); i-- > scope_base;) {
    const auto it = scopes[i].find(name);
    if (it != scopes[i].end()) return it->second;
  }
  if (const auto it = scopes[0].find(name); it != scopes[0].end()) return it->second;
  if (const auto it = builtins().find(name); it != builtins().end()) return it->second;
  return undefined(fmt::format("'{}' is undefined", name));
}

Flow render_body(const Body& body, Interp& in, std::string& out) {
  for (const auto& node : body) {
    in.step(node->pos);
    const Flow flow = node->render(in, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

const Value* arg(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.named) {
    if (k == name) return &v;
  }
  return nullptr;
}

const std::string& expect_string(const Value& v, std::string_view what, Pos pos) {
  if (v.kind == Kind::kUndefined) fail_undefined(v, pos);
  if (v.kind != Kind::kString) {
    fail_at(pos, fmt::format("{} must be a string, not '{}'", what, type_name(v)));
  }
  return *v.str;
}

int64_t expect_int(const Value& v, std::string_view what, Pos pos) {
  if (v.kind == Kind::kUndefined) fail_undefined(v, pos);
  if (!is_integral(v)) {
    fail_at(pos, fmt::format("{} must be an integer, not '{}'", what, type_name(v)));
  }
  return as_int(v);
}

std::optional<std::string> optional_string(const CallArgs& args, size_t index,
                                           std::string_view name, Pos pos) {
  const Value* v = arg(args, index, name);
  if (v == nullptr || v->kind == Kind::kNone) return std::nullopt;
  return expect_string(*v, name, pos);
}

// What `for x in v` visits.
List iterate(const Value& v, Pos pos) {
  switch (v.kind) {
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      List keys;
      for (const auto& [k, unused] : v.dict->items) keys.push_back(string(k));
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (auto& cp : code_points(*v.str)) chars.push_back(string(std::move(cp)));
      return chars;
    }
    case Kind::kUndefined:
      return {};
    default:
      fail_at(pos, fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

namespace {

bool is_string_method(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "strip",    "lstrip", "rstrip",  "upper", "lower", "title",      "capitalize", "startswith",
      "endswith", "split",  "replace", "find",  "join",  "splitlines", "count"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool is_dict_method(std::string_view name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

Value bound_method(const Value& self, const std::string& name) {
  Value method = callable(name, [self, name](Interp& in, CallArgs& args, Pos pos) {
    return call_method(in, self, name, args, pos);
  });
  method.depth = self.depth + 1;  // it holds `self`
  return method;
}

}  // namespace

// obj.name: Jinja tries the Python attribute first (methods), then the item.
Value get_attr(const Value& obj, const std::string& name, Pos pos) {
  switch (obj.kind) {
    case Kind::kUndefined:
      fail_undefined(obj, pos);
    case Kind::kDict: {
      if (is_dict_method(name)) return bound_method(obj, name);
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    }
    case Kind::kNamespace:
      if (const Value* v = obj.ns->find(name)) return *v;
      break;
    case Kind::kString:
      if (is_string_method(name)) return bound_method(obj, name);
      break;
    default:
      break;
  }
  return undefined(fmt::format("'{}' object has no attribute '{}'", type_name(obj), name));
}

// obj[key]: the item first, then the attribute; a missing one is undefined, not an error.
Value get_item(const Value& obj, const Value& key, Pos pos) {
  if (obj.kind == Kind::kUndefined) fail_undefined(obj, pos);
  if (key.kind == Kind::kUndefined) return key;  // d[undefined] is just a missing item
  if ((obj.kind == Kind::kList || obj.kind == Kind::kString) && is_integral(key)) {
    int64_t index = as_int(key);
    if (obj.kind == Kind::kList) {
      const int64_t size = static_cast<int64_t>(obj.list->size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) return (*obj.list)[static_cast<size_t>(index)];
    } else {
      const auto cps = code_points(*obj.str);
      const int64_t size = static_cast<int64_t>(cps.size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) return string(cps[static_cast<size_t>(index)]);
    }
    return undefined(fmt::format("{} index {} out of range", type_name(obj), as_int(key)));
  }
  if (key.kind == Kind::kString) {
    if (obj.kind == Kind::kDict) {
      if (const Value* v = obj.dict->find(*key.str)) return *v;
    }
    return get_attr(obj, *key.str, pos);
  }
  return undefined(fmt::format("'{}' object has no item {}", type_name(obj), repr(key)));
}

namespace {

// Python's slice index arithmetic.
std::vector<size_t> slice_indices(int64_t size, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  int64_t lo, hi;
  if (step > 0) {
    lo = start.value_or(0);
    hi = stop.value_or(size);
    if (lo < 0) lo = std::max<int64_t>(0, lo + size);
    if (hi < 0) hi = std::max<int64_t>(0, hi + size);
    lo = std::min(lo, size);
    hi = std::min(hi, size);
  } else {
    lo = start.value_or(size - 1);
    hi = stop.value_or(-1 - size);
    if (lo < 0) lo = std::max<int64_t>(-1, lo + size);
    if (hi < 0) hi = std::max<int64_t>(-1, hi + size);
    lo = std::min(lo, size - 1);
    hi = std::min(hi, size - 1);
  }
  std::vector<size_t> out;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

}  // namespace

bool contains(const Value& container, const Value& item, Pos pos) {
  switch (container.kind) {
    case Kind::kString:
      if (item.kind != Kind::kString) {
        fail_at(pos, fmt::format("'in <string>' requires string as left operand, not {}",
                                 type_name(item)));
      }
      return container.str->find(*item.str) != std::string::npos;
    case Kind::kList:
      return std::any_of(container.list->begin(), container.list->end(),
                         [&](const Value& v) { return equal(v, item); });
    case Kind::kDict:
      return item.kind == Kind::kString && container.dict->find(*item.str);
    case Kind::kNamespace:
      return item.kind == Kind::kString && container.ns->find(*item.str);
    case Kind::kUndefined:
      return false;
    default:
      fail_at(pos, fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

Value arithmetic(Interp& in, const std::string& op, const Value& l, const Value& r, Pos pos) {
  if (l.is_undefined()) fail_undefined(l, pos);
  if (r.is_undefined()) fail_undefined(r, pos);
  if (l.is_number() && r.is_number()) {
    const bool ints = is_integral(l) && is_integral(r);
    const int64_t a = as_int(l), b = as_int(r);
    const double x = as_double(l), y = as_double(r);
    int64_t result = 0;
    if (op == "+") {
      if (ints && !__builtin_add_overflow(a, b, &result)) return integer(result);
      return floating(x + y);
    }
    if (op == "-") {
      if (ints && !__builtin_sub_overflow(a, b, &result)) return integer(result);
      return floating(x - y);
    }
    if (op == "*") {
      if (ints && !__builtin_mul_overflow(a, b, &result)) return integer(result);
      return floating(x * y);
    }
    if (op == "/") {
      if (y == 0) fail_at(pos, "division by zero");
      return floating(x / y);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (b == 0) fail_at(pos, "integer division or modulo by zero");
        if (a == std::numeric_limits<int64_t>::min() && b == -1) return floating(-x);
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
          --q;
          m += b;
        }
        return integer(op == "//" ? q : m);
      }
      if (y == 0) fail_at(pos, "float division or modulo by zero");
      const double q = std::floor(x / y);
      return floating(op == "//" ? q : x - q * y);
    }
    if (op == "**") {
      if (ints && b >= 0) {
        int64_t base = a, exponent = b, acc = 1;
        bool overflow = false;
        while (exponent > 0 && !overflow) {
          if (exponent & 1) overflow = __builtin_mul_overflow(acc, base, &acc);
          exponent >>= 1;
          if (exponent > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
        }
        if (!overflow) return integer(acc);
      }
      return floating(std::pow(x, y));
    }
  }
  if (op == "+" && l.kind == Kind::kString && r.kind == Kind::kString) {
    in.charge(l.str->size() + r.str->size(), pos);
    return string(*l.str + *r.str);
  }
  if (op == "+" && l.kind == Kind::kList && r.kind == Kind::kList) {
    List items = *l.list;
    items.insert(items.end(), r.list->begin(), r.list->end());
    return in.make_list(std::move(items), pos);
  }
  if (op == "*" && (l.kind == Kind::kString || l.kind == Kind::kList) && is_integral(r)) {
    const int64_t times = std::max<int64_t>(0, as_int(r));
    const size_t unit = l.kind == Kind::kString ? l.str->size() : l.list->size() * sizeof(Value);
    if (unit == 0 || times == 0) return l.kind == Kind::kString ? string("") : list({});
    if (unit > 0 && static_cast<uint64_t>(times) > in.limits.max_allocated_bytes / unit) {
      in.charge(in.limits.max_allocated_bytes + 1, pos);  // fails with the limit's message
    }
    in.charge(unit * static_cast<size_t>(times), pos);
    if (l.kind == Kind::kString) {
      std::string s;
      for (int64_t k = 0; k < times; ++k) s += *l.str;
      return string(std::move(s));
    }
    List items;
    for (int64_t k = 0; k < times; ++k) items.insert(items.end(), l.list->begin(), l.list->end());
    return list(std::move(items));
  }
  if (op == "*" && is_integral(l) && (r.kind == Kind::kString || r.kind == Kind::kList)) {
    return arithmetic(in, op, r, l, pos);
  }
  fail_at(pos, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(l),
                           type_name(r)));
}

Value Name::eval(Interp& in) const {
  in.step(pos);
  return in.lookup(name);
}

Value ListLiteral::eval(Interp& in) const {
  in.step(pos);
  List values;
  values.reserve(items.size());
  for (const auto& e : items) values.push_back(e->eval(in));
  Value v = in.make_list(std::move(values), pos);
  v.tuple = tuple;
  return v;
}

Value DictLiteral::eval(Interp& in) const {
  in.step(pos);
  Dict d;
  for (const auto& [k, v] : items) {
    const Value key = k->eval(in);
    d.set(expect_string(key, "dict key", k->pos), v->eval(in));
  }
  in.charge(d.items.size() * sizeof(Value), pos);
  return dict(std::move(d));
}

Value Attr::eval(Interp& in) const {
  in.step(pos);
  return get_attr(object->eval(in), name, pos);
}

Value Subscript::eval(Interp& in) const {
  in.step(pos);
  const Value obj = object->eval(in);
  return get_item(obj, index->eval(in), pos);
}

Value Slice::eval(Interp& in) const {
  in.step(pos);
  const Value obj = object->eval(in);
  auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
    if (!e) return std::nullopt;
    const Value v = e->eval(in);
    if (v.kind == Kind::kNone) return std::nullopt;
    return expect_int(v, "slice index", e->pos);
  };
  const auto lo = bound(start), hi = bound(stop), by = bound(step);
  if (by && *by == 0) fail_at(pos, "slice step cannot be zero");
  if (obj.kind == Kind::kUndefined) fail_undefined(obj, pos);
  if (obj.kind == Kind::kList) {
    List items;
    for (size_t i : slice_indices(static_cast<int64_t>(obj.list->size()), lo, hi, by.value_or(1))) {
      items.push_back((*obj.list)[i]);
    }
    return in.make_list(std::move(items), pos);
  }
  if (obj.kind == Kind::kString) {
    const auto cps = code_points(*obj.str);
    std::string s;
    for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), lo, hi, by.value_or(1))) {
      s += cps[i];
    }
    return in.make_string(std::move(s), pos);
  }
  return undefined(fmt::format("'{}' object is not subscriptable", type_name(obj)));
}

namespace {

CallArgs evaluate_args(Interp& in, const std::vector<ExprPtr>& args,
                       const std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
  CallArgs out;
  out.positional.reserve(args.size());
  for (const auto& e : args) out.positional.push_back(e->eval(in));
  for (const auto& [k, e] : kwargs) out.named.emplace_back(k, e->eval(in));
  return out;
}

}  // namespace

Value Call::eval(Interp& in) const {
  in.step(pos);
  const Value fn = callee->eval(in);
  if (fn.kind == Kind::kUndefined) fail_undefined(fn, pos);
  if (fn.kind != Kind::kCallable) {
    fail_at(pos, fmt::format("'{}' object is not callable", type_name(fn)));
  }
  CallArgs call_args = evaluate_args(in, args, kwargs);
  return fn.fn->call(in, call_args, pos);
}

Value Filter::eval(Interp& in) const {
  in.step(pos);
  const Value value = operand->eval(in);
  CallArgs call_args = evaluate_args(in, args, kwargs);
  return fn(in, value, call_args, pos);
}

Value Test::eval(Interp& in) const {
  in.step(pos);
  const Value value = operand->eval(in);
  CallArgs call_args = evaluate_args(in, args, {});
  return boolean(fn(in, value, call_args, pos) != negated);
}

Value Unary::eval(Interp& in) const {
  in.step(pos);
  const Value v = operand->eval(in);
  if (op == '!') return boolean(!truthy(v));
  if (v.is_undefined()) fail_undefined(v, pos);
  if (!v.is_number()) {
    fail_at(pos, fmt::format("bad operand type for unary {}: '{}'", op, type_name(v)));
  }
  if (op == '+') return v.kind == Kind::kBool ? integer(as_int(v)) : v;
  if (v.kind == Kind::kFloat) return floating(-v.number);
  if (as_int(v) == std::numeric_limits<int64_t>::min()) return floating(-as_double(v));
  return integer(-as_int(v));
}

Value Binary::eval(Interp& in) const {
  in.step(pos);
  const Value l = left->eval(in);
  if (op == "and") return truthy(l) ? right->eval(in) : l;
  if (op == "or") return truthy(l) ? l : right->eval(in);
  const Value r = right->eval(in);
  if (op == "~") {
    std::string s = to_str(l) + to_str(r);
    return in.make_string(std::move(s), pos);
  }
  return arithmetic(in, op, l, r, pos);
}

Value Compare::eval(Interp& in) const {
  in.step(pos);
  Value l = first->eval(in);
  for (const auto& [op, expr] : rest) {
    Value r = expr->eval(in);
    bool ok;
    if (op == "==") {
      ok = equal(l, r);
    } else if (op == "!=") {
      ok = !equal(l, r);
    } else if (op == "in") {
      ok = contains(r, l, expr->pos);
    } else if (op == "notin") {
      ok = !contains(r, l, expr->pos);
    } else {
      const int c = compare(l, r, expr->pos, op.c_str());
      ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!ok) return boolean(false);
    l = std::move(r);
  }
  return boolean(true);
}

Value Conditional::eval(Interp& in) const {
  in.step(pos);
  if (truthy(cond->eval(in))) return then->eval(in);
  if (otherwise) return otherwise->eval(in);
  return undefined("the conditional expression had no else branch");
}

Flow TextNode::render(Interp& in, std::string& out) const {
  out += text;
  in.check_output(out, pos);
  return Flow::kNormal;
}

Flow OutputNode::render(Interp& in, std::string& out) const {
  const Value v = expr->eval(in);
  if (v.kind == Kind::kString) {
    out += *v.str;
  } else {
    out += to_str(v);
  }
  in.check_output(out, pos);
  return Flow::kNormal;
}

Flow IfNode::render(Interp& in, std::string& out) const {
  for (const auto& [cond, body] : branches) {
    if (truthy(cond->eval(in))) return render_body(body, in, out);
  }
  return render_body(otherwise, in, out);
}

namespace {

void bind_targets(Interp& in, const std::vector<std::string>& targets, const Value& value,
                  Pos pos) {
  if (targets.size() == 1) {
    in.assign(targets[0], value);
    return;
  }
  if (value.kind != Kind::kList || value.list->size() != targets.size()) {
    fail_at(pos, fmt::format("cannot unpack {} into {} names", type_name(value), targets.size()));
  }
  for (size_t i = 0; i < targets.size(); ++i) in.assign(targets[i], (*value.list)[i]);
}

}  // namespace

Flow ForNode::render(Interp& in, std::string& out) const {
  List items = iterate(iterable->eval(in), iterable->pos);
  in.charge(items.size() * sizeof(Value), pos);
  if (filter) {
    // `for x in xs if cond`: filtered first, so loop.index/length count the kept items only.
    List kept;
    in.scopes.emplace_back();
    for (auto& item : items) {
      in.step(pos);
      in.scopes.back().clear();
      bind_targets(in, targets, item, pos);
      if (truthy(filter->eval(in))) kept.push_back(std::move(item));
    }
    in.scopes.pop_back();
    items = std::move(kept);
  }
  if (items.empty()) return render_body(otherwise, in, out);
  const int64_t length = static_cast<int64_t>(items.size());
  auto index = std::make_shared<int64_t>(0);
  const Value cycle = callable("cycle", [index](Interp&, CallArgs& args, Pos p) {
    if (args.positional.empty()) fail_at(p, "no items for cycling given");
    return args.positional[static_cast<size_t>(*index) % args.positional.size()];
  });
  in.scopes.emplace_back();
  for (int64_t i = 0; i < length; ++i) {
    in.step(pos);
    *index = i;
    Scope& scope = in.scopes.back();
    scope.clear();
    Dict loop;
    loop.items = {{"index", integer(i + 1)},
                  {"index0", integer(i)},
                  {"revindex", integer(length - i)},
                  {"revindex0", integer(length - i - 1)},
                  {"first", boolean(i == 0)},
                  {"last", boolean(i == length - 1)},
                  {"length", integer(length)},
                  {"depth", integer(1)},
                  {"depth0", integer(0)},
                  {"cycle", cycle}};
    if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < length) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    scope["loop"] = dict(std::move(loop));
    bind_targets(in, targets, items[static_cast<size_t>(i)], pos);
    if (render_body(body, in, out) == Flow::kBreak) break;
  }
  in.scopes.pop_back();
  return Flow::kNormal;
}

Flow SetNode::render(Interp& in, std::string& out) const {
  Value v;
  if (value) {
    v = value->eval(in);
  } else {
    std::string captured;
    render_body(body, in, captured);
    v = in.make_string(std::move(captured), pos);
  }
  if (!attribute.empty()) {
    const Value target = in.lookup(targets[0]);
    if (target.kind != Kind::kNamespace) {
      fail_at(pos, fmt::format("cannot assign attribute '{}' on '{}', which is not a namespace",
                               attribute, targets[0]));
    }
    if (v.kind == Kind::kNamespace) fail_at(pos, "a namespace cannot be put in a namespace");
    target.ns->set(attribute, std::move(v));
    return Flow::kNormal;
  }
  bind_targets(in, targets, v, pos);
  return Flow::kNormal;
}

Flow MacroNode::render(Interp& in, std::string&) const {
  const MacroNode* macro = this;  // the AST outlives every render
  in.assign(name, callable(name, [macro](Interp& interp, CallArgs& args, Pos pos) {
              if (args.positional.size() > macro->params.size()) {
                fail_at(pos, fmt::format("macro '{}' takes at most {} arguments", macro->name,
                                         macro->params.size()));
              }
              for (const auto& named : args.named) {
                const std::string& k = named.first;
                const bool known = std::any_of(macro->params.begin(), macro->params.end(),
                                               [&](const auto& param) { return param.first == k; });
                if (!known) {
                  fail_at(pos, fmt::format("macro '{}' has no parameter '{}'", macro->name, k));
                }
              }
              if (++interp.call_depth > interp.limits.max_call_depth) {
                fail_at(pos, fmt::format("macro calls nest deeper than {}",
                                         interp.limits.max_call_depth));
              }
              const size_t saved_base = interp.scope_base;
              interp.scopes.emplace_back();
              interp.scope_base = interp.scopes.size() - 1;
              for (size_t i = 0; i < macro->params.size(); ++i) {
                const auto& [param, default_value] = macro->params[i];
                const Value* given = arg(args, i, param);
                interp.assign(param, given ? *given
                                     : default_value
                                         ? default_value->eval(interp)
                                         : undefined(fmt::format("'{}' is undefined", param)));
              }
              std::string result;
              render_body(macro->body, interp, result);
              interp.scopes.pop_back();
              interp.scope_base = saved_base;
              --interp.call_depth;
              return string(std::move(result));
            }));
  return Flow::kNormal;
}

Flow FilterBlockNode::render(Interp& in, std::string& out) const {
  std::string captured;
  render_body(body, in, captured);
  CallArgs call_args = evaluate_args(in, filter->args, filter->kwargs);
  out += to_str(filter->fn(in, in.make_string(std::move(captured), pos), call_args, pos));
  in.check_output(out, pos);
  return Flow::kNormal;
}

Flow BodyNode::render(Interp& in, std::string& out) const { return render_body(body, in, out); }

}  // namespace sieve::jinja
