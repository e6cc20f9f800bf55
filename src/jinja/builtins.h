#pragma once
// What templates can call: str and dict methods, filters, tests and global functions
// (range, namespace, raise_exception, strftime_now, dict). Internal to the template engine.
#include <string>
#include <string_view>

#include "jinja/interp.h"

namespace sieve::jinja {

// self.name(args) for a string or dict `self`.
Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& args, Pos pos);
// The value at `path` ("a.b", "0") inside `item`, as map()/selectattr() address attributes.
Value attribute_path(const Value& item, const std::string& path, Pos pos);
FilterFn find_filter(std::string_view name);  // null if unknown
TestFn find_test(std::string_view name);      // null if unknown
const Scope& builtins();                      // global functions, looked up last

}  // namespace sieve::jinja
