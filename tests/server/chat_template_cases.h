#pragma once
// The real-template renderings the chat-template tests expect: a real model's chat_template
// (real_chat_templates.h), a context, and the prompt it renders to (or the message of the
// template's raise_exception). Each expectation was worked out by hand from the template (see the
// comment on each case); chat_template_test checks sieve's renderer against them and
// chat_template_reference_test checks them against @huggingface/jinja, the Jinja of Hugging
// Face's JavaScript libraries (npm), so no expectation rests on hand work alone.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "real_chat_templates.h"

namespace sieve::server::templates {

struct TemplateCase {
  std::string name;
  std::string source;              // the template text
  nlohmann::ordered_json context;  // keys in the order a client sends them, as the server keeps
  std::string expected;            // the rendering, or the raised message when `raises`
  bool raises = false;
};

// system + user + assistant + user. The assistant turn has spaces around it to show which
// templates trim message content.
inline nlohmann::ordered_json conversation(bool with_system) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": " Hi! "},
    {"role": "user", "content": "What is 2+2?"}
  ])");
  if (!with_system) messages.erase(messages.begin());
  return messages;
}

inline nlohmann::ordered_json context(const nlohmann::ordered_json& messages,
                                      nlohmann::ordered_json bos, nlohmann::ordered_json eos,
                                      bool add_generation_prompt = true) {
  nlohmann::ordered_json c = nlohmann::ordered_json::object();
  c["messages"] = messages;
  if (!bos.is_null()) c["bos_token"] = std::move(bos);
  if (!eos.is_null()) c["eos_token"] = std::move(eos);
  c["add_generation_prompt"] = add_generation_prompt;
  return c;
}

// The same conversation through every family's template.
struct FamilyCase {
  const char* name;
  const char* template_json;
  bool with_system;  // false for models whose template rejects a system message
  nlohmann::ordered_json bos, eos;
  bool add_generation_prompt;
  const char* expected;
};

inline std::vector<FamilyCase> family_cases() {
  using json = nlohmann::ordered_json;
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

// The tool definition every tool-calling case offers, in the order a client sends it.
inline nlohmann::ordered_json weather_tool() {
  return nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Get the weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}])");
}

// Qwen2.5 and Qwen3 both print the same tools section in the system turn: the system message
// (Qwen2.5: its default one when there is none) + "\n\n# Tools..." + one tojson line per tool
// (compact, keys in the request's order) + the <tool_call> format instructions.
inline std::string qwen_tools_system(const std::string& system_prefix) {
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

// Every case: the family conversations, then tools, reasoning and raise_exception.
inline std::vector<TemplateCase> real_template_cases() {
  using json = nlohmann::ordered_json;
  std::vector<TemplateCase> cases;
  for (const FamilyCase& c : family_cases()) {
    cases.push_back({c.name, template_text(c.template_json),
                     context(conversation(c.with_system), c.bos, c.eos, c.add_generation_prompt),
                     c.expected});
  }

  // Llama 3.1 with a tool: the tool list goes into the first user turn as tojson(indent=4), keys
  // in the request's order; a tool call renders as {"name": ..., "parameters": ...}, and a tool
  // result goes in an ipython turn; its string content `is iterable`, so it is printed through
  // tojson, quotes included.
  {
    json ctx = context(json::parse(R"([
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "sunny"}
    ])"),
                       "<|begin_of_text|>", "<|eot_id|>");
    ctx["tools"] = weather_tool();
    cases.push_back({"Llama31ToolCalling", template_text(k_llama31), ctx,
                     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                     "Environment: ipython\n"
                     "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                     "You are terse.<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\n"
                     "Given the following functions, please respond with a JSON for a function "
                     "call with its proper arguments that best answers the given prompt.\n\n"
                     "Respond in the format {\"name\": function name, \"parameters\": dictionary "
                     "of argument name and its value}.Do not use variables.\n\n"
                     "{\n"
                     "    \"type\": \"function\",\n"
                     "    \"function\": {\n"
                     "        \"name\": \"get_weather\",\n"
                     "        \"description\": \"Get the weather\",\n"
                     "        \"parameters\": {\n"
                     "            \"type\": \"object\",\n"
                     "            \"properties\": {\n"
                     "                \"city\": {\n"
                     "                    \"type\": \"string\"\n"
                     "                }\n"
                     "            },\n"
                     "            \"required\": [\n"
                     "                \"city\"\n"
                     "            ]\n"
                     "        }\n"
                     "    }\n"
                     "}\n\n"
                     "Weather in Paris?<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n"
                     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
                     "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n"});
  }

  // Qwen2.5 with a tool: an assistant turn with tool_calls and empty content prints no newline
  // for the content, then "\n<tool_call>\n" + {"name": ..., "arguments": tojson} +
  // "\n</tool_call>"; a tool result becomes a user turn wrapping it in <tool_response>.
  const std::string qwen_tool_turns =
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  {
    json ctx = json::parse(R"({"messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "sunny"}
    ], "add_generation_prompt": true})");
    ctx["tools"] = weather_tool();
    cases.push_back({"Qwen25ToolCalling", template_text(k_qwen25), ctx,
                     qwen_tools_system("You are terse.\n\n") + qwen_tool_turns});
    // Qwen3, same request: the same turns (its tools section has no default system message).
    cases.push_back({"Qwen3ToolCallMatchesQwen25Format", template_text(k_qwen3), ctx,
                     qwen_tools_system("You are terse.\n\n") + qwen_tool_turns});
    // Without a system message the tools section follows Qwen2.5's default one.
    ctx["messages"].erase(ctx["messages"].begin());
    cases.push_back(
        {"Qwen25ToolCallingDefaultSystem", template_text(k_qwen25), ctx,
         qwen_tools_system(
             "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n") +
             qwen_tool_turns});
  }

  // Qwen3 with a tool, after the last real user query (index 0; tool results do not count): the
  // assistant turn that calls the tool keeps its reasoning (split out of content at </think>)
  // in a think block; its arguments are a string, printed as is; two consecutive tool results
  // share one user turn; the last assistant turn gets an empty think block.
  {
    json ctx = json::parse(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "<think>\nNeed the weather.\n</think>\n\n", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "content": "sunny"},
      {"role": "tool", "content": "22 C"},
      {"role": "assistant", "content": "It is sunny."}
    ], "add_generation_prompt": false})");
    ctx["tools"] = weather_tool();
    cases.push_back(
        {"Qwen3ToolCallingWithThinking", template_text(k_qwen3), ctx,
         qwen_tools_system("") +
             "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
             "<|im_start|>assistant\n<think>\nNeed the weather.\n</think>\n\n<tool_call>\n"
             "{\"name\": \"get_weather\", \"arguments\": {\"city\": "
             "\"Paris\"}}\n</tool_call><|im_end|>\n"
             "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
             "<tool_response>\n22 C\n</tool_response><|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\nIt is sunny.<|im_end|>\n"});
  }

  // Qwen3 reasoning in history: the think block of a turn before the last user query is dropped
  // (only the text after </think>, left-stripped of newlines, stays); the last turn keeps it,
  // newlines around the reasoning normalised to one.
  cases.push_back({"Qwen3ThinkingHistory", template_text(k_qwen3),
                   context(json::parse(R"([
         {"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
         {"role": "user", "content": "And 3+3?"},
         {"role": "assistant", "content": "<think>\n\nAdd again.\n\n</think>\n\n6"}
       ])"),
                           json(), "<|im_end|>", false),
                   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
                   "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\nAdd again.\n</think>\n\n6<|im_end|>\n"});

  // reasoning_content given separately is used instead of parsing content (and dropped here, as
  // the turn precedes the last query); enable_thinking=false makes the generation prompt an empty
  // think block, which tells the model to answer without reasoning.
  {
    json ctx = context(json::parse(R"([
      {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
      {"role": "user", "content": "And 3+3?"}
    ])"),
                       json(), "<|im_end|>", true);
    const std::string turns =
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n";
    cases.push_back({"Qwen3ReasoningContent", template_text(k_qwen3), ctx, turns});
    ctx["enable_thinking"] = true;
    cases.push_back({"Qwen3EnableThinking", template_text(k_qwen3), ctx, turns});
    ctx["enable_thinking"] = false;
    cases.push_back(
        {"Qwen3DisableThinking", template_text(k_qwen3), ctx, turns + "<think>\n\n</think>\n\n"});
  }

  // date_string given by the caller replaces the default.
  {
    json ctx = context(conversation(false), "<|begin_of_text|>", "<|eot_id|>");
    ctx["date_string"] = "01 Jan 2025";
    cases.push_back({"Llama31DateString", template_text(k_llama31), ctx,
                     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                     "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n"
                     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n"});
  }

  // raise_exception: the template's own message.
  struct Raise {
    const char* name;
    const char* template_json;
    const char* messages;
    const char* message;
  };
  const Raise raises[] = {
      {"GemmaRejectsSystem", k_gemma,
       R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])",
       "System role not supported"},
      {"MistralV01SystemBreaksAlternation", k_mistral_v01,
       R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])",
       "Conversation roles must alternate user/assistant/user/assistant/..."},
      {"MistralV01UnknownRole", k_mistral_v01,
       R"([{"role": "user", "content": "u"}, {"role": "tool", "content": "t"}])",
       "Only user and assistant roles are supported!"},
      {"MistralV02TwoUserTurns", k_mistral_v02,
       R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
           {"role": "user", "content": "u"}])",
       "After the optional system message, conversation roles must alternate "
       "user/assistant/user/assistant/..."},
      {"Llama2AssistantFirst", k_llama2, R"([{"role": "assistant", "content": "a"}])",
       "Conversation roles must alternate user/assistant/user/assistant/..."},
      {"GemmaTwoUserTurns", k_gemma,
       R"([{"role": "user", "content": "u"}, {"role": "user", "content": "u"}])",
       "Conversation roles must alternate user/assistant/user/assistant/..."},
      {"Llama31TwoToolCalls", k_llama31,
       R"([{"role": "user", "content": "u"}, {"role": "assistant", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}},
            {"function": {"name": "b", "arguments": {}}}]}])",
       "This model only supports single tool-calls at once!"},
  };
  for (const Raise& r : raises) {
    cases.push_back({r.name, template_text(r.template_json),
                     context(json::parse(r.messages), "<s>", "</s>"), r.message, true});
  }
  return cases;
}

}  // namespace sieve::server::templates
