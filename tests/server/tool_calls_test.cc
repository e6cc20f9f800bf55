// Tool calls: each family's output parser (whole and streamed in every split), the request's
// tools / tool_choice / parallel_tool_calls, rendering through the real templates, the response
// objects, and the grammar that forces calls (random walks over stories260K's vocabulary).
#include "server/tool_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "grammar/grammar_cache.h"
#include "grammar/vocabulary.h"
#include "model/loader.h"
#include "real_chat_templates.h"
#include "server/chat_template.h"
#include "server/api_requests.h"
#include "server/api_responses.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

using namespace templates;
using ::testing::HasSubstr;

constexpr ToolCallOptions kLlama{.format = ToolCallFormat::kLlama3Json};
constexpr ToolCallOptions kHermes{.format = ToolCallFormat::kHermes};
constexpr ToolCallOptions kMistral{.format = ToolCallFormat::kMistral};

// Calls without their (random) ids.
std::vector<std::pair<std::string, std::string>> names_and_args(
    const std::vector<ToolCall>& calls) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const ToolCall& c : calls) out.emplace_back(c.name, c.arguments);
  return out;
}

using Calls = std::vector<std::pair<std::string, std::string>>;

// ---------------------------------------------------------------------------------------------
// Formats

TEST(ToolCallFormat, DetectedFromRealTemplates) {
  EXPECT_EQ(detect_tool_call_format(template_text(k_llama31)), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format(template_text(k_qwen25)), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(template_text(k_qwen3)), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(k_mistral_tools), ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format(template_text(k_llama3)), ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format(template_text(k_mistral_v02)), ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format(chatml_template()), ToolCallFormat::kNone);
}

TEST(ToolCallFormat, Names) {
  for (auto f : {ToolCallFormat::kNone, ToolCallFormat::kLlama3Json, ToolCallFormat::kHermes,
                 ToolCallFormat::kMistral}) {
    EXPECT_EQ(parse_tool_call_format(tool_call_format_name(f)), f);
  }
  EXPECT_EQ(parse_tool_call_format("auto"), std::nullopt);
  EXPECT_EQ(parse_tool_call_format("qwen"), std::nullopt);
}

// ---------------------------------------------------------------------------------------------
// Parsing whole outputs

struct ParseCase {
  const char* name;
  ToolCallOptions options;
  std::string text;
  std::optional<std::string> content;
  Calls calls;
};

std::vector<ParseCase> parse_cases() {
  const std::string weather = R"({"city":"Paris"})";
  return {
      // Hermes / Qwen2.5 / Qwen3
      {"HermesOne",
       kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
       "</tool_call>",
       std::nullopt,
       {{"get_weather", weather}}},
      {"HermesTwoWithContent",
       kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n"
       "</tool_call>\n",
       "Let me check.",
       {{"a", "{}"}, {"b", R"({"x":[1,{"y":"}"}]})"}}},
      {"HermesThinkThenCall",
       kHermes,
       "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
       "{\"city\": \"Paris\"}}\n</tool_call>",
       "<think>\nweather\n</think>",
       {{"get_weather", weather}}},
      {"HermesNoClosingTagAtEnd",
       kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
       std::nullopt,
       {{"get_weather", weather}}},
      {"HermesArgumentsAsString",
       kHermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
       std::nullopt,
       {{"f", "{\"a\": 1}"}}},
      {"HermesGarbageIsContent",
       kHermes,
       "<tool_call>\nnot json\n</tool_call>",
       "<tool_call>\nnot json\n</tool_call>",
       {}},
      {"HermesNoNameIsContent",
       kHermes,
       "<tool_call>{\"arguments\": {}}</tool_call> ok",
       "<tool_call>{\"arguments\": {}}</tool_call> ok",
       {}},
      {"HermesUnfinishedIsContent",
       kHermes,
       "Hi <tool_call>\n{\"name\": \"f\", \"argu",
       "Hi <tool_call>\n{\"name\": \"f\", \"argu",
       {}},
      {"HermesGarbageThenCall",
       kHermes,
       "<tool_call>oops</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
       "<tool_call>oops</tool_call>",
       {{"f", "{}"}}},
      {"HermesPlainText",
       kHermes,
       "Just text, {\"name\": 1} and <tool",
       "Just text, {\"name\": 1} and <tool",
       {}},
      {"HermesBareJsonIsContent",
       kHermes,
       "{\"name\": \"f\", \"arguments\": {}}",
       "{\"name\": \"f\", \"arguments\": {}}",
       {}},
      // Llama 3.1+ JSON
      {"LlamaBare",
       kLlama,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       std::nullopt,
       {{"get_weather", weather}}},
      {"LlamaPythonTag",
       kLlama,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       std::nullopt,
       {{"get_weather", weather}}},
      {"LlamaSeveral",
       kLlama,
       " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": true}}\n"
       "{\"name\": \"c\", \"parameters\": {}}",
       std::nullopt,
       {{"a", "{}"}, {"b", R"({"k":true})"}, {"c", "{}"}}},
      {"LlamaTextFirstIsContent",
       kLlama,
       "Here: {\"name\": \"a\", \"parameters\": {}}",
       "Here: {\"name\": \"a\", \"parameters\": {}}",
       {}},
      {"LlamaJsonNotACall", kLlama, "{\"answer\": 42}", "{\"answer\": 42}", {}},
      {"LlamaCallThenText",
       kLlama,
       "{\"name\": \"a\", \"parameters\": {}} and more",
       "and more",
       {{"a", "{}"}}},
      {"LlamaUnbalanced",
       kLlama,
       "{\"name\": \"a\", \"parameters\": {]}",
       "{\"name\": \"a\", \"parameters\": {]}",
       {}},
      // Mistral
      {"MistralArray",
       kMistral,
       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
       "\"abcDEF123\"}, {\"name\": \"b\", \"arguments\": {}}]",
       std::nullopt,
       {{"get_weather", weather}, {"b", "{}"}}},
      {"MistralNewStyle",
       kMistral,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]b[CALL_ID]x12345678[ARGS]{}",
       std::nullopt,
       {{"get_weather", weather}, {"b", "{}"}}},
      {"MistralGarbage", kMistral, "[TOOL_CALLS] [1, 2]", "[TOOL_CALLS] [1, 2]", {}},
      {"MistralTextOnly", kMistral, "[INST] is not [TOOL_CALL", "[INST] is not [TOOL_CALL", {}},
      // Constrained: no markers
      {"ConstrainedHermes",
       {.format = ToolCallFormat::kHermes, .constrained = true},
       "{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {\"n\": 1}}",
       std::nullopt,
       {{"a", "{}"}, {"b", R"({"n":1})"}}},
      {"ConstrainedMistral",
       {.format = ToolCallFormat::kMistral, .constrained = true},
       "[{\"name\":\"a\",\"arguments\":{}}]",
       std::nullopt,
       {{"a", "{}"}}},
      {"ConstrainedTruncatedIsContent",
       {.format = ToolCallFormat::kHermes, .constrained = true},
       "{\"name\": \"a\", \"argum",
       "{\"name\": \"a\", \"argum",
       {}},
  };
}

class ParseTest : public ::testing::TestWithParam<ParseCase> {};

TEST_P(ParseTest, Whole) {
  const ParseCase& c = GetParam();
  const ParsedToolCalls parsed = parse_tool_calls(c.options, c.text);
  EXPECT_EQ(parsed.content, c.content);
  EXPECT_EQ(names_and_args(parsed.calls), c.calls);
  for (const ToolCall& call : parsed.calls) {
    if (c.options.format == ToolCallFormat::kMistral) continue;
    EXPECT_THAT(call.id, ::testing::MatchesRegex("call_[A-Za-z0-9]{24}"));
  }
}

// Streamed one byte at a time and in random splits: the same content and calls, and no content
// released that the whole parse does not have.
TEST_P(ParseTest, StreamedInAnySplit) {
  const ParseCase& c = GetParam();
  const ParsedToolCalls whole = parse_tool_calls(c.options, c.text);
  const std::string whole_content = whole.content.value_or("");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    ToolCallParser parser(c.options);
    std::string content;
    std::vector<ToolCall> calls;
    size_t i = 0;
    while (i < c.text.size()) {
      const size_t n = trial == 0 ? 1 : std::uniform_int_distribution<size_t>(1, 7)(rng);
      ToolCallDelta d = parser.push(std::string_view(c.text).substr(i, n));
      i += n;
      content += d.content;
      EXPECT_TRUE(whole_content.starts_with(content)) << content;
      for (auto& call : d.calls) calls.push_back(std::move(call));
    }
    ToolCallDelta d = parser.finish();
    content += d.content;
    for (auto& call : d.calls) calls.push_back(std::move(call));
    EXPECT_EQ(content, whole_content) << "trial " << trial;
    EXPECT_EQ(names_and_args(calls), c.calls) << "trial " << trial;
    EXPECT_EQ(parser.num_calls(), c.calls.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ParseTest, ::testing::ValuesIn(parse_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ToolCallParser, HoldsPartialMarkersUntilDecidable) {
  ToolCallParser hermes(kHermes);
  EXPECT_EQ(hermes.push("Sure <tool_").content, "Sure");
  EXPECT_EQ(hermes.push("cal").content, "");
  ToolCallDelta d = hermes.push("l>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "f");
  // Not a marker after all: released as soon as it cannot be one.
  ToolCallParser other(kHermes);
  EXPECT_EQ(other.push("a <tool").content, "a");
  EXPECT_EQ(other.push("box> b").content, " <toolbox> b");
  // Llama: leading blanks are held until the first character decides.
  ToolCallParser llama(kLlama);
  EXPECT_EQ(llama.push("\n ").content, "");
  EXPECT_EQ(llama.push("Hi").content, "\n Hi");
  ToolCallParser mistral(kMistral);
  EXPECT_EQ(mistral.push("x[TOOL").content, "x");
  EXPECT_TRUE(mistral.push("_CALLS] [{\"name\": \"f\", \"arguments\": {}").empty());
  EXPECT_EQ(mistral.push("}]").calls.size(), 1u);
}

TEST(ToolCallParser, MistralKeepsTheModelsIds) {
  const auto parsed =
      parse_tool_calls(kMistral,
                       "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcDEF123\"}, "
                       "{\"name\": \"g\", \"arguments\": {}}]");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].id, "abcDEF123");
  EXPECT_THAT(parsed.calls[1].id, ::testing::MatchesRegex("[A-Za-z0-9]{9}"));
}

// ---------------------------------------------------------------------------------------------
// Requests, rendering and responses on the real stories260K tokenizer

class ToolRequestTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = model::load_tokenizer(
        {.model_path = sieve::testing::shared_path("models/stories260K.gguf")});
    grammars_ =
        std::make_unique<grammar::GrammarCache>(grammar::Vocabulary::from_tokenizer(*tokenizer_));
  }
  // A model whose template is `source`; the last rendered prompt lands in rendered_.
  ModelInfo info(std::string source, ToolCallFormat format) {
    auto tmpl = std::make_shared<ChatTemplate>(ChatTemplate::parse(source));
    return {.served_name = "m",
            .context_length = 100000,
            .tokenizer = tokenizer_.get(),
            .render_chat =
                [this, tmpl](const json& context) {
                  rendered_ = tmpl->render(context);
                  return rendered_;
                },
            .grammars = grammars_.get(),
            .tool_call_format = format};
  }
  GenerationRequest parse(const std::string& body, const ModelInfo& model) {
    return parse_generation_request(ApiKind::kChat, json::parse(body), model);
  }
  ApiError error_of(const std::string& body, const ModelInfo& model) {
    try {
      parse(body, model);
    } catch (const ApiException& e) {
      return e.error();
    }
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  static inline std::shared_ptr<const tok::Tokenizer> tokenizer_;
  static inline std::unique_ptr<grammar::GrammarCache> grammars_;
  std::string rendered_;
};

const char* const kWeatherTool =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})";

std::string body_with(const std::string& extra) {
  return std::string(
             R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [)") +
         kWeatherTool + "]" + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST_F(ToolRequestTest, ValidationErrorsNameTheParameter) {
  const ModelInfo m = info(template_text(k_qwen25), ToolCallFormat::kHermes);
  struct Case {
    std::string body;
    std::string param;
  };
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<Case> cases = {
      {"{" + user + R"(, "tools": {}})", "tools"},
      {"{" + user + R"(, "tools": [1]})", "tools[0]"},
      {"{" + user + R"(, "tools": [{"type": "retrieval"}]})", "tools[0].type"},
      {"{" + user + R"(, "tools": [{"type": "function"}]})", "tools[0].function"},
      {"{" + user + R"(, "tools": [{"type": "function", "function": {}}]})",
       "tools[0].function.name"},
      {"{" + user + R"(, "tools": [{"type": "function", "function": {"name": "a b"}}]})",
       "tools[0].function.name"},
      {"{" + user +
           R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
      {"{" + user +
           R"(, "tools": [{"type": "function", "function": {"name": "f"}},
                          {"type": "function", "function": {"name": "f"}}]})",
       "tools[1].function.name"},
      {body_with(R"("tool_choice": "always")"), "tool_choice"},
      {body_with(R"("tool_choice": 3)"), "tool_choice"},
      {body_with(R"("tool_choice": {"type": "function"})"), "tool_choice"},
      {body_with(R"("tool_choice": {"type": "function", "function": {"name": "nope"}})"),
       "tool_choice"},
      {"{" + user + R"(, "tool_choice": "required"})", "tool_choice"},
      {body_with(R"("parallel_tool_calls": "yes")"), "parallel_tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
           "arguments": "{oops"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]})",
       "messages[0].tool_calls[0].function"},
      {R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]})",
       "messages[0].tool_call_id"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.body, m);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
  }
  // Forcing a call needs a parser and a grammar cache.
  EXPECT_EQ(error_of(body_with(R"("tool_choice": "required")"),
                     info(template_text(k_qwen25), ToolCallFormat::kNone))
                .param,
            "tool_choice");
  ModelInfo no_grammars = m;
  no_grammars.grammars = nullptr;
  EXPECT_EQ(error_of(body_with(R"("tool_choice": "required")"), no_grammars).param, "tool_choice");
  // A parameters schema the grammar compiler does not support.
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
                        "tools": [{"type": "function", "function": {"name": "f",
                                   "parameters": {"type": "object", "patternProperties": {}}}}]})",
                     m)
                .param,
            "tools");
}

TEST_F(ToolRequestTest, ChoiceSetsParsingAndConstraint) {
  const ModelInfo m = info(template_text(k_qwen25), ToolCallFormat::kHermes);
  GenerationRequest plain = parse(R"({"messages": [{"role": "user", "content": "hi"}]})", m);
  EXPECT_EQ(plain.tool_calls.format, ToolCallFormat::kNone);
  GenerationRequest automatic = parse(body_with(""), m);
  EXPECT_EQ(automatic.tool_calls.format, ToolCallFormat::kHermes);
  EXPECT_FALSE(automatic.tool_calls.constrained);
  EXPECT_EQ(automatic.params.constraint, nullptr);
  EXPECT_THAT(rendered_, HasSubstr("<tools>\n{\"type\": \"function\", \"function\""));
  // "none": no tools in the prompt, no parsing.
  GenerationRequest none = parse(body_with(R"("tool_choice": "none")"), m);
  EXPECT_EQ(none.tool_calls.format, ToolCallFormat::kNone);
  EXPECT_THAT(rendered_, ::testing::Not(HasSubstr("<tools>")));
  GenerationRequest required = parse(body_with(R"("tool_choice": "required")"), m);
  EXPECT_TRUE(required.tool_calls.constrained);
  EXPECT_NE(required.params.constraint, nullptr);
  GenerationRequest named = parse(
      body_with(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})"), m);
  EXPECT_TRUE(named.tool_calls.constrained);
  EXPECT_NE(named.params.constraint, nullptr);
  // A template of no known family: tools are rendered, the output is not parsed.
  GenerationRequest unknown =
      parse(body_with(""), info(template_text(k_llama3), ToolCallFormat::kNone));
  EXPECT_EQ(unknown.tool_calls.format, ToolCallFormat::kNone);
}

// Issue 42: a forced call's arguments come in the order the tool declares its parameters, and
// the template prints the tools in the request's key order.
TEST_F(ToolRequestTest, ForcedCallsKeepTheDeclaredParameterOrder) {
  const ModelInfo m = info(template_text(k_qwen25), ToolCallFormat::kHermes);
  const GenerationRequest r = parse_generation_request(
      ApiKind::kChat, parse_request_body(R"({"messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": "function", "function": {"name": "alarm", "parameters": {
              "type": "object", "properties": {"minute": {"type": "integer"},
              "hour": {"type": "integer"}, "label": {"enum": ["wake", "nap"]}},
              "required": ["minute", "hour", "label"], "additionalProperties": false}}}],
          "tool_choice": {"type": "function", "function": {"name": "alarm"}}})"),
      m);
  ASSERT_NE(r.params.constraint, nullptr);
  auto state = r.params.constraint->new_state();
  EXPECT_TRUE(state.accept_bytes(
      R"({"name": "alarm", "arguments": {"minute": 5, "hour": 7, "label": "nap"}})"));
  EXPECT_TRUE(state.can_end());
  EXPECT_FALSE(
      r.params.constraint->new_state().accept_bytes(R"({"name": "alarm", "arguments": {"hour")"));
  EXPECT_THAT(rendered_, HasSubstr(R"({"type": "function", "function": {"name": "alarm", )"
                                   R"("parameters": {"type": "object", "properties": )"
                                   R"({"minute": {"type": "integer"}, "hour": )"));
}

// A conversation with a call (OpenAI's shape: arguments as a JSON string) and its result.
std::string conversation_body(const std::string& system) {
  return R"({"messages": [)" + system + R"(
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny"}],
    "tools": [)" +
         kWeatherTool + "]}";
}

TEST_F(ToolRequestTest, RendersThroughLlama31) {
  parse(conversation_body(""), info(template_text(k_llama31), ToolCallFormat::kLlama3Json));
  // tools_in_user_message: the tool (its keys in the request's order, as transformers prints
  // them) goes into the first user turn; the call prints its parsed arguments; the result is an
  // ipython turn.
  EXPECT_EQ(rendered_,
            "<s><|start_header_id|>system<|end_header_id|>\n\n"  // stories260K's BOS
            "Environment: ipython\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call with "
            "its proper arguments that best answers the given prompt.\n\n"
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
            "argument name and its value}.Do not use variables.\n\n"
            "{\n    \"type\": \"function\",\n    \"function\": {\n"
            "        \"name\": \"get_weather\",\n        \"description\": \"Get the weather\",\n"
            "        \"parameters\": {\n            \"type\": \"object\",\n"
            "            \"properties\": {\n                \"city\": {\n"
            "                    \"type\": \"string\"\n                }\n            },\n"
            "            \"required\": [\n                \"city\"\n            ]\n"
            "        }\n    }\n}\n\n"
            "Weather in Paris?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_F(ToolRequestTest, RendersThroughQwen25AndQwen3) {
  const std::string turns =
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  const std::string tools_section =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
      "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\n"
      "For each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  parse(conversation_body(R"({"role": "system", "content": "Be terse."},)"),
        info(template_text(k_qwen25), ToolCallFormat::kHermes));
  EXPECT_EQ(rendered_, "<|im_start|>system\nBe terse.\n\n" + tools_section + turns);
  parse(conversation_body(""), info(template_text(k_qwen3), ToolCallFormat::kHermes));
  EXPECT_EQ(rendered_, "<|im_start|>system\n" + tools_section + turns);
}

TEST_F(ToolRequestTest, RendersThroughMistral) {
  parse(conversation_body(R"({"role": "system", "content": "Be terse."},)"),
        info(k_mistral_tools, ToolCallFormat::kMistral));
  EXPECT_EQ(rendered_,
            "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\", \"description\": \"Get the weather\", \"parameters\": {\"type\": "
            "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
            "[\"city\"]}}}][/AVAILABLE_TOOLS][INST] Be terse.\n\nWeather in Paris?[/INST]"
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
            "\"id\": \"abcDEF123\"}]</s>"
            "[TOOL_RESULTS] {\"content\": \"sunny\", \"call_id\": \"abcDEF123\"}[/TOOL_RESULTS]");
}

TEST_F(ToolRequestTest, ResponseCarriesToolCalls) {
  ResponseWriter writer(ApiKind::kChat, "m", *tokenizer_, false, kHermes);
  std::vector<ChoiceState> choices(2);
  choices[0].text =
      "On it.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>";
  choices[0].finish = engine::Finish{engine::FinishReason::kStop};
  choices[1].text = "No tools needed.";
  choices[1].finish = engine::Finish{engine::FinishReason::kLength};
  const json out = writer.response(choices, {});
  const json& m0 = out["choices"][0]["message"];
  EXPECT_EQ(m0["content"], "On it.");
  ASSERT_EQ(m0["tool_calls"].size(), 1u);
  EXPECT_THAT(m0["tool_calls"][0]["id"].get<std::string>(),
              ::testing::MatchesRegex("call_[A-Za-z0-9]{24}"));
  EXPECT_EQ(m0["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m0["tool_calls"][0]["function"],
            json({{"name", "get_weather"}, {"arguments", R"({"city":"Paris"})"}}));
  EXPECT_EQ(out["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(out["choices"][1]["message"],
            json({{"role", "assistant"}, {"content", "No tools needed."}}));
  EXPECT_EQ(out["choices"][1]["finish_reason"], "length");
  // Calls only: content is null.
  choices[0].text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  EXPECT_TRUE(writer.response(choices, {})["choices"][0]["message"]["content"].is_null());
}

TEST_F(ToolRequestTest, StreamChunksCarryToolCallDeltas) {
  ResponseWriter writer(ApiKind::kChat, "m", *tokenizer_, false, kHermes);
  ChoiceState choice;
  choice.tool_parser.emplace(kHermes);
  size_t offset = 0;
  std::vector<json> chunks;
  auto feed = [&](const std::string& text, bool last) {
    std::optional<engine::Finish> finish;
    if (last) finish = engine::Finish{engine::FinishReason::kStop};
    for (json& c : writer.tool_delta_chunks(choice, 0, text, {}, finish, offset)) {
      chunks.push_back(std::move(c));
    }
  };
  feed("Hi <tool_", false);
  feed("call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>", false);
  feed("{\"name\": \"b\", \"arguments\": {}}</tool_call>", true);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json({{"content", "Hi"}}));
  const json& head = chunks[1]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(head["index"], 0);
  EXPECT_EQ(head["type"], "function");
  EXPECT_EQ(head["function"], json({{"name", "a"}, {"arguments", ""}}));
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["tool_calls"][0],
            json({{"index", 0}, {"function", {{"arguments", R"({"x":1})"}}}}));
  EXPECT_EQ(chunks[3]["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
  EXPECT_EQ(chunks[3]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "b");
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_TRUE(chunks[i]["choices"][0]["finish_reason"].is_null());
  }
  EXPECT_EQ(chunks[4]["choices"][0]["finish_reason"], "tool_calls");
  // Garbage after a marker comes back as content with the engine's finish reason.
  ChoiceState bad;
  bad.tool_parser.emplace(kHermes);
  const auto tail = writer.tool_delta_chunks(bad, 0, "<tool_call>oops", {},
                                             engine::Finish{engine::FinishReason::kLength}, offset);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0]["choices"][0]["delta"], json({{"content", "<tool_call>oops"}}));
  EXPECT_EQ(tail[0]["choices"][0]["finish_reason"], "length");
}

// ---------------------------------------------------------------------------------------------
// The grammar of forced calls: random walks over stories260K's vocabulary always give calls
// that parse, name an allowed function, and whose arguments fit its schema.

struct GrammarCase {
  const char* name;
  ToolCallFormat format;
  bool parallel;
  std::vector<std::string> allowed;  // names of the functions offered
};

class ToolGrammarTest : public ToolRequestTest,
                        public ::testing::WithParamInterface<GrammarCase> {};

std::vector<ToolFunction> test_functions() {
  return {
      {.name = "get_weather", .parameters = json::parse(R"({"type": "object", "properties": {
           "city": {"type": "string", "maxLength": 8},
           "unit": {"enum": ["c", "f"]}}, "required": ["city"]})")},
      {.name = "count", .parameters = json::parse(R"({"type": "object", "properties": {
           "n": {"type": "integer"}, "flags": {"type": "array", "items": {"type": "boolean"},
           "maxItems": 3}}, "required": ["n", "flags"]})")},
      {.name = "noargs", .parameters = nullptr},
  };
}

void check_arguments(const std::string& name, const json& args) {
  ASSERT_TRUE(args.is_object());
  if (name == "get_weather") {
    ASSERT_TRUE(args.contains("city"));
    EXPECT_TRUE(args["city"].is_string());
    EXPECT_LE(args.size(), 2u);
    if (args.contains("unit")) {
      EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f");
    }
  } else if (name == "count") {
    EXPECT_TRUE(args.at("n").is_number_integer());
    EXPECT_TRUE(args.at("flags").is_array());
    EXPECT_LE(args["flags"].size(), 3u);
    EXPECT_EQ(args.size(), 2u);
  } else {
    EXPECT_EQ(name, "noargs");
    EXPECT_TRUE(args.empty());
  }
}

TEST_P(ToolGrammarTest, RandomWalksGiveValidCalls) {
  const GrammarCase& c = GetParam();
  std::vector<ToolFunction> functions;
  for (const ToolFunction& f : test_functions()) {
    if (std::find(c.allowed.begin(), c.allowed.end(), f.name) != c.allowed.end()) {
      functions.push_back(f);
    }
  }
  const std::string gbnf = tool_call_gbnf(c.format, functions, c.parallel);
  auto masker = grammars_->get({grammar::GrammarKind::kGbnf, gbnf});
  const grammar::Vocabulary& v = masker->vocabulary();
  std::mt19937 rng(11);
  size_t num_multi = 0;
  for (int walk = 0; walk < 40; ++walk) {
    grammar::GrammarState state = masker->new_state();
    grammar::TokenBitset mask;
    std::string text;
    bool ended = false;
    for (int step = 0; step < 3000 && !ended; ++step) {
      ASSERT_GT(masker->fill_mask(state, mask), 0u) << text;
      std::vector<grammar::TokenId> ids, closing;
      for (size_t i = 0; i < mask.size(); ++i) {
        if (!mask.test(i)) continue;
        const auto id = static_cast<grammar::TokenId>(i);
        if (v.is_eog(id)) continue;
        ids.push_back(id);
        if (v.token_bytes(id).find_first_of("}]\"") != std::string_view::npos)
          closing.push_back(id);
      }
      // Steer to an end after a while: EOS when allowed, else tokens that close something.
      if (state.can_end() &&
          (ids.empty() || step > 150 || std::uniform_real_distribution<>(0, 1)(rng) < 0.3)) {
        ended = true;
        break;
      }
      const auto& pool = step > 150 && !closing.empty() ? closing : ids;
      const auto id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      ASSERT_TRUE(masker->accept_token(state, id));
      text += v.token_bytes(id);
    }
    ASSERT_TRUE(ended) << text;
    const ParsedToolCalls parsed =
        parse_tool_calls({.format = c.format, .constrained = true}, text);
    EXPECT_EQ(parsed.content, std::nullopt) << text;
    ASSERT_FALSE(parsed.calls.empty()) << text;
    if (!c.parallel) {
      EXPECT_EQ(parsed.calls.size(), 1u) << text;
    }
    num_multi += parsed.calls.size() > 1;
    for (const ToolCall& call : parsed.calls) {
      EXPECT_NE(std::find(c.allowed.begin(), c.allowed.end(), call.name), c.allowed.end());
      check_arguments(call.name, json::parse(call.arguments));
    }
  }
  if (c.parallel) {
    EXPECT_GT(num_multi, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, ToolGrammarTest,
    ::testing::Values(
        GrammarCase{
            "HermesRequired", ToolCallFormat::kHermes, false, {"get_weather", "count", "noargs"}},
        GrammarCase{"HermesRequiredParallel",
                    ToolCallFormat::kHermes,
                    true,
                    {"get_weather", "count", "noargs"}},
        GrammarCase{"HermesNamed", ToolCallFormat::kHermes, false, {"count"}},
        GrammarCase{
            "LlamaRequiredParallel", ToolCallFormat::kLlama3Json, true, {"get_weather", "count"}},
        GrammarCase{"LlamaNamed", ToolCallFormat::kLlama3Json, false, {"get_weather"}},
        GrammarCase{"MistralRequiredParallel",
                    ToolCallFormat::kMistral,
                    true,
                    {"get_weather", "count", "noargs"}},
        GrammarCase{"MistralNamed", ToolCallFormat::kMistral, false, {"noargs"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ToolGrammar, ShapeOfTheCall) {
  const std::vector<ToolFunction> f = {{.name = "f", .parameters = nullptr}};
  EXPECT_THAT(tool_call_gbnf(ToolCallFormat::kLlama3Json, f, false), HasSubstr("parameters"));
  EXPECT_THAT(tool_call_gbnf(ToolCallFormat::kHermes, f, false), HasSubstr("arguments"));
  const std::string several = tool_call_gbnf(ToolCallFormat::kHermes, f, true);
  EXPECT_THAT(several, HasSubstr("root ::= call-root (\"\\n\" call-root)*"));
  EXPECT_NO_THROW(grammar::parse_gbnf(several));
}

// ---------------------------------------------------------------------------------------------
// Issue 42: output cut off at max_tokens in the middle of a call. Complete calls stay calls,
// finish_reason is "length", and the cut-off call is dropped: never passed off as content.

TEST(ToolCallParser, ACallCutOffIsDroppedInAnySplit) {
  struct Case {
    ToolCallOptions options;
    std::string text;
    std::optional<std::string> content;  // with cut_off
    size_t num_calls;
  };
  const std::string call = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
  const Case cases[] = {
      {kHermes, "Sure.\n<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n{ \"name\" : \"get",
       "Sure.", 1},
      {kHermes, "Sure.<tool_call>\n{\"name\": \"get", "Sure.", 0},
      {kHermes, "Wait <tool_c", "Wait ", 0},
      {{.format = ToolCallFormat::kHermes, .constrained = true},
       call + "\n" + call + "\n{\"na",
       std::nullopt,
       2},
      {{.format = ToolCallFormat::kHermes, .constrained = true}, "{\"name\": \"get_wea", "", 0},
      {kLlama, call + "; {\"name\": ", std::nullopt, 1},
      {kMistral, "[TOOL_CALLS] [" + call + ", {\"name\"", "", 0},
  };
  for (const Case& c : cases) {
    const ParsedToolCalls whole = parse_tool_calls(c.options, c.text, /*cut_off=*/true);
    EXPECT_EQ(whole.content, c.content) << c.text;
    EXPECT_EQ(whole.calls.size(), c.num_calls) << c.text;
    for (size_t split = 0; split <= c.text.size(); ++split) {
      ToolCallParser parser(c.options);
      ToolCallDelta a = parser.push(std::string_view(c.text).substr(0, split));
      ToolCallDelta b = parser.push(std::string_view(c.text).substr(split));
      ToolCallDelta end = parser.finish(/*cut_off=*/true);
      EXPECT_EQ(a.content + b.content + end.content, c.content.value_or("")) << c.text << split;
      EXPECT_EQ(a.calls.size() + b.calls.size() + end.calls.size(), c.num_calls) << c.text;
    }
  }
  // Not cut off (a stop string, EOS): what was held is content, as before.
  EXPECT_EQ(parse_tool_calls(kHermes, "Sure.<tool_call>\n{\"name\": \"get").content,
            "Sure.<tool_call>\n{\"name\": \"get");
}

TEST_F(ToolRequestTest, ResponsesOfACutOffOutputSayLength) {
  ResponseWriter writer(ApiKind::kChat, "m", *tokenizer_, false, kHermes);
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
      "\n<tool_call>\n{ \"name\" : \"get";
  std::vector<ChoiceState> choices(1);
  choices[0].text = text;
  choices[0].finish = engine::Finish{engine::FinishReason::kLength};
  const json out = writer.response(choices, {});
  EXPECT_EQ(out["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(out["choices"][0]["message"]["content"].is_null());
  ASSERT_EQ(out["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city":"Paris"})");

  // Streamed, in two pieces: the complete call, then the end with "length" and no content.
  ChoiceState choice;
  choice.tool_parser.emplace(kHermes);
  size_t offset = 0;
  std::vector<json> chunks =
      writer.tool_delta_chunks(choice, 0, text.substr(0, 90), {}, std::nullopt, offset);
  for (json& c : writer.tool_delta_chunks(choice, 0, text.substr(90), {},
                                          engine::Finish{engine::FinishReason::kLength}, offset)) {
    chunks.push_back(std::move(c));
  }
  size_t num_calls = 0;
  for (const json& chunk : chunks) {
    const json& delta = chunk["choices"][0]["delta"];
    EXPECT_EQ(delta.value("content", ""), "") << chunk.dump();
    if (delta.contains("tool_calls") && delta["tool_calls"][0].contains("id")) ++num_calls;
  }
  EXPECT_EQ(num_calls, 1u);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
}

// tool_choice "required" with parallel calls: the grammar lets the output end after any
// complete call, so the model is never made to start another.
TEST_F(ToolRequestTest, ParallelCallGrammarsMayEndAfterEachCall) {
  const std::vector<ToolFunction> functions = test_functions();
  const std::string call = R"({"name": "noargs", "arguments": {}})";
  const std::pair<ToolCallFormat, std::string> families[] = {
      {ToolCallFormat::kHermes, call + "\n" + call},
      {ToolCallFormat::kLlama3Json, R"({"name": "noargs", "parameters": {}}; )"
                                    R"({"name": "noargs", "parameters": {}})"},
      {ToolCallFormat::kMistral, "[" + call + ", " + call + "]"},
  };
  for (const auto& [format, two_calls] : families) {
    auto masker = grammars_->get(
        {grammar::GrammarKind::kGbnf, tool_call_gbnf(format, functions, /*parallel=*/true)});
    const size_t first_end = format == ToolCallFormat::kMistral ? 0 : two_calls.find("}}") + 2;
    if (first_end > 0) {
      auto one = masker->new_state();
      ASSERT_TRUE(one.accept_bytes(two_calls.substr(0, first_end))) << two_calls;
      EXPECT_TRUE(one.can_end()) << two_calls.substr(0, first_end);
    }
    auto two = masker->new_state();
    ASSERT_TRUE(two.accept_bytes(two_calls)) << two_calls;
    EXPECT_TRUE(two.can_end()) << two_calls;
  }
  auto mistral = grammars_->get(
      {grammar::GrammarKind::kGbnf, tool_call_gbnf(ToolCallFormat::kMistral, functions, true)});
  auto one = mistral->new_state();
  ASSERT_TRUE(one.accept_bytes("[" + call + "]"));
  EXPECT_TRUE(one.can_end());
}

}  // namespace
}  // namespace sieve::server
