#include "server/tool_calls.h"

#include <random>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace sieve::server {

namespace {

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kMistralToolCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
// A newer-style Mistral call's name (and id) before [ARGS]: longer than this is not a call.
constexpr size_t kMaxMistralHeader = 256;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool all_space(std::string_view s) {
  for (char c : s) {
    if (!is_space(c)) return false;
  }
  return true;
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string random_alnum(size_t n) {
  static constexpr std::string_view kChars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kChars.size() - 1);
  std::string out(n, ' ');
  for (char& c : out) c = kChars[pick(rng)];
  return out;
}

std::string new_call_id(ToolCallFormat format) {
  // Mistral's templates insist on 9-character alphanumeric ids.
  return format == ToolCallFormat::kMistral ? random_alnum(9) : "call_" + random_alnum(24);
}

std::string_view marker_of(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return kPythonTag;
    case ToolCallFormat::kHermes:
      return kToolCallOpen;
    case ToolCallFormat::kMistral:
      return kMistralToolCalls;
    case ToolCallFormat::kNone:
      break;
  }
  return {};
}

// The character a call without a marker starts with.
char bare_open_of(ToolCallFormat format) { return format == ToolCallFormat::kMistral ? '[' : '{'; }

// The end (one past) of the JSON object or array that starts at text[start] ('{' or '['):
// nullopt while it is incomplete; `bad` when its brackets do not match. Strings and escapes are
// skipped; the rest is checked by the JSON parser afterwards.
std::optional<size_t> json_extent(std::string_view text, size_t start, bool& bad) {
  std::string closers;
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      closers.push_back('}');
    } else if (c == '[') {
      closers.push_back(']');
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) {
        bad = true;
        return std::nullopt;
      }
      closers.pop_back();
      if (closers.empty()) return i + 1;
    }
  }
  return std::nullopt;
}

// A call object {"name": ..., "arguments" or "parameters": {...}, "id"?}; nullopt if it is not
// one. Arguments the model wrote as a JSON string are kept as that string.
std::optional<ToolCall> call_from_json(const json& j, ToolCallFormat format) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ToolCall call{.name = name->get<std::string>()};
  if (args == j.end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_string()) {
    call.arguments = args->get<std::string>();
    if (!parse_json(call.arguments)) return std::nullopt;
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else {
    return std::nullopt;
  }
  auto id = j.find("id");
  call.id = id != j.end() && id->is_string() && !id->get<std::string>().empty()
                ? id->get<std::string>()
                : new_call_id(format);
  return call;
}

// Bytes at the end of `text` that are a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "none";
}

std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kLlama3Json,
                           ToolCallFormat::kHermes, ToolCallFormat::kMistral}) {
    if (name == tool_call_format_name(f)) return f;
  }
  return std::nullopt;
}

ToolCallFormat detect_tool_call_format(std::string_view chat_template) {
  auto has = [&](std::string_view s) { return chat_template.find(s) != std::string_view::npos; };
  if (has(kMistralToolCalls)) return ToolCallFormat::kMistral;
  if (has(kToolCallOpen)) return ToolCallFormat::kHermes;
  if (has(kPythonTag) || (has("ipython") && has("\"parameters\""))) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

json tool_call_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

ToolCallParser::ToolCallParser(ToolCallOptions options) : options_(options) {}

ToolCallDelta ToolCallParser::push(std::string_view text) {
  held_ += text;
  ToolCallDelta out;
  run(/*final=*/false, out);
  return out;
}

ToolCallDelta ToolCallParser::finish(bool cut_off) {
  cut_off_ = cut_off;
  ToolCallDelta out;
  run(/*final=*/true, out);
  return out;
}

bool ToolCallParser::bare_start_allowed() const {
  if (options_.constrained) return !released_text_ || after_call_;
  // Llama 3 writes a call as plain JSON when it is the whole answer (vLLM's rule too).
  return options_.format == ToolCallFormat::kLlama3Json && (!released_text_ || after_call_);
}

std::optional<ToolCallParser::Start> ToolCallParser::find_start() const {
  std::optional<Start> start;
  const std::string_view marker = marker_of(options_.format);
  if (const size_t pos = held_.find(marker); !marker.empty() && pos != std::string::npos) {
    start = Start{.pos = pos, .marker_len = marker.size()};
  }
  if (bare_start_allowed()) {
    const size_t i = skip_space(held_, 0);
    if (i < held_.size() && held_[i] == bare_open_of(options_.format) && (!start || i < start->pos))
      start = Start{.pos = i, .marker_len = 0};
  }
  return start;
}

size_t ToolCallParser::held_tail() const {
  size_t keep = partial_marker(held_, marker_of(options_.format));
  if (bare_start_allowed()) {
    // Nothing but blanks yet: a bare call may still come.
    if (all_space(held_)) return held_.size();
  }
  while (keep < held_.size() && is_space(held_[held_.size() - keep - 1])) ++keep;
  return keep;
}

void ToolCallParser::run(bool final, ToolCallDelta& out) {
  auto release = [&](std::string_view text) {
    if (text.empty()) return;
    out.content += text;
    if (!all_space(text)) {
      released_text_ = true;
      after_call_ = false;
    }
  };
  while (true) {
    if (mode_ == Mode::kContent) {
      if (after_call_) {
        // Blanks (and Llama's ';' separators) after a call are not content.
        size_t gap = 0;
        while (gap < held_.size() &&
               (is_space(held_[gap]) ||
                (held_[gap] == ';' && options_.format == ToolCallFormat::kLlama3Json))) {
          ++gap;
        }
        held_.erase(0, gap);
      }
      if (const auto start = find_start()) {
        size_t cut = start->pos;
        while (cut > 0 && is_space(held_[cut - 1])) --cut;  // blanks before a call are dropped
        release(std::string_view(held_).substr(0, cut));
        pending_ = held_.substr(cut, start->pos + start->marker_len - cut);
        held_.erase(0, start->pos + start->marker_len);
        mode_ = Mode::kCall;
        continue;
      }
      // Cut off: a marker's beginning at the end was a call starting; it is dropped.
      const size_t keep = !final     ? held_tail()
                          : cut_off_ ? partial_marker(held_, marker_of(options_.format))
                                     : 0;
      release(std::string_view(held_).substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      return;
    }
    Unit unit = read_calls(final, out);
    if (unit == Unit::kNeedMore && final && cut_off_) {  // a call the length limit cut short
      held_.clear();
      pending_.clear();
      mode_ = Mode::kContent;
      return;
    }
    if (unit == Unit::kNeedMore && final) unit = Unit::kBad;
    if (unit == Unit::kNeedMore) return;
    mode_ = Mode::kContent;
    if (unit == Unit::kDone) {
      pending_.clear();
      after_call_ = true;
      continue;
    }
    // Not a call: the marker (or bare opening) is content, and the rest is read again as content
    // (it may hold a real call further on).
    const bool bare = all_space(pending_);
    std::string text = std::move(pending_);
    pending_.clear();
    if (bare) {
      // A bare opening: its bracket is content too, so the rescan does not start a call there.
      const size_t open = skip_space(held_, 0);
      text += held_.substr(0, std::min(open + 1, held_.size()));
      held_.erase(0, std::min(open + 1, held_.size()));
    }
    release(text);
    released_text_ = true;
    after_call_ = false;
  }
}

ToolCallParser::Unit ToolCallParser::read_calls(bool final, ToolCallDelta& out) {
  const size_t i = skip_space(held_, 0);
  if (i == held_.size()) return Unit::kNeedMore;
  const bool marked = !pending_.empty() && !all_space(pending_);
  auto add = [&](ToolCall call) {
    out.calls.push_back(std::move(call));
    ++num_calls_;
  };
  const char c = held_[i];
  if (options_.format == ToolCallFormat::kMistral && c != '[' && c != '{') {
    // Newer tokenizers: [TOOL_CALLS]name[ARGS]{...} or [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}.
    if (!marked) return Unit::kBad;
    const size_t args = held_.find(kMistralArgs, i);
    if (args == std::string::npos) {
      return held_.size() - i > kMaxMistralHeader ? Unit::kBad : Unit::kNeedMore;
    }
    std::string name = held_.substr(i, args - i);
    std::string id;
    if (const size_t id_pos = name.find(kMistralCallId); id_pos != std::string::npos) {
      id = name.substr(id_pos + kMistralCallId.size());
      name.resize(id_pos);
    }
    if (name.empty()) return Unit::kBad;
    for (char ch : name) {
      if (!is_name_char(ch)) return Unit::kBad;
    }
    const size_t body = skip_space(held_, args + kMistralArgs.size());
    if (body == held_.size()) return Unit::kNeedMore;
    if (held_[body] != '{') return Unit::kBad;
    bool bad = false;
    const auto end = json_extent(held_, body, bad);
    if (bad) return Unit::kBad;
    if (!end) return Unit::kNeedMore;
    const auto arguments = parse_json(std::string_view(held_).substr(body, *end - body));
    if (!arguments || !arguments->is_object()) return Unit::kBad;
    add(ToolCall{.id = id.empty() ? new_call_id(options_.format) : id,
                 .name = std::move(name),
                 .arguments = arguments->dump()});
    held_.erase(0, *end);
    return Unit::kDone;
  }
  if (c != '{' && !(c == '[' && options_.format == ToolCallFormat::kMistral)) return Unit::kBad;
  bool bad = false;
  const auto end = json_extent(held_, i, bad);
  if (bad) return Unit::kBad;
  if (!end) return Unit::kNeedMore;
  const auto parsed = parse_json(std::string_view(held_).substr(i, *end - i));
  if (!parsed) return Unit::kBad;
  std::vector<ToolCall> calls;
  if (parsed->is_array()) {
    if (parsed->empty()) return Unit::kBad;
    for (const auto& item : *parsed) {
      auto call = call_from_json(item, options_.format);
      if (!call) return Unit::kBad;
      calls.push_back(std::move(*call));
    }
  } else {
    auto call = call_from_json(*parsed, options_.format);
    if (!call) return Unit::kBad;
    calls.push_back(std::move(*call));
  }
  size_t used = *end;
  if (options_.format == ToolCallFormat::kHermes && marked) {
    // The closing tag; an output that ends before it still counts.
    const size_t close = skip_space(held_, used);
    const std::string_view rest = std::string_view(held_).substr(close);
    if (rest.starts_with(kToolCallClose)) {
      used = close + kToolCallClose.size();
    } else if (rest.empty() || std::string_view(kToolCallClose).starts_with(rest)) {
      if (!final) return Unit::kNeedMore;
      used = held_.size();
    } else {
      return Unit::kBad;
    }
  }
  for (auto& call : calls) add(std::move(call));
  held_.erase(0, used);
  return Unit::kDone;
}

ParsedToolCalls parse_tool_calls(ToolCallOptions options, std::string_view text, bool cut_off) {
  ToolCallParser parser(options);
  ToolCallDelta a = parser.push(text);
  ToolCallDelta b = parser.finish(cut_off);
  ParsedToolCalls out;
  out.calls = std::move(a.calls);
  for (auto& call : b.calls) out.calls.push_back(std::move(call));
  std::string content = a.content + b.content;
  if (out.calls.empty() || !all_space(content)) out.content = std::move(content);
  return out;
}

std::string tool_call_gbnf(ToolCallFormat format, const std::vector<ToolFunction>& functions,
                           bool parallel) {
  const char* args_key = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  json alternatives = json::array();
  for (const ToolFunction& f : functions) {
    json properties = json::object();
    properties["name"] = {{"const", f.name}};
    properties[args_key] = f.parameters.is_null()
                               ? json{{"type", "object"}, {"properties", json::object()}}
                               : f.parameters;
    alternatives.push_back({{"type", "object"},
                            {"properties", std::move(properties)},
                            {"required", {"name", args_key}}});
  }
  json call = alternatives.size() == 1 ? alternatives[0] : json{{"anyOf", alternatives}};
  if (format == ToolCallFormat::kMistral) {
    json array = {{"type", "array"}, {"items", std::move(call)}, {"minItems", 1}};
    if (!parallel) array["maxItems"] = 1;
    return grammar::json_schema_to_gbnf(array.dump());
  }
  const std::string one = grammar::json_schema_to_gbnf(call.dump());
  if (!parallel) return one;
  // Several calls: the call grammar's rules under a prefix, and a root that repeats it.
  grammar::Grammar g = grammar::parse_gbnf(one);
  const std::string root_name = "call-" + g.rules[g.root_idx].name;
  for (grammar::Rule& rule : g.rules) rule.name = "call-" + rule.name;
  const char* separator = format == ToolCallFormat::kHermes ? "\\n" : "; ";
  return grammar::to_gbnf(g) + "root ::= " + root_name + " (\"" + separator + "\" " + root_name +
         ")*\n";
}

}  // namespace sieve::server
