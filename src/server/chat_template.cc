#include "server/chat_template.h"

#include <nlohmann/json.hpp>

#include "jinja/interp.h"
#include "jinja/syntax.h"

namespace sieve::server {

// The engine lives in src/jinja/: value (Python data model), syntax (lexer, parser, AST), interp
// (evaluation), builtins (methods, filters, tests, globals).
struct ChatTemplate::Program {
  jinja::Body body;
};

ChatTemplate ChatTemplate::parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->body = jinja::parse_template(source);
  return ChatTemplate(std::move(program));
}

namespace {

template <typename Json>
std::string render_program(const jinja::Body& body, const Json& context,
                           const ChatTemplateLimits& limits) {
  if (!context.is_object()) fail("chat template context must be a JSON object");
  jinja::Interp in{limits, {}, 1, 0, 0, 0};
  in.scopes.emplace_back();
  for (const auto& [name, value] : context.items()) in.scopes[0][name] = jinja::from_json(value);
  std::string out;
  jinja::render_body(body, in, out);
  return out;
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::json& context,
                                 const ChatTemplateLimits& limits) const {
  return render_program(program_->body, context, limits);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context,
                                 const ChatTemplateLimits& limits) const {
  return render_program(program_->body, context, limits);
}

std::string_view chatml_template() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

}  // namespace sieve::server
