// Chat-template rendering: real Hugging Face templates, Jinja semantics, errors and limits.
//
// The family templates (real_chat_templates.h) are the "chat_template" values of the models'
// tokenizer_config.json, kept as the JSON string (escapes and all); each expected prompt was worked
// out by hand from the template (see the comment on each case) and cross-checked against Python's
// jinja2 3.1 with transformers' settings (trim_blocks, lstrip_blocks, loopcontrols).
#include "server/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "real_chat_templates.h"

namespace sieve::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

using namespace templates;  // k_llama31, ..., template_text (real_chat_templates.h)

std::string render(std::string_view source, const json& context,
                   const ChatTemplateLimits& limits = {}) {
  return ChatTemplate::parse(source).render(context, limits);
}

// system + user + assistant + user. The assistant turn has spaces around it to show which
// templates trim message content.
json conversation(bool with_system) {
  json messages = json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": " Hi! "},
    {"role": "user", "content": "What is 2+2?"}
  ])");
  if (!with_system) messages.erase(messages.begin());
  return messages;
}

json context(const json& messages, json bos, json eos, bool add_generation_prompt = true) {
  return {{"messages", messages},
          {"bos_token", std::move(bos)},
          {"eos_token", std::move(eos)},
          {"add_generation_prompt", add_generation_prompt}};
}

// ---------------------------------------------------------------------------------------------
// Real templates, rendered.

struct FamilyCase {
  const char* name;
  const char* template_json;
  bool with_system;  // false for models whose template rejects a system message
  json bos, eos;
  bool add_generation_prompt;
  const char* expected;
};

std::vector<FamilyCase> family_cases() {
  return {
      // The system message goes inside <<SYS>> in the first user turn; user turns get
      // bos + "[INST] " + content.strip() + " [/INST]", assistant turns " " + strip + " " + eos;
      // no generation prompt exists in this format.
      {"Llama2", k_llama2, true, "<s>", "</s>", true,
       "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHello [/INST] Hi! </s>"
       "<s>[INST] What is 2+2? [/INST]"},
      // bos before the first turn; each turn is header + "\n\n" + content|trim + <|eot_id|>;
      // then the assistant header.
      {"Llama3", k_llama3, true, "<|begin_of_text|>", "<|eot_id|>", true,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      // No tools and no date_string: the system turn gets the knowledge-cutoff lines with the
      // default date "26 Jul 2024", then the (trimmed) system message; every newline and indent
      // of the template source is eaten by {%- / {{- .
      {"Llama31", k_llama31, true, "<|begin_of_text|>", "<|eot_id|>", true,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
       "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
       "You are terse.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      // bos, then "[INST] content [/INST]" per user turn and content + eos + " " per assistant
      // turn, content untrimmed.
      {"MistralV01", k_mistral_v01, false, "<s>", "</s>", true,
       "<s>[INST] Hello [/INST] Hi! </s> [INST] What is 2+2? [/INST]"},
      // " [INST] " + system + "\n\n" + first user message; assistant turns " " + content + eos.
      {"MistralV02", k_mistral_v02, true, "<s>", "</s>", true,
       "<s> [INST] You are terse.\n\nHello [/INST]  Hi! </s> [INST] What is 2+2? [/INST]"},
      // ChatML, content untrimmed.
      {"Qwen2", k_qwen2, true, json(), "<|im_end|>", true,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
       "<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
       "<|im_start|>assistant\n"},
      // Without a system message Qwen2 inserts its default one before the first turn.
      {"Qwen2DefaultSystem", k_qwen2, false, json(), "<|im_end|>", true,
       "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
       "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n Hi! <|im_end|>\n"
       "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"},
      // Qwen2.5 without tools is ChatML like Qwen2, content untrimmed.
      {"Qwen25", k_qwen25, true, json(), "<|im_end|>", true,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
       "<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
       "<|im_start|>assistant\n"},
      // ... and its default system message names Qwen.
      {"Qwen25DefaultSystem", k_qwen25, false, json(), "<|im_end|>", true,
       "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
       "assistant.<|im_end|>\n"
       "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n Hi! <|im_end|>\n"
       "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"},
      // Qwen3: the assistant turn comes before the last user query (index 3), so it is printed
      // as is, without a think block; no default system message.
      {"Qwen3", k_qwen3, true, json(), "<|im_end|>", true,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
       "<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
       "<|im_start|>assistant\n"},
      {"Qwen3NoSystem", k_qwen3, false, json(), "<|im_end|>", true,
       "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n Hi! <|im_end|>\n"
       "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"},
      // assistant is renamed "model"; content|trim.
      {"Gemma", k_gemma, false, "<bos>", "<eos>", true,
       "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n"
       "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"},
      {"Phi3", k_phi3, true, "<s>", "<|endoftext|>", true,
       "<|system|>\nYou are terse.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n Hi! <|end|>\n"
       "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"},
      // Without the generation prompt Phi-3 ends with eos.
      {"Phi3NoGenerationPrompt", k_phi3, true, "<s>", "<|endoftext|>", false,
       "<|system|>\nYou are terse.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n Hi! <|end|>\n"
       "<|user|>\nWhat is 2+2?<|end|>\n<|endoftext|>"},
      // Every tag sits on its own line: trim_blocks eats the newline after each {% %}, but the
      // newline after each {{ }} stays, so every turn ends in eos + "\n".
      {"Zephyr", k_zephyr, true, "<s>", "</s>", true,
       "<|system|>\nYou are terse.</s>\n<|user|>\nHello</s>\n<|assistant|>\n Hi! </s>\n"
       "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n"},
  };
}

class FamilyTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(FamilyTest, RendersConversation) {
  const FamilyCase& c = GetParam();
  const auto tmpl = ChatTemplate::parse(template_text(c.template_json));
  EXPECT_EQ(
      tmpl.render(context(conversation(c.with_system), c.bos, c.eos, c.add_generation_prompt)),
      c.expected);
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, FamilyTest, ::testing::ValuesIn(family_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Llama 3.1 with a tool: the tool list goes into the first user turn as tojson(indent=4) (keys in
// the sorted order nlohmann::json keeps), a tool call renders as {"name": ..., "parameters": ...},
// and a tool result goes in an ipython turn; its string content `is iterable`, so it is printed
// through tojson, quotes included (what Jinja does too).
TEST(ChatTemplate, Llama31ToolCalling) {
  json ctx = context(json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"}
  ])"),
                     "<|begin_of_text|>", "<|eot_id|>");
  ctx["tools"] = json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Get the weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}])");
  const std::string expected =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Environment: ipython\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
      "You are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\n"
      "Given the following functions, please respond with a JSON for a function call with its "
      "proper arguments that best answers the given prompt.\n\n"
      "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
      "name and its value}.Do not use variables.\n\n"
      "{\n"
      "    \"function\": {\n"
      "        \"description\": \"Get the weather\",\n"
      "        \"name\": \"get_weather\",\n"
      "        \"parameters\": {\n"
      "            \"properties\": {\n"
      "                \"city\": {\n"
      "                    \"type\": \"string\"\n"
      "                }\n"
      "            },\n"
      "            \"required\": [\n"
      "                \"city\"\n"
      "            ],\n"
      "            \"type\": \"object\"\n"
      "        }\n"
      "    },\n"
      "    \"type\": \"function\"\n"
      "}\n\n"
      "Weather in Paris?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n"
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
      "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(render(template_text(k_llama31), ctx), expected);
}

// The tool definition every tool-calling case below offers, in the order a client sends it.
nlohmann::ordered_json weather_tool() {
  return nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Get the weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}])");
}

// Qwen2.5 and Qwen3 both print the same tools section in the system turn: the system message
// (Qwen2.5: its default one when there is none) + "\n\n# Tools..." + one tojson line per tool
// (compact, keys in the request's order) + the <tool_call> format instructions.
std::string qwen_tools_system(const std::string& system_prefix) {
  return "<|im_start|>system\n" + system_prefix +
         "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
         "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
         "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
         "\"Get the "
         "weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
         "\"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\n"
         "For each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
         "\"arguments\": "
         "<args-json-object>}\n</tool_call><|im_end|>\n";
}

// Qwen2.5 with a tool: an assistant turn with tool_calls and empty content prints no newline
// for the content, then "\n<tool_call>\n" + {"name": ..., "arguments": tojson} + "\n</tool_call>";
// a tool result becomes a user turn wrapping it in <tool_response>.
TEST(ChatTemplate, Qwen25ToolCalling) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({"messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"}
  ], "add_generation_prompt": true})");
  ctx["tools"] = weather_tool();
  const std::string expected =
      qwen_tools_system("You are terse.\n\n") +
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(ChatTemplate::parse(template_text(k_qwen25)).render(ctx), expected);
  // Without a system message the tools section follows Qwen2.5's default one.
  ctx["messages"].erase(ctx["messages"].begin());
  EXPECT_EQ(ChatTemplate::parse(template_text(k_qwen25)).render(ctx),
            qwen_tools_system(
                "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n") +
                expected.substr(qwen_tools_system("You are terse.\n\n").size()));
}

// Qwen3 with a tool, after the last real user query (index 0; tool results do not count): the
// assistant turn that calls the tool keeps its reasoning (split out of content at </think>)
// in a think block; its arguments are a string, printed as is; two consecutive tool results
// share one user turn; the last assistant turn gets an empty think block.
TEST(ChatTemplate, Qwen3ToolCallingWithThinking) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({"messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "<think>\nNeed the weather.\n</think>\n\n", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": "22 C"},
    {"role": "assistant", "content": "It is sunny."}
  ], "add_generation_prompt": false})");
  ctx["tools"] = weather_tool();
  EXPECT_EQ(ChatTemplate::parse(template_text(k_qwen3)).render(ctx),
            qwen_tools_system("") +
                "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                "<|im_start|>assistant\n<think>\nNeed the weather.\n</think>\n\n<tool_call>\n"
                "{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                "\"Paris\"}}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
                "<tool_response>\n22 C\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\nIt is sunny.<|im_end|>\n");
}

// Qwen3 with the tool call of Qwen2.5's test (a system message, arguments as an object, empty
// content): same turns as Qwen2.5 apart from the system text.
TEST(ChatTemplate, Qwen3ToolCallMatchesQwen25Format) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({"messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"}
  ], "add_generation_prompt": true})");
  ctx["tools"] = weather_tool();
  EXPECT_EQ(ChatTemplate::parse(template_text(k_qwen3)).render(ctx),
            ChatTemplate::parse(template_text(k_qwen25)).render(ctx));
}

// Qwen3 reasoning in history: the think block of a turn before the last user query is dropped
// (only the text after </think>, left-stripped of newlines, stays); the last turn keeps it,
// newlines around the reasoning normalised to one.
TEST(ChatTemplate, Qwen3ThinkingHistory) {
  json ctx = context(json::parse(R"([
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>\n\nAdd again.\n\n</think>\n\n6"}
  ])"),
                     json(), "<|im_end|>", false);
  EXPECT_EQ(render(template_text(k_qwen3), ctx),
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nAdd again.\n</think>\n\n6<|im_end|>\n");
}

// reasoning_content given separately is used instead of parsing content (and dropped here, as
// the turn precedes the last query); enable_thinking=false makes the generation prompt an empty
// think block, which tells the model to answer without reasoning.
TEST(ChatTemplate, Qwen3ReasoningContentAndThinkingSwitch) {
  json ctx = context(json::parse(R"([
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
    {"role": "user", "content": "And 3+3?"}
  ])"),
                     json(), "<|im_end|>", true);
  const std::string turns =
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
      "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(render(template_text(k_qwen3), ctx), turns);
  ctx["enable_thinking"] = true;
  EXPECT_EQ(render(template_text(k_qwen3), ctx), turns);
  ctx["enable_thinking"] = false;
  EXPECT_EQ(render(template_text(k_qwen3), ctx), turns + "<think>\n\n</think>\n\n");
  // A user turn that is only a <tool_response> does not count as the last query: the
  // assistant turn before it then keeps its reasoning.
  ctx["messages"][2]["content"] = "<tool_response>\n8\n</tool_response>";
  ctx["messages"][1]["content"] = "<think>\nAdd them.\n</think>\n\n4";
  ctx["messages"][1].erase("reasoning_content");
  EXPECT_THAT(render(template_text(k_qwen3), ctx),
              HasSubstr("<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n"));
}

// With nlohmann::ordered_json the context's key order survives into tojson, as in transformers;
// nlohmann::json sorts keys.
TEST(ChatTemplate, TojsonKeyOrder) {
  const auto tmpl = ChatTemplate::parse("{{ tools[0] | tojson }}");
  const char* tools = R"({"tools": [{"type": "function", "function": {"name": "f"}}]})";
  EXPECT_EQ(tmpl.render(nlohmann::ordered_json::parse(tools)),
            R"({"type": "function", "function": {"name": "f"}})");
  EXPECT_EQ(tmpl.render(json::parse(tools)), R"({"function": {"name": "f"}, "type": "function"})");
}

// date_string given by the caller replaces the default.
TEST(ChatTemplate, Llama31DateString) {
  json ctx = context(conversation(false), "<|begin_of_text|>", "<|eot_id|>");
  ctx["date_string"] = "01 Jan 2025";
  EXPECT_THAT(render(template_text(k_llama31), ctx),
              HasSubstr("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                        "December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"));
}

TEST(ChatTemplate, ChatmlFallback) {
  const auto tmpl = ChatTemplate::parse(chatml_template());
  const std::string turns =
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n";
  EXPECT_EQ(tmpl.render(context(conversation(true), json(), json(), true)),
            turns + "<|im_start|>assistant\n");
  EXPECT_EQ(tmpl.render(context(conversation(true), json(), json(), false)), turns);
  // With the real ChatML template, the fallback matches a model that ships ChatML.
  EXPECT_EQ(tmpl.render(context(conversation(true), json(), json(), true)),
            render(template_text(k_qwen2), context(conversation(true), json(), "<|im_end|>")));
}

// ---------------------------------------------------------------------------------------------
// raise_exception: the template's own message, as ChatTemplateRaised.

struct RaiseCase {
  const char* name;
  const char* template_json;
  const char* messages;
  const char* message;
};

TEST(ChatTemplate, RaiseException) {
  const RaiseCase cases[] = {
      {"gemma rejects system", k_gemma,
       R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])",
       "System role not supported"},
      {"mistral v0.1: a system message breaks the alternation", k_mistral_v01,
       R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])",
       "Conversation roles must alternate user/assistant/user/assistant/..."},
      {"mistral v0.1: unknown role", k_mistral_v01,
       R"([{"role": "user", "content": "u"}, {"role": "tool", "content": "t"}])",
       "Only user and assistant roles are supported!"},
      {"mistral v0.2: two user turns", k_mistral_v02,
       R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
           {"role": "user", "content": "u"}])",
       "After the optional system message, conversation roles must alternate "
       "user/assistant/user/assistant/..."},
      {"llama 2: assistant first", k_llama2, R"([{"role": "assistant", "content": "a"}])",
       "Conversation roles must alternate user/assistant/user/assistant/..."},
      {"gemma: two user turns", k_gemma,
       R"([{"role": "user", "content": "u"}, {"role": "user", "content": "u"}])",
       "Conversation roles must alternate user/assistant/user/assistant/..."},
      {"llama 3.1: two tool calls", k_llama31,
       R"([{"role": "user", "content": "u"}, {"role": "assistant", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}},
            {"function": {"name": "b", "arguments": {}}}]}])",
       "This model only supports single tool-calls at once!"},
  };
  for (const RaiseCase& c : cases) {
    SCOPED_TRACE(c.name);
    const auto tmpl = ChatTemplate::parse(template_text(c.template_json));
    try {
      tmpl.render(context(json::parse(c.messages), "<s>", "</s>"));
      ADD_FAILURE() << "no exception";
    } catch (const ChatTemplateRaised& e) {
      EXPECT_EQ(std::string(e.what()), c.message);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Jinja semantics, one feature per row.

struct RenderCase {
  const char* source;
  const char* context;  // JSON object
  const char* expected;
};

void expect_renders(const std::vector<RenderCase>& cases) {
  for (const RenderCase& c : cases) {
    SCOPED_TRACE(c.source);
    try {
      EXPECT_EQ(render(c.source, json::parse(c.context)), c.expected);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

TEST(ChatTemplate, WhitespaceControl) {
  expect_renders({
      // '-' strips all whitespace, newlines included, on its side.
      {"a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc"},
      {"a \n {{- 'b' -}} \n c", "{}", "abc"},
      {"a {#- comment -#} b", "{}", "ab"},
      // trim_blocks: the newline right after a block tag goes, after {{ }} it stays.
      {"{% if true %}\nx\n{% endif %}\ny", "{}", "x\ny"},
      {"{{ 'x' }}\ny", "{}", "x\ny"},
      // lstrip_blocks: indentation before a block tag goes, before {{ }} it stays.
      {"  {% if true %}\n  x\n  {% endif %}\n", "{}", "  x\n"},
      {"  {{ 'v' }}|", "{}", "  v|"},
      {"x\n  {# comment #}\ny", "{}", "x\ny"},
      // ... unless the tag is on a line with other text.
      {"a  {% if true %}b{% endif %}", "{}", "a  b"},
      // '+' turns lstrip_blocks / trim_blocks off for that side.
      {"  {%+ if true %}x{% endif %}", "{}", "  x"},
      {"{% if true +%}\nx{% endif %}", "{}", "\nx"},
      // One trailing newline of the template is dropped (keep_trailing_newline=False).
      {"a\n", "{}", "a"},
      {"a\n\n", "{}", "a\n"},
      {"a\r\nb", "{}", "a\nb"},
      {"{% raw %}{{ x }}{% if %}{% endraw %}", "{}", "{{ x }}{% if %}"},
  });
}

TEST(ChatTemplate, Expressions) {
  expect_renders({
      {"{{ 'a\\tb\\u00e9\\x41\\'' }}|{{ \"q\\\"\" }}|{{ 'a' 'b' }}", "{}", "a\tbéA'|q\"|ab"},
      {"{{ 1 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 2.5e3 }} {{ -3 }}", "{}",
       "1 1.0 0.30000000000000004 2500.0 -3"},
      {"{{ true }} {{ False }} {{ none }} {{ None }} [{{ nothing }}]", "{}",
       "True False None None []"},
      {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 * 3 + 1 "
       "}}",
       "{}", "3 -4 1 2 3.5 1024 7"},
      {"{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1, 2] + [3] }} {{ 'a' + 'b' }}", "{}",
       "ababab [1, 1] [1, 2, 3] ab"},
      {"{{ 1 ~ 'a' ~ none ~ true ~ nothing }}", "{}", "1aNoneTrue"},
      {"{{ [1, 'two', none, [true]] }} {{ {'k': 'v', 'n': 1} }}", "{}",
       "[1, 'two', None, [True]] {'k': 'v', 'n': 1}"},
      {"{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ true == 1 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }}", "{}",
       "True False True True True"},
      {"{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }}", "{}",
       "True True True True"},
      {"{{ not true or false and true }} {{ 0 or 'x' }} {{ 'y' and 0 }}", "{}", "False x 0"},
      {"{{ 'yes' if x else 'no' }} {{ 'yes' if not x else 'no' }} [{{ 'a' if false }}]", "{}",
       "no yes []"},
      // Python truthiness.
      {"{% if [] %}a{% elif {} %}b{% elif '' %}c{% elif 0 %}d{% elif 0.0 %}e{% else %}f{% endif %}",
       "{}", "f"},
      // Attribute and item access are interchangeable; missing keys are undefined.
      {"{{ m.role }}{{ m['role'] }}{{ m.missing }}{{ m['missing'] is defined }}",
       R"({"m": {"role": "user"}})", "useruserFalse"},
      {"{{ xs[0] }}{{ xs[-1] }}{{ xs.1 }}{{ xs[5] is undefined }}{{ xs[nothing] is defined }}",
       R"({"xs": [1, 2, 3]})", "132TrueFalse"},
      {"{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'abc'[1:] }} {{ 'héllo'[::-1] "
       "}}",
       R"({"xs": [1, 2, 3]})", "[2, 3] [1, 2] [3, 2, 1] [1, 3] bc olléh"},
      {"{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is not none }} "
       "{{ 'a' is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} "
       "{{ {} is mapping }} {{ 'a' is iterable }} {{ [] is sequence }} {{ 3 is odd }} "
       "{{ 4 is even }} {{ 6 is divisibleby 3 }} {{ 'a' is equalto 'a' }} {{ true is true }} "
       "{{ 'x' is in 'xyz' }}",
       "{}",
       "False True True True True True True True True True True True True True True True True"},
  });
}

TEST(ChatTemplate, Filters) {
  expect_renders({
      {"{{ '  x  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}", "{}",
       "x|a|AB|ab"},
      {"{{ [1, 2, 3] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} {{ x | length }}",
       "{}", "3 5 1 0"},
      {"{{ [1, 2] | first }} {{ [1, 2] | last }} {{ 'abc' | first }}", "{}", "1 2 a"},
      {"{{ x | default('d') }} {{ '' | default('d') }} {{ '' | d('d', true) }}", "{}", "d  d"},
      {"{{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }}", "{}", "a, b 12"},
      {"{{ 'aXbX' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 2) }}", "{}", "a-b- bba"},
      {"{{ 'hello big-world' | title }} {{ 'hELLO' | capitalize }} {{ 'x' | safe }}", "{}",
       "Hello Big-World Hello x"},
      {"{{ '12' | int + 1 }} {{ '3.7' | int }} {{ 'z' | int }} {{ 2.9 | int }} {{ '1.5' | float }}",
       "{}", "13 3 0 2 1.5"},
      {"{{ 'ab' | list }} {{ {'a': 1, 'b': 2} | items | list }} {{ 5 | string ~ 'x' }}", "{}",
       "['a', 'b'] [('a', 1), ('b', 2)] 5x"},
      {"{{ (1, 'a') }} {{ (1,) }} {{ () }} {{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }}", "{}",
       "(1, 'a') (1,) () False True"},
      {"{{ [1, 2, 3] | reverse | list }} {{ -3 | abs }} {{ 'a<b' | e }}", "{}",
       "[3, 2, 1] 3 a&lt;b"},
      {"{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}", "{}",
       "a\n  b\n\n  c|  a\n  b"},
      {"{{ {'a': [1, 2.5, none, true], 'b': 'x\"y\\n'} | tojson }}", "{}",
       "{\"a\": [1, 2.5, null, true], \"b\": \"x\\\"y\\n\"}"},
      {"{{ [1, {'k': 'v'}, []] | tojson(indent=2) }}", "{}",
       "[\n  1,\n  {\n    \"k\": \"v\"\n  },\n  []\n]"},
      {"{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true, separators=[',', ':']) }}", "{}",
       "{\"a\":\"é\",\"b\":1}"},
      {"{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') }}",
       R"({"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "c"}]})",
       "a|c"},
      {"{{ ms | rejectattr('tool') | map(attribute='role') | list }} "
       "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('odd') | list }} "
       "{{ ['a', 'b'] | map('upper') | join }}",
       R"({"ms": [{"role": "a", "tool": true}, {"role": "b"}]})", "['b'] [1, 3] [2] AB"},
      {"{% filter upper %}shout {{ 'this' }}{% endfilter %}", "{}", "SHOUT THIS"},
      {"{{ ['b', 'A', 'a', 'B'] | unique | list }} {{ ['b', 'A', 'c'] | sort }} "
       "{{ [3, 1, 2] | sort(reverse=true) }} {{ {'b': 1, 'a': 2} | dictsort }} "
       "{{ [2, 3, 1] | max }} {{ ['b', 'A'] | min }} {{ [1, 2, 3] | sum }}",
       "{}", "['b', 'A'] ['A', 'b', 'c'] [3, 2, 1] [('a', 2), ('b', 1)] 3 A 6"},
      {"{{ ms | sort(attribute='n') | map(attribute='n') | list }} {{ ms | sum(attribute='n') }}",
       R"({"ms": [{"n": 2}, {"n": 1}]})", "[1, 2] 3"},
  });
}

TEST(ChatTemplate, Methods) {
  expect_renders({
      {"{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}", "{}",
       "a b|axx|xxa"},
      {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}", "{}",
       "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c']"},
      {"{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.endswith('b') }}",
       "{}", "True True False"},
      {"{{ 'Ab'.upper() }}{{ 'Ab'.lower() }} {{ 'hello world'.title() }} {{ 'aBC'.capitalize() }}",
       "{}", "ABab Hello World Abc"},
      {"{{ 'a-b'.replace('-', '+') }} {{ 'abc'.find('c') }} {{ ', '.join(['x', 'y']) }}", "{}",
       "a+b 2 x, y"},
      {"{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 2) }} {{ d.keys() | list }} "
       "{{ d.values() | list }} {{ d.items() | list }}",
       R"({"d": {"a": 1}})", "1 None 2 ['a'] [1] [('a', 1)]"},
      {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"a": 1, "b": 2}})",
       "a=1;b=2;"},
  });
}

TEST(ChatTemplate, Statements) {
  expect_renders({
      {"{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
       "{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}",
       "{}", "10TrueFalse33;21FalseFalse32;32FalseTrue31;"},
      {"{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }},{% endfor %}", "{}",
       "2/2,4/2,"},
      {"{% for x in [] %}x{% else %}empty{% endfor %}", "{}", "empty"},
      {"{% for x in nothing %}x{% endfor %}|", "{}", "|"},
      {"{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
       "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
       "{}", "013"},
      {"{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }}", "{}",
       "[0, 1, 2] [1, 3, 5] [3, 2, 1]"},
      {"{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", "{}", "37"},
      {"{% for x in 'ab' %}{{ x }}.{% endfor %}{% for k in {'p': 1, 'q': 2} %}{{ k }}{% endfor %}",
       "{}", "a.b.pq"},
      {"{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }}"
       "{% endfor %}",
       "{}", "121122"},
      // A set inside a loop stays in the loop; a namespace carries state out.
      {"{% set ns = namespace(found=false, n=0) %}{% set y = 1 %}{% for x in [1, 2] %}"
       "{% set y = y + x %}{% set ns.n = ns.n + x %}{% if x == 2 %}{% set ns.found = true %}"
       "{% endif %}{% endfor %}{{ y }} {{ ns.found }} {{ ns.n }}",
       "{}", "1 True 3"},
      // A top-level set shadows the context.
      {"{% set messages = messages[1:] %}{{ messages | length }}", R"({"messages": [1, 2, 3]})",
       "2"},
      {"{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{}", "12"},
      {"{% set x %}a{{ 1 }}b{% endset %}[{{ x }}]", "{}", "[a1b]"},
      {"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
       "{% endif %}{{ add_generation_prompt }}",
       "{}", "False"},
      {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
       "{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }}",
       "{}", "Hi A! Hi B? Hi C!"},
      {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
       "{}", "321"},
      {"{% generation %}kept{% endgeneration %}", "{}", "kept"},
      {"{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "{}", "aba"},
  });
}

// strftime_now is wall-clock dependent; only its shape is checked.
TEST(ChatTemplate, StrftimeNow) {
  const std::string year = render("{{ strftime_now('%Y') }}", json::object());
  ASSERT_EQ(year.size(), 4u);
  EXPECT_TRUE(std::all_of(year.begin(), year.end(), [](char c) { return c >= '0' && c <= '9'; }));
  EXPECT_EQ(render("{{ strftime_now is defined }}", json::object()), "True");
}

// ---------------------------------------------------------------------------------------------
// Errors: syntax errors name line:column; runtime errors say what was wrong.

struct ErrorCase {
  const char* source;
  const char* message;  // expected to appear in the error
};

void expect_errors(const std::vector<ErrorCase>& cases, const ChatTemplateLimits& limits = {}) {
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.source);
    try {
      const std::string out = render(c.source, json::object(), limits);
      ADD_FAILURE() << "rendered without an error: " << out.substr(0, 200);
    } catch (const ChatTemplateRaised& e) {
      ADD_FAILURE() << "raised: " << e.what();
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr(c.message));
    }
  }
}

TEST(ChatTemplate, SyntaxErrorsNamePosition) {
  expect_errors({
      {"{% if x %}abc", "chat template 1:14: unexpected end of template, expected 'endif'"},
      {"{% for x in y %}", "chat template 1:17: unexpected end of template, expected 'endfor'"},
      {"{{ 1 + }}", "chat template 1:8: expected an expression, got '}}'"},
      {"line one\n  {{ foo(1, }}", "chat template 2:13: unexpected '}'"},
      {"{{ [1, 2) }}", "chat template 1:9: unexpected ')'"},
      {"{{ 'abc }}", "chat template 1:4: unterminated string literal"},
      {"ok\n{% frobnicate %}", "chat template 2:4: unknown statement 'frobnicate'"},
      {"{% endif %}", "chat template 1:4: unknown statement 'endif'"},
      {"{{ x | nosuchfilter }}", "chat template 1:8: unknown filter 'nosuchfilter'"},
      {"{{ x is nosuchtest }}", "chat template 1:9: unknown test 'nosuchtest'"},
      {"a {# never closed", "chat template 1:3: unterminated comment"},
      {"{{ x", "chat template 1:1: unclosed '{{'"},
      {"{% break %}", "chat template 1:4: 'break' outside a loop"},
      {"{{ a ; b }}", "chat template 1:6: unexpected character ';'"},
      {"{% set x = 1 %}{% set %}", "chat template 1:23: expected a name, got '%}'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
  });
}

TEST(ChatTemplate, RuntimeErrors) {
  expect_errors({
      {"{{ x + 1 }}", "chat template 1:6: 'x' is undefined"},
      {"{{ x.y }}", "'x' is undefined"},
      {"{{ {'a': 1}.b.c }}", "'dict' object has no attribute 'b'"},
      {"{{ 'a' + 1 }}", "unsupported operand type(s) for +: 'str' and 'int'"},
      {"{{ 1 / 0 }}", "division by zero"},
      {"{{ 1 < 'a' }}", "'<' not supported between instances of 'int' and 'str'"},
      {"{{ 'a'.nosuchmethod() }}", "'str' object has no attribute 'nosuchmethod'"},
      {"{{ 5() }}", "'int' object is not callable"},
      {"{% for x in 5 %}{% endfor %}", "'int' object is not iterable"},
      {"{% set x = 1 %}{% set x.y = 2 %}", "not a namespace"},
      {"{{ x | tojson }}", "'x' is undefined"},
  });
}

// ---------------------------------------------------------------------------------------------
// Hostile templates stop at a limit with an error instead of hanging or crashing.

TEST(ChatTemplate, Limits) {
  ChatTemplateLimits small;
  small.max_steps = 10'000;
  small.max_output_bytes = 1'000;
  small.max_allocated_bytes = 1 << 20;
  small.max_call_depth = 8;
  expect_errors(
      {
          {"{% for i in range(100) %}0123456789abcdef{% endfor %}", "output exceeds the limit"},
          {"{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
           "{% set ns.s = ns.s + ns.s %}{% endfor %}",
           "limit of 1048576 bytes"},
          {"{{ 'a' * 1000000000000 }}", "limit of 1048576 bytes"},
          {"{{ [1, 2] * 1000000000000 }}", "limit of 1048576 bytes"},
          {"{{ range(10 ** 12) }}", "over the limit"},
          {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest deeper than 8"},
      },
      small);
  // Values nest boundedly (printing and freeing them recurses), and namespaces stay out of
  // containers, so no value can contain itself.
  expect_errors({
      {"{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
       "{% endfor %}",
       "values nest deeper than 512"},
      {"{% set ns = namespace() %}{% set ns.me = [ns] %}", "a namespace cannot be put in a list"},
      {"{% set ns = namespace() %}{% set ns.me = ns %}",
       "a namespace cannot be put in a namespace"},
      {"{% set ns = namespace() %}{{ namespace(x=ns) }}",
       "a namespace cannot be put in a namespace"},
      {"{% set ns = namespace() %}{{ {'k': ns} }}", "a namespace cannot be put in a list or dict"},
  });
  json deep = "leaf";
  for (int i = 0; i < 1000; ++i) deep = json::array({std::move(deep)});
  try {
    render("{{ messages }}", {{"messages", deep}});
    ADD_FAILURE() << "rendered";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("context nests deeper than 128 levels"));
  }
  ChatTemplateLimits few_steps;
  few_steps.max_steps = 10'000;
  expect_errors({{"{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                  "limit of 10000 steps"},
                 {"{% for i in range(5000) %}{{ i }}{% endfor %}", "limit of 10000 steps"}},
                few_steps);
  // Nesting bounds hold at parse time, before anything runs.
  const std::string parens = "{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}";
  std::string chain = "{{ 1";
  for (int i = 0; i < 10'000; ++i) chain += " + 1";
  chain += " }}";
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  std::string nots = "{{ " + std::string(1000 * 4, ' ') + " }}";
  for (int i = 0; i < 1000; ++i) nots.replace(3 + 4 * i, 4, "not ");
  std::string negs = "{{ " + std::string(1000, '-') + "1 }}";
  std::string lists = "{{ " + std::string(1000, '[') + std::string(1000, ']') + " }}";
  for (const std::string& source : {parens, chain, ifs, nots, negs, lists}) {
    SCOPED_TRACE(source.substr(0, 40));
    try {
      ChatTemplate::parse(source);
      ADD_FAILURE() << "parsed";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr("too deeply"));
    }
  }
}

// Parsed once, rendered many times with different contexts.
TEST(ChatTemplate, RendersRepeatedly) {
  const auto tmpl = ChatTemplate::parse(template_text(k_llama3));
  const std::string first = tmpl.render(context(conversation(true), "<s>", "</s>"));
  const std::string second = tmpl.render(context(conversation(false), "<s>", "</s>"));
  EXPECT_EQ(tmpl.render(context(conversation(true), "<s>", "</s>")), first);
  EXPECT_NE(first, second);
  EXPECT_EQ(first.rfind("<s>", 0), 0u);
}

}  // namespace
}  // namespace sieve::server

namespace sieve::server {
namespace {

// A conversation continues from its parked KV (engine/engine_config.h, max_parked_share) only if
// the next turn's prompt starts with the last one's prompt + the reply as the model wrote it +
// its end-of-turn token. Per template: how much of that the next render keeps. Llama 3.1,
// Qwen2.5, Qwen3 without reasoning and Mistral v0.1 re-render the previous turn byte for byte (a
// full hit); Qwen3 drops the think block of a turn that precedes the last user message and
// Mistral v0.2 writes " " before the reply, so there the hit ends where the reply began (the
// earlier prompt only).
struct ContinuationCase {
  const char* name;
  const char* template_json;
  json bos;
  const char* end_of_turn;  // what the model generates to end its reply
  const char* reply;        // the reply's text as generated
  // Where the next render first differs from prompt + reply + end_of_turn: "full" (it does
  // not), or "reply" (inside the reply).
  const char* hit;
};

class TemplateContinuation : public ::testing::TestWithParam<ContinuationCase> {};

TEST_P(TemplateContinuation, NextTurnStartsWithTheLastPromptAndReply) {
  const ContinuationCase& c = GetParam();
  const auto tmpl = ChatTemplate::parse(template_text(c.template_json));
  json messages = json::parse(R"([{"role": "user", "content": "Hello, who are you?"}])");
  const std::string prompt1 = tmpl.render(context(messages, c.bos, c.end_of_turn));
  messages.push_back({{"role", "assistant"}, {"content", c.reply}});
  messages.push_back({{"role", "user"}, {"content", "Tell me more."}});
  const std::string prompt2 = tmpl.render(context(messages, c.bos, c.end_of_turn));
  const std::string held = prompt1 + c.reply + c.end_of_turn;
  const size_t common = static_cast<size_t>(
      std::mismatch(held.begin(), held.end(), prompt2.begin(), prompt2.end()).first - held.begin());
  if (std::string(c.hit) == "full") {
    EXPECT_EQ(common, held.size()) << "next render:\n" << prompt2;
  } else {  // the earlier prompt is kept, the reply is not
    EXPECT_GE(common, prompt1.size()) << "next render:\n" << prompt2;
    EXPECT_LT(common, prompt1.size() + std::string(c.reply).size()) << "next render:\n" << prompt2;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RealTemplates, TemplateContinuation,
    ::testing::Values(
        ContinuationCase{"Llama31", k_llama31, "<|begin_of_text|>", "<|eot_id|>",
                         "I am an assistant.", "full"},
        ContinuationCase{"Llama3", k_llama3, "<|begin_of_text|>", "<|eot_id|>",
                         "I am an assistant.", "full"},
        ContinuationCase{"Qwen25", k_qwen25, json(), "<|im_end|>", "I am Qwen.", "full"},
        ContinuationCase{"Qwen3", k_qwen3, json(), "<|im_end|>", "I am Qwen.", "full"},
        ContinuationCase{"Qwen3Thinking", k_qwen3, json(), "<|im_end|>",
                         "<think>\nA greeting.\n</think>\n\nI am Qwen.", "reply"},
        // SentencePiece models write the reply's first word with its space ("▁I").
        ContinuationCase{"MistralV01", k_mistral_v01, "<s>", "</s>", " I am Mistral.", "full"},
        // v0.2 puts " " before the reply itself: the space the model wrote is doubled.
        ContinuationCase{"MistralV02", k_mistral_v02, "<s>", "</s>", " I am Mistral.", "reply"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sieve::server
