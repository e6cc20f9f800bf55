#pragma once
// The chat part of a /v1/chat/completions (or /tokenize) body: messages rendered through the
// model's chat template to prompt tokens, and the tools the model is offered.
//
//   messages ──► chat_template_context ──► + tools, chat_template_kwargs ──► render_chat
//            ──► tokenize (BOS added when the template did not write it)
//   tools, tool_choice, parallel_tool_calls ──► ToolRequest ──► apply_tool_choice:
//            how the output is read, and the grammar that forces a call
#include <string>
#include <vector>

#include "server/api_requests.h"

namespace sieve::server {

// Chat messages → the template's context, with each message's content flattened to text and
// the arguments of an assistant message's tool_calls (a JSON string in OpenAI's format) parsed
// into an object, as the templates (Llama 3.1's, Qwen's) print them with tojson.
json chat_template_context(const json& messages, bool add_generation_prompt,
                           const tok::Tokenizer& tokenizer);

// tools, tool_choice and parallel_tool_calls, validated.
struct ToolRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  std::vector<ToolFunction> functions;
  Choice choice = Choice::kAuto;
  std::string named;  // kNamed: the function
  bool parallel = true;
  // What the template gets as `tools` (the request's own objects); null: none. tool_choice
  // "none" renders no tools (vLLM's --exclude-tools-when-tool-choice-none), so the model is not
  // prompted to write calls that would come back as text.
  const json* render = nullptr;
};
ToolRequest parse_tool_request(const json& body);

// The body's messages (with `tools` rendered when not null) as the template writes them, and
// their prompt tokens.
struct ChatPrompt {
  std::string text;
  std::vector<TokenId> ids;
  tok::EncodeOptions encoding;  // how text was encoded (a BOS may be put in front after)
};
ChatPrompt parse_chat_prompt(const json& body, const ModelInfo& model, const json* tools);

// How the output of a chat request with tools is read, and for tool_choice "required" or a named
// function the grammar that forces the call(s) (request.params.constraint).
void apply_tool_choice(const ToolRequest& tools, const ModelInfo& model,
                       GenerationRequest& request);

}  // namespace sieve::server
