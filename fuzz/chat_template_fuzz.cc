// libFuzzer target for the chat-template renderer: arbitrary bytes as a template (the GGUF key
// tokenizer.chat_template is untrusted), parsed and rendered against a conversation that
// exercises the usual variables (system/user/assistant/tool turns, tool calls, tools, tokens).
//
// Findings are crashes, sanitizer reports, hangs and out-of-memory: every bad template must end
// in sieve::Error from parse() or render() within the limits below.
//
// Seeds: fuzz/make_chat_template_corpus.sh OUT_DIR writes real templates from the unit test.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "server/chat_template.h"

namespace {

const nlohmann::json& conversation() {
  static const nlohmann::json context = nlohmann::json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Hello"},
      {"role": "assistant", "content": " Hi! "},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "sunny"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Tighter than the server's defaults so each input stays fast; the bounds are what is tested.
  sieve::server::ChatTemplateLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_allocated_bytes = 16 << 20;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const auto tmpl = sieve::server::ChatTemplate::parse(source);
    (void)tmpl.render(conversation(), limits);
  } catch (const sieve::Error&) {
    // Expected for most inputs: a clear error is the correct outcome.
  }
  return 0;
}
