// Chat-template rendering: real Hugging Face templates, Jinja semantics, errors and limits.
//
// The real templates' expected prompts are in chat_template_cases.h (worked out by hand from each
// template and checked against @huggingface/jinja by chat_template_reference_test); the Jinja
// rows below follow Python's jinja2 3.1 with transformers' settings (trim_blocks, lstrip_blocks,
// loopcontrols), whose printing of values (True, None, reprs) the JavaScript renderer does not
// share.
#include "server/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "chat_template_cases.h"

namespace sieve::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

using namespace templates;  // k_llama31, ..., TemplateCase (chat_template_cases.h)

template <class Json = json>
std::string render(std::string_view source, const Json& context,
                   const ChatTemplateLimits& limits = {}) {
  return ChatTemplate::parse(source).render(context, limits);
}

// ---------------------------------------------------------------------------------------------
// Real templates, rendered: chat_template_cases.h (its expectations are also checked against
// @huggingface/jinja by chat_template_reference_test).

class RealTemplate : public ::testing::TestWithParam<TemplateCase> {};

TEST_P(RealTemplate, RendersAsExpected) {
  const TemplateCase& c = GetParam();
  const auto tmpl = ChatTemplate::parse(c.source);
  if (!c.raises) {
    EXPECT_EQ(tmpl.render(c.context), c.expected);
    return;
  }
  try {
    tmpl.render(c.context);
    ADD_FAILURE() << "no exception";
  } catch (const ChatTemplateRaised& e) {
    EXPECT_EQ(std::string(e.what()), c.expected);
  }
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, RealTemplate, ::testing::ValuesIn(real_template_cases()),
                         [](const auto& info) { return info.param.name; });

// A user turn that is only a <tool_response> does not count as Qwen3's last query: the
// assistant turn before it then keeps its reasoning.
TEST(ChatTemplate, Qwen3ToolResponseIsNotAQuery) {
  const nlohmann::ordered_json ctx = context(nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
    {"role": "user", "content": "<tool_response>\n8\n</tool_response>"}
  ])"),
                                             nullptr, "<|im_end|>", true);
  EXPECT_THAT(ChatTemplate::parse(template_text(k_qwen3)).render(ctx),
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
  nlohmann::ordered_json messages =
      nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hello, who are you?"}])");
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
