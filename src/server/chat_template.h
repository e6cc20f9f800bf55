#pragma once
// Renders Hugging Face chat templates (GGUF key tokenizer.chat_template): the subset of Jinja2
// that real templates use, with the environment transformers uses (trim_blocks, lstrip_blocks,
// loopcontrols, a tojson that does not HTML-escape, raise_exception, strftime_now).
//
//   source ──parse──► ChatTemplate (immutable AST, shareable across threads)
//   {"messages": [...], "add_generation_prompt": true, "bos_token": ..., ...} ──render──► prompt
//
// Semantics follow Jinja2/Python where templates can tell the difference: undefined names
// render as "" and are falsy, but arithmetic or attribute access on them is an error; `str()`
// of True is "True"; `x is iterable` holds for strings; dicts keep their keys in the order
// the context gives them, which is what `tojson` prints: pass nlohmann::ordered_json to keep a
// request's order (as transformers does), nlohmann::json sorts them.
//
// Not supported (unused by known chat templates; each is a clear parse error): {% call %},
// recursive loops, {% include/import/extends %}, and Python's % / .format() string formatting.
//
// A template is untrusted input (it comes from the model file): parsing bounds nesting depth, and
// rendering bounds work, memory and output size (ChatTemplateLimits), so a hostile template
// fails with an Error instead of hanging or exhausting the stack.
//
// The template engine itself (values, parser, interpreter, builtins) is src/jinja/; this is the
// chat-template front end over it.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "jinja/limits.h"

namespace sieve::server {

// The work, memory and output one render may spend.
using ChatTemplateLimits = jinja::Limits;

// What raise_exception("...") in a template throws: the message is the template's own, meant for
// the client (the request's conversation does not fit the model's format: HTTP 400).
using ChatTemplateRaised = jinja::Raised;

class ChatTemplate {
 public:
  // Parses once; throws Error naming line:column on a syntax error.
  static ChatTemplate parse(std::string_view source);

  // context: {"messages": [...], "add_generation_prompt": bool, "bos_token": "...",
  // "eos_token": "...", ...any extra variables (tools, date_string, ...)}.
  // Throws ChatTemplateRaised for raise_exception(), Error (with line:column) for any other
  // runtime error or exceeded limit.
  std::string render(const nlohmann::json& context, const ChatTemplateLimits& limits = {}) const;
  std::string render(const nlohmann::ordered_json& context,
                     const ChatTemplateLimits& limits = {}) const;

  struct Program;  // the parsed template; opaque

 private:
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

// The fallback when a model carries no template: ChatML, with the generation prompt when asked.
std::string_view chatml_template();

}  // namespace sieve::server
