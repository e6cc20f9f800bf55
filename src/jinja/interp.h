#pragma once
// Rendering state and the evaluation helpers shared by the AST (interp.cc) and the builtins
// (builtins.cc); a caller renders a parsed Body with an Interp and render_body()
// (see server/chat_template.cc).
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "jinja/limits.h"
#include "jinja/syntax.h"

namespace sieve::jinja {

using Scope = std::unordered_map<std::string, Value>;

struct Interp {
  const Limits& limits;
  // scopes[0]: the render context plus top-level {% set %}s. A for-loop iteration or a macro
  // call pushes one; a macro body sees only scopes[0] and its own (scope_base up).
  std::vector<Scope> scopes;
  size_t scope_base = 1;
  size_t steps = 0;
  size_t allocated = 0;
  int call_depth = 0;

  void step(Pos pos) {
    if (++steps > limits.max_steps) {
      fail_at(pos, fmt::format("rendering exceeds the limit of {} steps", limits.max_steps));
    }
  }
  // Called before building a string or list of `bytes`.
  void charge(size_t bytes, Pos pos) {
    if (bytes > limits.max_allocated_bytes || allocated + bytes > limits.max_allocated_bytes) {
      fail_at(pos, fmt::format("rendering exceeds the limit of {} bytes of values",
                               limits.max_allocated_bytes));
    }
    allocated += bytes;
  }
  Value make_string(std::string s, Pos pos) {
    charge(s.size(), pos);
    return string(std::move(s));
  }
  Value make_list(List items, Pos pos) {
    charge(items.size() * sizeof(Value), pos);
    return list(std::move(items));
  }
  void check_output(const std::string& out, Pos pos) const {
    if (out.size() > limits.max_output_bytes) {
      fail_at(pos, fmt::format("output exceeds the limit of {} bytes", limits.max_output_bytes));
    }
  }
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v) { scopes.back()[name] = std::move(v); }
};

Flow render_body(const Body& body, Interp& in, std::string& out);

// Call arguments by position or keyword; null when absent.
const Value* arg(const CallArgs& args, size_t index, std::string_view name);
const std::string& expect_string(const Value& v, std::string_view what, Pos pos);
int64_t expect_int(const Value& v, std::string_view what, Pos pos);
std::optional<std::string> optional_string(const CallArgs& args, size_t index,
                                           std::string_view name, Pos pos);

List iterate(const Value& v, Pos pos);                               // what `for x in v` visits
Value get_attr(const Value& obj, const std::string& name, Pos pos);  // obj.name
Value get_item(const Value& obj, const Value& key, Pos pos);         // obj[key]
bool contains(const Value& container, const Value& item, Pos pos);   // item in container
// + - * / // % ** with Python's rules.
Value arithmetic(Interp& in, const std::string& op, const Value& l, const Value& r, Pos pos);

}  // namespace sieve::jinja
