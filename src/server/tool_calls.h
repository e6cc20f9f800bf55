#pragma once
// Tool calls of /v1/chat/completions, per model family: how a family's model writes a call, how
// its output is read back into OpenAI `tool_calls` (whole or streamed), and the grammar that
// makes `tool_choice: "required"` / a named function always produce a valid call.
//
// What each family's model writes (after its prompt), and the constrained output:
// - llama3_json: [<|python_tag|>]{"name": f, "parameters": {..}} [; {..}];
//   constrained: {"name": f, "parameters": ..}
// - hermes: <tool_call>\n{"name": f, "arguments": {..}}\n</tool_call>;
//   constrained: {"name": f, "arguments": ..}
// - mistral: [TOOL_CALLS] [{"name": f, "arguments": {..}, "id"?}, ..], or [TOOL_CALLS]f[ARGS]{..}
//   of newer tokenizers ([CALL_ID]id optional); constrained: [{"name": f, "arguments": ..}]
//
// A constrained output carries no marker: the grammar engine never samples special tokens
// (<|python_tag|>, [TOOL_CALLS], Qwen's <tool_call>), so it writes the JSON part only and the
// parser, told the request was constrained, reads a call from the first character. Several
// constrained calls (parallel_tool_calls) are separated by "\n" (hermes) or "; " (llama3_json),
// or are elements of the one array (mistral).
//
//   generated text ──► ToolCallParser::push (per choice, any split) ──► content, calls
//   end of output  ──► ToolCallParser::finish ──► what was held: calls or content (output cut
//                      off at max_tokens: a call it was writing is dropped, never content)
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/json.h"

namespace sieve::server {

enum class ToolCallFormat { kNone, kLlama3Json, kHermes, kMistral };

// "none", "llama3_json", "hermes", "mistral" (vLLM's --tool-call-parser names).
std::string_view tool_call_format_name(ToolCallFormat format);
// The format for a --tool-call-parser value other than "auto"; nullopt for an unknown name.
std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name);
// The family a chat template's text is written for: [TOOL_CALLS] → mistral, <tool_call> →
// hermes, <|python_tag|> or an ipython role with "parameters" → llama3_json, else none.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

// A function the request offers (tools[i].function), validated.
struct ToolFunction {
  std::string name;  // [A-Za-z0-9_-]{1,64}, as OpenAI requires
  json parameters;   // a JSON Schema, its keys in the request's order; null: none (no arguments)
};

// How a request's output is read: the family, and whether a grammar forced the calls (then the
// output is calls only, without markers).
struct ToolCallOptions {
  ToolCallFormat format = ToolCallFormat::kNone;
  bool constrained = false;
};

// One parsed call, as OpenAI sends it: arguments is JSON text (compact, the model's key order).
struct ToolCall {
  std::string id;  // "call_" + 24 alphanumerics; mistral: the model's id or 9 alphanumerics
  std::string name;
  std::string arguments;
};

// The OpenAI message object of a call: {"id", "type": "function", "function": {name, arguments}}.
json tool_call_json(const ToolCall& call);

// What the parser releases: text that is content for sure, then the calls completed since.
struct ToolCallDelta {
  std::string content;
  std::vector<ToolCall> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Reads one choice's output as it streams. Text before a call marker is released as content,
// except a tail that may still become a marker (e.g. "<tool_" for hermes) and whitespace right
// before a marker (dropped when a call follows). From a marker on, text is held until the call
// is complete (then released as a ToolCall) or is clearly not a call (then released, marker and
// all, as content). The released content and calls are the same however the text is split.
// A plain value: copy it with the choice.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallOptions options);
  ToolCallDelta push(std::string_view text);
  // The end of the output: a held call that is complete is released, anything else as content.
  // `cut_off` (the output stopped at its length limit): a call not complete yet, or a marker's
  // beginning, is what the model was writing when it was stopped: dropped, not content.
  ToolCallDelta finish(bool cut_off = false);
  size_t num_calls() const { return num_calls_; }

 private:
  enum class Mode { kContent, kCall };
  enum class Unit { kNeedMore, kBad, kDone };
  void run(bool final, ToolCallDelta& out);
  // kCall: reads the call(s) at the start of held_ (whitespace skipped), erases what it used.
  Unit read_calls(bool final, ToolCallDelta& out);
  // Where a call starts in held_ (a marker, or a bare call where one may start) and its length.
  struct Start {
    size_t pos = 0;
    size_t marker_len = 0;
  };
  std::optional<Start> find_start() const;
  size_t held_tail() const;  // bytes at the end of held_ that may still begin a call
  bool bare_start_allowed() const;

  ToolCallOptions options_;
  Mode mode_ = Mode::kContent;
  std::string held_;            // text not released yet (kCall: after the marker)
  std::string pending_;         // kCall: the whitespace and marker before held_, content if no call
  bool released_text_ = false;  // some non-whitespace content was released
  bool after_call_ = false;     // the last thing read was a call
  size_t num_calls_ = 0;
  bool cut_off_ = false;  // finish(cut_off = true)
};

// The whole output at once: content (nullopt when there are calls and no other text) and calls.
struct ParsedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls parse_tool_calls(ToolCallOptions options, std::string_view text,
                                 bool cut_off = false);

// GBNF for the constrained output of `functions` (the request's tools, or the one named):
// exactly one call, or one or more when `parallel`. Throws sieve::Error when a parameters
// schema uses what the JSON Schema compiler does not support (json_schema.h).
std::string tool_call_gbnf(ToolCallFormat format, const std::vector<ToolFunction>& functions,
                           bool parallel);

}  // namespace sieve::server
