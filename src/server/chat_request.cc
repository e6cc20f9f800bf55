#include "server/chat_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "server/request_fields.h"
#include "server/sampling_request.h"
#include "util/error.h"

namespace sieve::server {

namespace {

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// An assistant message's tool_calls as the templates want them: the arguments object itself
// (OpenAI sends it as a JSON string; Llama 3.1's and Qwen2.5's templates print it with tojson).
json tool_calls_for_template(const json& calls, const std::string& where) {
  if (!calls.is_array()) throw_invalid(where, fmt::format("'{}' must be an array", where));
  json out = calls;
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!calls[i].is_object()) throw_invalid(at, fmt::format("'{}' must be an object", at));
    const json* function = field(calls[i], "function");
    if (!function || !function->is_object()) {
      throw_invalid(at + ".function", fmt::format("'{}.function' must be an object", at));
    }
    const json* name = field(*function, "name");
    if (!name) throw_invalid(at + ".function.name", "a tool call needs a function 'name'");
    string_of(*name, at + ".function.name");
    if (const json* id = field(calls[i], "id")) string_of(*id, at + ".id");
    const json* arguments = field(*function, "arguments");
    json& target = out[i]["function"]["arguments"];
    if (!arguments) {
      target = json::object();
    } else if (arguments->is_string()) {
      std::optional<json> parsed = parse_json(arguments->get<std::string>());
      if (!parsed) {
        throw_invalid(at + ".function.arguments",
                      fmt::format("'{}.function.arguments' is not valid JSON", at));
      }
      target = *std::move(parsed);
    } else if (!arguments->is_object()) {
      throw_invalid(at + ".function.arguments",
                    fmt::format("'{}.function.arguments' must be a JSON string", at));
    }
  }
  return out;
}

}  // namespace

json chat_template_context(const json& messages, bool add_generation_prompt,
                           const tok::Tokenizer& tokenizer) {
  json flat = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw_invalid(where, fmt::format("'{}' must be an object", where));
    const json* role = field(m, "role");
    if (!role) throw_invalid(where + ".role", fmt::format("'{}.role' is required", where));
    string_of(*role, where + ".role");
    json message = m;
    if (const json* calls = field(m, "tool_calls")) {
      message["tool_calls"] = tool_calls_for_template(*calls, where + ".tool_calls");
    }
    if (const json* id = field(m, "tool_call_id")) string_of(*id, where + ".tool_call_id");
    const json* content = field(m, "content");
    if (!content) {
      message["content"] = "";
    } else if (content->is_array()) {
      // Content parts: text parts are joined with newlines, as vLLM does.
      std::string text;
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_where = fmt::format("{}.content[{}]", where, j);
        if (!part.is_object())
          throw_invalid(part_where, fmt::format("'{}' must be an object", part_where));
        const json* type = field(part, "type");
        if (!type || string_of(*type, part_where + ".type") != "text") {
          throw_invalid(part_where, "only text content parts are supported");
        }
        const json* part_text = field(part, "text");
        if (!part_text) throw_invalid(part_where + ".text", "a text content part needs 'text'");
        if (!text.empty()) text += '\n';
        text += string_of(*part_text, part_where + ".text");
      }
      message["content"] = text;
    } else if (!content->is_string()) {
      throw_invalid(
          where + ".content",
          fmt::format("'{}.content' must be a string or an array of content parts", where));
    }
    flat.push_back(std::move(message));
  }
  const auto& v = tokenizer.vocab();
  return {{"messages", std::move(flat)},
          {"add_generation_prompt", add_generation_prompt},
          {"bos_token", v.bos ? tokenizer.token_to_piece(*v.bos, true) : ""},
          {"eos_token", v.eos ? tokenizer.token_to_piece(*v.eos, true) : ""}};
}

ToolRequest parse_tool_request(const json& body) {
  ToolRequest tools;
  const json* list = field(body, "tools");
  if (list) {
    if (!list->is_array()) throw_invalid("tools", "'tools' must be an array");
    std::unordered_set<std::string> names;
    for (size_t i = 0; i < list->size(); ++i) {
      const json& tool = (*list)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!tool.is_object()) throw_invalid(where, fmt::format("'{}' must be an object", where));
      const json* type = field(tool, "type");
      if (!type || string_of(*type, where + ".type") != "function") {
        throw_invalid(where + ".type", fmt::format("'{}.type' must be \"function\"", where));
      }
      const json* function = field(tool, "function");
      if (!function || !function->is_object()) {
        throw_invalid(where + ".function", fmt::format("'{}.function' must be an object", where));
      }
      const json* name = field(*function, "name");
      if (!name) throw_invalid(where + ".function.name", "a function needs a 'name'");
      ToolFunction f{.name = string_of(*name, where + ".function.name")};
      if (!valid_function_name(f.name)) {
        throw_invalid(
            where + ".function.name",
            fmt::format("function name '{}' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", f.name));
      }
      if (!names.insert(f.name).second) {
        throw_invalid(where + ".function.name",
                      fmt::format("function '{}' is defined twice", f.name));
      }
      if (const json* d = field(*function, "description")) {
        string_of(*d, where + ".function.description");
      }
      if (const json* p = field(*function, "parameters")) {
        if (!p->is_object()) {
          throw_invalid(
              where + ".function.parameters",
              fmt::format("'{}.function.parameters' must be a JSON Schema object", where));
        }
        f.parameters = *p;
      }
      tools.functions.push_back(std::move(f));
    }
  }
  if (const json* v = field(body, "parallel_tool_calls")) {
    tools.parallel = bool_of(*v, "parallel_tool_calls");
  }
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      const std::string mode = choice->get<std::string>();
      if (mode == "none") {
        tools.choice = ToolRequest::Choice::kNone;
      } else if (mode == "auto") {
        tools.choice = ToolRequest::Choice::kAuto;
      } else if (mode == "required") {
        tools.choice = ToolRequest::Choice::kRequired;
      } else {
        throw_invalid("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", "
                                                 "\"required\" or a function, got \"{}\"",
                                                 mode));
      }
    } else if (choice->is_object()) {
      const json* type = field(*choice, "type");
      const json* function = field(*choice, "function");
      if (!type || string_of(*type, "tool_choice.type") != "function" || !function ||
          !function->is_object() || !field(*function, "name")) {
        throw_invalid("tool_choice",
                      "a named 'tool_choice' is {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}}");
      }
      tools.choice = ToolRequest::Choice::kNamed;
      tools.named = string_of(*field(*function, "name"), "tool_choice.function.name");
    } else {
      throw_invalid("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  const bool forced =
      tools.choice == ToolRequest::Choice::kRequired || tools.choice == ToolRequest::Choice::kNamed;
  if (forced && tools.functions.empty()) {
    throw_invalid("tool_choice", "'tool_choice' asks for a tool call but 'tools' has none");
  }
  if (tools.choice == ToolRequest::Choice::kNamed) {
    bool found = false;
    for (const ToolFunction& f : tools.functions) found = found || f.name == tools.named;
    if (!found) {
      throw_invalid(
          "tool_choice",
          fmt::format("'tool_choice' names function '{}', which is not in 'tools'", tools.named));
    }
  }
  if (!tools.functions.empty() && tools.choice != ToolRequest::Choice::kNone) tools.render = list;
  return tools;
}

// How the output of a chat request with tools is read, and for tool_choice "required" or a named
// function the grammar that forces the call(s).
void apply_tool_choice(const ToolRequest& tools, const ModelInfo& model,
                       GenerationRequest& request) {
  if (!tools.render) return;
  const bool forced =
      tools.choice == ToolRequest::Choice::kRequired || tools.choice == ToolRequest::Choice::kNamed;
  if (model.tool_call_format == ToolCallFormat::kNone) {
    if (forced) {
      throw_invalid("tool_choice",
                    "this server reads no tool calls from this model's output (its chat template "
                    "is of no known tool-calling family): start it with --tool-call-parser");
    }
    return;  // the tools are rendered; the output is plain content
  }
  request.tool_calls = {.format = model.tool_call_format, .constrained = forced};
  if (!forced) return;
  if (!model.grammars) {
    throw_invalid("tool_choice", "constrained decoding is not available on this server");
  }
  if (request.params.constraint) {
    throw_invalid("tool_choice",
                  "a 'tool_choice' that forces a call cannot be combined with another constraint "
                  "(response_format, grammar)");
  }
  std::vector<ToolFunction> allowed;
  for (const ToolFunction& f : tools.functions) {
    if (tools.choice == ToolRequest::Choice::kRequired || f.name == tools.named)
      allowed.push_back(f);
  }
  // A named function is called once; "required" makes one call, or several when parallel.
  const bool parallel = tools.choice == ToolRequest::Choice::kRequired && tools.parallel;
  std::string gbnf;
  try {
    gbnf = tool_call_gbnf(model.tool_call_format, allowed, parallel);
  } catch (const Error& e) {
    throw_invalid(
        "tools", fmt::format("cannot constrain the output to the tools' parameters: {}", e.what()));
  }
  request.params.constraint =
      compile_constraint({"tools", {grammar::GrammarKind::kGbnf, std::move(gbnf)}}, model);
}

ChatPrompt parse_chat_prompt(const json& body, const ModelInfo& model, const json* tools) {
  const json* messages = field(body, "messages");
  if (!messages) throw_invalid("messages", "'messages' is required");
  if (!messages->is_array()) throw_invalid("messages", "'messages' must be an array");
  if (messages->empty()) throw_invalid("messages", "'messages' must not be empty");
  bool add_generation_prompt = true;  // vLLM's extension; OpenAI always adds it
  if (const json* v = field(body, "add_generation_prompt"))
    add_generation_prompt = bool_of(*v, "add_generation_prompt");
  json context = chat_template_context(*messages, add_generation_prompt, *model.tokenizer);
  if (tools) context["tools"] = *tools;
  // vLLM's extension: extra template variables, e.g. {"enable_thinking": false} for Qwen3.
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      throw_invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    // A kwarg replaces a variable of the context's own (bos_token, tools, ...) in its place, or
    // comes after them: a scan of those few only, as the kwargs' keys are distinct already.
    auto& variables = context.get_ref<json::object_t&>();
    const size_t num_own = variables.size();
    for (const auto& kwarg : kwargs->items()) {
      const std::string& key = kwarg.key();
      if (key == "messages" || key == "add_generation_prompt") {
        throw_invalid(
            "chat_template_kwargs",
            fmt::format("'chat_template_kwargs' cannot set '{}': it has its own field", key));
      }
      const auto own = std::find_if(variables.begin(), variables.begin() + num_own,
                                    [&](const auto& variable) { return variable.first == key; });
      if (own != variables.begin() + num_own) {
        own->second = kwarg.value();
      } else {
        variables.emplace_back(key, kwarg.value());  // the vector's: no scan of what was appended
      }
    }
  }
  std::string text;
  try {
    text = model.render_chat(context);
  } catch (const Error& e) {
    throw_invalid("messages", fmt::format("the chat template rejected the messages: {}", e.what()));
  }
  const tok::Tokenizer& tokenizer = *model.tokenizer;
  const tok::EncodeOptions encoding{.add_special = false, .parse_special = true};
  std::vector<TokenId> ids = model.encode_prompt(text, encoding);
  // Templates usually write the BOS token themselves; add it (as llama.cpp does) when the
  // vocabulary wants one and the template did not.
  const auto& v = tokenizer.vocab();
  if (v.add_bos && v.bos && (ids.empty() || ids.front() != *v.bos)) ids.insert(ids.begin(), *v.bos);
  if (ids.empty()) throw_invalid("messages", "the rendered conversation is empty");
  return {.text = std::move(text), .ids = std::move(ids), .encoding = encoding};
}

}  // namespace sieve::server
