// Request parsing of every endpoint (api_requests.h), on the real stories260K tokenizer.
#include "server/api_requests.h"

#include <gtest/gtest.h>

#include "model/loader.h"
#include "server/chat_template.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

class ApiRequestsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    holder_ = model::load_tokenizer(
        {.model_path = sieve::testing::shared_path("models/stories260K.gguf")});
    tokenizer_ = holder_.get();
  }
  ModelInfo info() const {
    return {.served_name = "llama",
            .context_length = 512,
            .tokenizer = tokenizer_,
            .render_chat = [](const json& context) {
              static const ChatTemplate chatml = ChatTemplate::parse(chatml_template());
              return chatml.render(context);
            }};
  }
  GenerationRequest parse(ApiKind kind, const std::string& body) const {
    return parse_generation_request(kind, json::parse(body), info());
  }
  // The error a body gets (from a server described by `model`, default info()); fails the test
  // when it is accepted.
  ApiError error_of(ApiKind kind, const std::string& body,
                    const std::optional<ModelInfo>& model = std::nullopt) const {
    try {
      parse_generation_request(kind, json::parse(body), model ? *model : info());
    } catch (const ApiException& e) {
      return e.error();
    }
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  static inline std::shared_ptr<const tok::Tokenizer> holder_;
  static inline const tok::Tokenizer* tokenizer_ = nullptr;
};

TEST_F(ApiRequestsTest, PromptFormsTokenizeLikeTheTokenizer) {
  const auto once =
      tokenizer_->encode("Once upon a time", {.add_special = true, .parse_special = true});
  EXPECT_EQ(parse(ApiKind::kCompletion, R"({"prompt":"Once upon a time"})").prompts,
            std::vector<std::vector<TokenId>>{once});
  EXPECT_EQ(parse(ApiKind::kCompletion, R"({"prompt":[1, 5, 9]})").prompts,
            (std::vector<std::vector<TokenId>>{{1, 5, 9}}));
  const auto two =
      parse(ApiKind::kCompletion, R"({"prompt":["Once upon a time", [1, 2]]})").prompts;
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], once);
  EXPECT_EQ(two[1], (std::vector<TokenId>{1, 2}));
}

TEST_F(ApiRequestsTest, DefaultsFollowOpenAi) {
  const GenerationRequest c = parse(ApiKind::kCompletion, R"({"prompt":"Once"})");
  EXPECT_EQ(c.params.max_tokens, 16);  // legacy completions default
  EXPECT_FLOAT_EQ(c.params.temperature, 1.0f);
  EXPECT_FALSE(c.stream);
  EXPECT_FALSE(c.params.logprobs.has_value());
  const GenerationRequest chat =
      parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_FALSE(chat.params.max_tokens.has_value());  // chat: until the context is full
}

// A model's generation_config.json defaults (--generation-config auto): they fill what a body
// leaves out, a body's own values win, max_new_tokens caps every request, and the extra EOS ids
// stop every request that does not ignore EOS.
TEST_F(ApiRequestsTest, GenerationConfigDefaultsFillWhatTheBodyLeavesOut) {
  ModelInfo model = info();
  model.sampling_defaults = {.temperature = 0.6f,
                             .top_p = 0.9f,
                             .top_k = 20,
                             .min_p = 0.05f,
                             .repetition_penalty = 1.1f,
                             .max_new_tokens = 12,
                             .eos_token_ids = {7, 9}};
  const auto parse_with = [&](ApiKind kind, const std::string& body) {
    return parse_generation_request(kind, json::parse(body), model);
  };
  const GenerationRequest silent = parse_with(ApiKind::kCompletion, R"({"prompt":"Once"})");
  EXPECT_FLOAT_EQ(silent.params.temperature, 0.6f);
  EXPECT_FLOAT_EQ(silent.params.top_p, 0.9f);
  EXPECT_EQ(silent.params.top_k, 20);
  EXPECT_FLOAT_EQ(silent.params.min_p, 0.05f);
  EXPECT_FLOAT_EQ(silent.params.repetition_penalty, 1.1f);
  EXPECT_EQ(silent.params.max_tokens, 12) << "the legacy 16, capped";
  EXPECT_EQ(silent.params.stop_token_ids, (std::vector<TokenId>{7, 9}));

  const GenerationRequest given = parse_with(
      ApiKind::kCompletion,
      R"({"prompt":"Once","temperature":0,"top_p":1,"top_k":-1,"max_tokens":100,"stop_token_ids":[9,3]})");
  EXPECT_FLOAT_EQ(given.params.temperature, 0.0f);
  EXPECT_FLOAT_EQ(given.params.top_p, 1.0f);
  EXPECT_EQ(given.params.top_k, 0);
  EXPECT_EQ(given.params.max_tokens, 12) << "max_new_tokens caps what a request asks";
  EXPECT_EQ(given.params.stop_token_ids, (std::vector<TokenId>{9, 3, 7}));

  const GenerationRequest chat =
      parse_with(ApiKind::kChat, R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(chat.params.max_tokens, 12);
  const GenerationRequest ignoring =
      parse_with(ApiKind::kCompletion, R"({"prompt":"Once","ignore_eos":true})");
  EXPECT_TRUE(ignoring.params.stop_token_ids.empty());
}

TEST_F(ApiRequestsTest, ParametersMapToSamplingParams) {
  const GenerationRequest r = parse(ApiKind::kCompletion, R"({
      "prompt": "Once", "max_tokens": 20, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "seed": 42, "n": 3,
      "stop": "cat", "logit_bias": {"7": -100}, "logprobs": 4, "ignore_eos": true, "min_tokens": 5,
      "stream": true, "stream_options": {"include_usage": true}, "user": "u1", "unknown_field": [1, 2]})");
  EXPECT_EQ(r.params.max_tokens, 20);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 0);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.2f);
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_EQ(r.params.n, 3);
  EXPECT_EQ(r.params.stop_strings, std::vector<std::string>{"cat"});
  EXPECT_FLOAT_EQ(r.params.logit_bias.at(7), -100.0f);
  EXPECT_EQ(r.params.logprobs, 4);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.params.min_tokens, 5);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");

  const GenerationRequest chat =
      parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"hi"}],
      "max_tokens": 50, "max_completion_tokens": 30, "logprobs": true, "top_logprobs": 2})");
  EXPECT_EQ(chat.params.max_tokens, 30);  // max_completion_tokens wins
  EXPECT_EQ(chat.params.logprobs, 2);
}

TEST_F(ApiRequestsTest, BadValuesNameTheParameter) {
  struct Case {
    ApiKind kind;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kCompletion, R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt":"x","temperature":-0.1})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt":"x","temperature":101})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt":"x","temperature":1e300})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt":"x","top_k":-2})", "top_k"},
      {ApiKind::kCompletion, R"({"prompt":"x","top_k":3000000000})", "top_k"},
      {ApiKind::kCompletion, R"({"prompt":"x","min_p":1.5})", "min_p"},
      {ApiKind::kCompletion, R"({"prompt":"x","presence_penalty":-2.5})", "presence_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"x","frequency_penalty":3})", "frequency_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"x","repetition_penalty":1000})", "repetition_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"x","n":129})", "n"},
      {ApiKind::kCompletion, R"({"prompt":"x","min_tokens":-1})", "min_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":-5})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","logprobs":-1})", "logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"x","stop_token_ids":[512]})", "stop_token_ids"},
      {ApiKind::kCompletion, R"({"prompt":"x","logit_bias":{"-1":1}})", "logit_bias"},
      // A range the engine checks, named as the body named the field.
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})",
       "top_logprobs"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1})",
       "max_completion_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","top_p":0})", "top_p"},
      {ApiKind::kCompletion, R"({"prompt":"x","top_k":1.5})", "top_k"},
      {ApiKind::kCompletion, R"({"prompt":"x","n":0})", "n"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","max_tokens":1e30})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","min_tokens":10,"max_tokens":5})", "min_tokens"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"min_tokens":100000})",
       "min_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"x","logprobs":21})", "logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"x","stop":[""]})", "stop"},
      {ApiKind::kCompletion, R"({"prompt":"x","stop":[1]})", "stop"},
      {ApiKind::kCompletion, R"({"prompt":"x","logit_bias":{"abc":1}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"x","logit_bias":{"512":1}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"x","stream_options":{"include_usage":true}})",
       "stream_options"},
      {ApiKind::kCompletion, R"({"prompt":[1, 512]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":5})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":"x","echo":1})", "echo"},
      {ApiKind::kCompletion, R"({"prompt":"x","echo":true,"max_tokens":-1})", "max_tokens"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})",
       "max_tokens"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],"echo":true,"max_completion_tokens":0})",
       "max_completion_tokens"},
      {ApiKind::kCompletion, R"({})", "prompt"},
      {ApiKind::kChat, R"({"messages":[]})", "messages"},
      {ApiKind::kChat, R"({"messages":"hi"})", "messages"},
      {ApiKind::kChat, R"({"messages":[{"content":"hi"}]})", "messages[0].role"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":7}]})", "messages[0].content"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0]"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
       "top_logprobs"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
       "response_format"},
      {ApiKind::kCompletion, R"({"prompt":"x","kv_policy":"snapkv:B=oops"})", "kv_policy"},
      {ApiKind::kCompletion, R"({"prompt":"x","kv_policy":"nonsense"})", "kv_policy"},
      {ApiKind::kCompletion, R"({"prompt":"x","kv_policy":5})", "kv_policy"},
      {ApiKind::kCompletion, R"({"prompt":"x","speculative":"ngram"})", "speculative"},
      {ApiKind::kCompletion, R"({"prompt":"x","speculative":{"method":"medusa"}})", "speculative"},
      {ApiKind::kCompletion, R"({"prompt":"x","speculative":{"method":"ngram"}})", "speculative"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],)"
       R"("speculative":{"method":"ngram","num_speculative_tokens":99}})",
       "speculative"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],)"
       R"("speculative":{"method":"ngram","num_speculative_tokens":2,"typo":1}})",
       "speculative"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.kind, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.body << ": " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
}

TEST_F(ApiRequestsTest, ContextLengthExceededSaysTheSizes) {
  json long_prompt = {{"prompt", std::vector<int>(600, 100)}};
  ApiError e = error_of(ApiKind::kCompletion, long_prompt.dump());
  EXPECT_EQ(e.code.value_or(""), "context_length_exceeded");
  EXPECT_NE(e.message.find("512"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("600"), std::string::npos) << e.message;
  e = error_of(ApiKind::kCompletion, R"({"prompt":[1,2,3],"max_tokens":510})");
  EXPECT_EQ(e.code.value_or(""), "context_length_exceeded");
  EXPECT_EQ(e.param.value_or(""), "max_tokens");
  EXPECT_NE(e.message.find("513"), std::string::npos) << e.message;
  // The completions default of 16 shrinks to the room left instead of failing.
  json near_full = {{"prompt", std::vector<int>(505, 100)}};
  EXPECT_EQ(parse(ApiKind::kCompletion, near_full.dump()).params.max_tokens, 7);
}

TEST_F(ApiRequestsTest, KvPolicyIsParsed) {
  EXPECT_TRUE(std::holds_alternative<sparsity::FullSpec>(
      parse(ApiKind::kCompletion, R"({"prompt":"x"})").kv_policy.policy));
  EXPECT_TRUE(std::holds_alternative<sparsity::FullSpec>(
      parse(ApiKind::kCompletion, R"({"prompt":"x","kv_policy":{"name":"full"}})")
          .kv_policy.policy));
  const GenerationRequest r =
      parse(ApiKind::kCompletion, R"({"prompt":"x","kv_policy":"snapkv:B=64"})");
  EXPECT_EQ(r.kv_policy, sparsity::parse_policy("snapkv:B=64"));
}

// "speculative" takes --speculative-config's JSON object; absent, the request has none of its own
// (the engine applies the server's default).
TEST_F(ApiRequestsTest, SpeculativeIsParsed) {
  EXPECT_FALSE(parse(ApiKind::kCompletion, R"({"prompt":"x"})").speculative.has_value());
  const GenerationRequest off =
      parse(ApiKind::kCompletion, R"({"prompt":"x","speculative":{"method":"none"}})");
  ASSERT_TRUE(off.speculative.has_value());
  EXPECT_FALSE(off.speculative->enabled());
  const GenerationRequest on = parse(
      ApiKind::kChat,
      R"({"messages":[{"role":"user","content":"x"}],)"
      R"("speculative":{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":2}})");
  ASSERT_TRUE(on.speculative.has_value());
  EXPECT_EQ(*on.speculative,
            speculative::parse_speculative_config(
                R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":2})"));
  const ApiError e =
      error_of(ApiKind::kCompletion, R"({"prompt":"x","speculative":{"method":"ngram","foo":1}})");
  EXPECT_NE(e.message.find("foo"), std::string::npos) << e.message;
}

TEST_F(ApiRequestsTest, UnknownModelIs404) {
  const ApiError e = error_of(ApiKind::kCompletion, R"({"model":"gpt-4","prompt":"x"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code.value_or(""), "model_not_found");
  EXPECT_NO_THROW(parse(ApiKind::kCompletion, R"({"model":"llama","prompt":"x"})"));

  // GET /v1/models/{id}: the same answer.
  ModelInfo aliased = info();
  aliased.aliases = {"tiny"};
  EXPECT_TRUE(serves_model(aliased, "llama"));
  EXPECT_TRUE(serves_model(aliased, "tiny"));
  EXPECT_FALSE(serves_model(aliased, "gpt-4"));
  try {
    check_model_name(aliased, "gpt-4");
    ADD_FAILURE() << "gpt-4 is served";
  } catch (const ApiException& refused) {
    EXPECT_EQ(refused.error().to_json(), e.to_json());
  }
}

TEST_F(ApiRequestsTest, BodiesMustBeJsonObjects) {
  for (const char* text : {"", "nul", "[1]", "\"x\"", "{\"a\":}", "{\"a\":\"\xff\"}"}) {
    try {
      parse_request_body(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error().status, 400) << text;
      EXPECT_EQ(e.error().param.value_or(""), "body") << text;
    }
  }
  EXPECT_EQ(parse_request_body(R"({"a": [1, {"b": null}]})")["a"][1]["b"], nullptr);
  // Nested deeper than anything walking it may recurse: a 400 that says why, not a crash.
  for (size_t depth : {kMaxJsonDepth, size_t{100000}}) {  // with the body's own object: one more
    const std::string text =
        R"({"response_format": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
    try {
      parse_request_body(text);
      ADD_FAILURE() << "accepted " << depth << " levels";
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error().status, 400);
      EXPECT_EQ(e.error().param.value_or(""), "body");
      EXPECT_NE(e.error().message.find("nests arrays and objects deeper than 128 levels"),
                std::string::npos)
          << e.error().message;
    }
  }
  EXPECT_NO_THROW(parse_request_body(R"({"a": )" + std::string(kMaxJsonDepth - 1, '[') +
                                     std::string(kMaxJsonDepth - 1, ']') + "}"));
}

TEST_F(ApiRequestsTest, TokenizeAndDetokenize) {
  const auto once = tokenizer_->encode("Once upon", {.add_special = true, .parse_special = true});
  EXPECT_EQ(parse_tokenize_request(json::parse(R"({"prompt":"Once upon"})"), info()), once);
  EXPECT_EQ(parse_tokenize_request(
                json::parse(R"({"prompt":"Once upon","add_special_tokens":false})"), info()),
            tokenizer_->encode("Once upon", {.add_special = false, .parse_special = true}));
  // A chat is tokenized as /v1/chat/completions prompts the model (whatever its "model").
  const char* chat = R"({"model":"other","messages":[{"role":"user","content":"Hi"}]})";
  EXPECT_EQ(parse_tokenize_request(json::parse(chat), info()),
            parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"Hi"}]})").prompts[0]);
  // A conversation longer than the context is tokenized whole: its count says how much to drop.
  json long_chat = {{"messages", json::array()}};
  for (int i = 0; i < 40; ++i)
    long_chat["messages"].push_back({{"role", i % 2 ? "assistant" : "user"},
                                     {"content", "The little dog ran to the park and played."}});
  EXPECT_GT(parse_tokenize_request(long_chat, info()).size(), 512u);
  EXPECT_EQ(parse_detokenize_request(json::parse(R"({"tokens":[1,5,9]})"), 512),
            (std::vector<TokenId>{1, 5, 9}));

  struct Bad {
    const char* body;
    const char* param;
    bool tokenize;
  };
  for (const Bad& bad :
       {Bad{R"({})", "prompt", true}, Bad{R"({"prompt":[1]})", "prompt", true},
        Bad{R"({"prompt":"x","add_special_tokens":1})", "add_special_tokens", true},
        Bad{R"({"messages":[]})", "messages", true}, Bad{R"({})", "tokens", false},
        Bad{R"({"tokens":[512]})", "tokens", false}, Bad{R"({"tokens":[1.5]})", "tokens", false}}) {
    try {
      if (bad.tokenize) {
        parse_tokenize_request(json::parse(bad.body), info());
      } else {
        parse_detokenize_request(json::parse(bad.body), 512);
      }
      ADD_FAILURE() << "accepted: " << bad.body;
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error().status, 400) << bad.body;
      EXPECT_EQ(e.error().param.value_or(""), bad.param) << bad.body;
    }
  }
}

TEST_F(ApiRequestsTest, ChatRendersTheTemplateAndAddsBos) {
  const GenerationRequest r = parse(ApiKind::kChat, R"({"messages":[
      {"role":"system","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"Hello"},{"type":"text","text":"there"}]}]})");
  const std::string expected_text =
      "<|im_start|>system\nBe "
      "brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n<|im_start|>assistant\n";
  std::vector<TokenId> expected =
      tokenizer_->encode(expected_text, {.add_special = false, .parse_special = true});
  expected.insert(expected.begin(), *tokenizer_->vocab().bos);  // stories260K's vocabulary adds BOS
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], expected);
}

TEST_F(ApiRequestsTest, TemplateErrorsAre400OnMessages) {
  ModelInfo strict = info();
  strict.render_chat = [](const json& context) {
    static const ChatTemplate t = ChatTemplate::parse(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') "
        "}}"
        "{% endif %}{{ m['content'] }}{% endfor %}");
    return t.render(context);
  };
  try {
    parse_generation_request(
        ApiKind::kChat, json::parse(R"({"messages":[{"role":"system","content":"x"}]})"), strict);
    FAIL() << "accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().param.value_or(""), "messages");
    EXPECT_NE(e.error().message.find("no system role"), std::string::npos) << e.error().message;
  }
}

// vLLM's chat_template_kwargs become template variables (Qwen3's enable_thinking, ...).
TEST_F(ApiRequestsTest, ChatTemplateKwargsReachTheTemplate) {
  ModelInfo thinking = info();
  thinking.render_chat = [](const json& context) {
    static const ChatTemplate t = ChatTemplate::parse(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and enable_thinking is false %} no-think{% endif %}");
    return t.render(context);
  };
  const auto render = [&](const std::string& body) {
    const auto ids = parse_generation_request(ApiKind::kChat, json::parse(body), thinking).prompts;
    return tokenizer_->decode(ids.at(0));
  };
  const std::string plain = render(R"({"messages":[{"role":"user","content":"Hi"}]})");
  const std::string off = render(
      R"({"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false}})");
  EXPECT_EQ(plain.find("no-think"), std::string::npos) << plain;
  EXPECT_NE(off.find("no-think"), std::string::npos) << off;
  EXPECT_EQ(error_of(ApiKind::kChat,
                     R"({"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":1})")
                .param.value_or(""),
            "chat_template_kwargs");
  EXPECT_EQ(error_of(ApiKind::kChat, R"({"messages":[{"role":"user","content":"Hi"}],)"
                                     R"("chat_template_kwargs":{"messages":[]}})")
                .param.value_or(""),
            "chat_template_kwargs");
}

// echo: each prompt's text as sent (token ids decoded), prompt logprobs asked of the engine iff
// logprobs are, and max_tokens 0 (score the prompt) allowed only with it, up to a prompt that
// fills the context.
TEST_F(ApiRequestsTest, EchoRepeatsEachPromptAndAsksForPromptLogprobs) {
  const GenerationRequest plain = parse(ApiKind::kCompletion, R"({"prompt":"Once upon a time"})");
  EXPECT_FALSE(plain.echo);
  EXPECT_FALSE(plain.prompt_logprobs.has_value());
  const GenerationRequest echo =
      parse(ApiKind::kCompletion, R"({"prompt":"Once upon a time","echo":true})");
  EXPECT_TRUE(echo.echo);
  EXPECT_EQ(echo.echo_texts, std::vector<std::string>{"Once upon a time"});
  EXPECT_FALSE(echo.prompt_logprobs.has_value());
  const GenerationRequest scored =
      parse(ApiKind::kCompletion,
            R"({"prompt":"Once upon a time","echo":true,"logprobs":3,"max_tokens":0})");
  EXPECT_EQ(scored.prompt_logprobs, 3);
  EXPECT_EQ(scored.params.logprobs, 3);
  EXPECT_EQ(scored.params.max_tokens, 0);

  const std::vector<TokenId> ids =
      tokenizer_->encode("Lily saw a cat", {.add_special = true, .parse_special = true});
  const GenerationRequest by_ids =
      parse(ApiKind::kCompletion, json{{"prompt", ids}, {"echo", true}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(by_ids.echo_texts, std::vector<std::string>{"Lily saw a cat"});
  const GenerationRequest several = parse(
      ApiKind::kCompletion, json{{"prompt", {json("Once"), json(ids)}}, {"echo", true}}.dump());
  EXPECT_EQ(several.echo_texts, (std::vector<std::string>{"Once", "Lily saw a cat"}));

  const GenerationRequest chat =
      parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"hi"}],"echo":true})");
  EXPECT_FALSE(chat.echo);

  // A prompt that fills the context: only max_tokens 0 leaves room.
  const json full = std::vector<TokenId>(512, 5);
  EXPECT_EQ(
      parse(ApiKind::kCompletion, json{{"prompt", full}, {"echo", true}, {"max_tokens", 0}}.dump())
          .prompts[0]
          .size(),
      512u);
  EXPECT_EQ(error_of(ApiKind::kCompletion,
                     json{{"prompt", full}, {"echo", true}, {"max_tokens", 1}}.dump())
                .code,
            "context_length_exceeded");
  EXPECT_EQ(
      error_of(
          ApiKind::kCompletion,
          json{{"prompt", std::vector<TokenId>(513, 5)}, {"echo", true}, {"max_tokens", 0}}.dump())
          .code,
      "context_length_exceeded");
}

TEST_F(ApiRequestsTest, ErrorShape) {
  const ApiError e{.status = 400, .message = "m", .param = "p"};
  const json j = e.to_json();
  EXPECT_EQ(j["error"]["message"], "m");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "p");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST_F(ApiRequestsTest, AdmissionErrorsMapByKindAndKeepTheirParam) {
  using Kind = engine::AdmissionError::Kind;
  ApiError e = admission_api_error({Kind::kQueueFull, std::nullopt, "busy"});
  EXPECT_EQ(e.status, 503);
  EXPECT_EQ(e.type, "server_overloaded");
  EXPECT_EQ(e.code, "queue_full");
  EXPECT_EQ(e.message, "busy");
  e = admission_api_error({Kind::kTooLong, "max_tokens", "long"});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "max_tokens");
  e = admission_api_error({Kind::kNeverFits, std::nullopt, "big"});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "kv_cache_too_small");
  EXPECT_EQ(e.param, std::nullopt);
  e = admission_api_error(engine::AdmissionError::invalid("kv_policy", "kv_policy 'x': no"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, "kv_policy");
  EXPECT_EQ(e.code, std::nullopt);
}

// response_format and grammar compile to the sampler's constraint; what cannot is a 400 naming
// the field and, for schemas, the keyword.
TEST_F(ApiRequestsTest, ResponseFormatAndGrammarBecomeTheConstraint) {
  grammar::GrammarCache grammars(grammar::Vocabulary::from_tokenizer(*tokenizer_));
  ModelInfo constrained = info();
  constrained.grammars = &grammars;
  auto parse_with = [&](ApiKind kind, const std::string& body) {
    return parse_generation_request(kind, json::parse(body), constrained);
  };
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(
      parse_with(ApiKind::kChat, chat + R"("response_format":{"type":"text"}})").params.constraint,
      nullptr);
  EXPECT_EQ(parse_with(ApiKind::kChat, chat + R"("max_tokens":3})").params.constraint, nullptr);
  const auto object =
      parse_with(ApiKind::kChat, chat + R"("response_format":{"type":"json_object"}})");
  ASSERT_NE(object.params.constraint, nullptr);
  auto state = object.params.constraint->new_state();
  EXPECT_TRUE(state.accept_bytes(R"({"a": [1, "b"]})"));
  EXPECT_TRUE(state.can_end());

  const std::string schema =
      R"("response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,)"
      R"("schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],)"
      R"("additionalProperties":false}}}})";
  const auto with_schema = parse_with(ApiKind::kCompletion, R"({"prompt":"x",)" + schema);
  ASSERT_NE(with_schema.params.constraint, nullptr);
  auto s2 = with_schema.params.constraint->new_state();
  EXPECT_FALSE(s2.accept_bytes(R"({"m")"));
  EXPECT_TRUE(s2.accept_bytes(R"({"n": 42})"));
  EXPECT_TRUE(s2.can_end());
  // The same schema again is the same compiled grammar (cached by content).
  EXPECT_EQ(parse_with(ApiKind::kCompletion, R"({"prompt":"y",)" + schema).params.constraint,
            with_schema.params.constraint);

  const auto gbnf =
      parse_with(ApiKind::kCompletion, R"({"prompt":"x","grammar":"root ::= \"hi\""})");
  ASSERT_NE(gbnf.params.constraint, nullptr);
  auto s3 = gbnf.params.constraint->new_state();
  EXPECT_TRUE(s3.accept_bytes("hi"));
  EXPECT_TRUE(s3.can_end());

  struct Case {
    std::string body;
    std::string param;
    std::string says;  // part of the message
  };
  const Case cases[] = {
      {chat + R"("response_format":{"type":"xml"}})", "response_format", "xml"},
      {chat + R"("response_format":"json"})", "response_format", "object"},
      {chat + R"("response_format":{"type":"json_schema"}})", "response_format", "json_schema"},
      {chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x",)"
              R"("schema":{"type":"string","pattern":"a+"}}}})",
       "response_format", "pattern"},
      {chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x",)"
              R"("strict":true,"schema":{"type":"object","properties":{"a":{"type":"string"}},)"
              R"("required":["a"]}}}})",
       "response_format", "additionalProperties"},
      {chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"x",)"
              R"("strict":true,"schema":{"type":"object","properties":{"a":{"type":"string"},)"
              R"("b":{"type":"object","properties":{"c":{"type":"null"}},)"
              R"("additionalProperties":false}},"required":["a","b"],)"
              R"("additionalProperties":false}}}})",
       "response_format", "'c' at '#/properties/b'"},
      {chat + R"x("grammar":"root ::= \""})x", "grammar", ""},
      {chat + R"("grammar":"root ::= missing"})", "grammar", "missing"},
      {chat + R"("grammar":5})", "grammar", ""},
      {chat + R"("grammar":"root ::= \"a\"","response_format":{"type":"json_object"}})", "grammar",
       "combined"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(ApiKind::kChat, c.body, constrained);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
}

// Issue 42: a user's JSON keeps its key order wherever it goes (a schema's declared order is the
// output's), and a repeated key means its last value, as Python's json reads it.
TEST_F(ApiRequestsTest, UserJsonKeepsItsKeyOrder) {
  grammar::GrammarCache grammars(grammar::Vocabulary::from_tokenizer(*tokenizer_));
  json context;  // the last chat template context rendered
  ModelInfo model = info();
  model.grammars = &grammars;
  model.render_chat = [&context](const json& c) {
    context = c;
    return std::string("Hi");
  };
  auto parse_body = [&](ApiKind kind, const std::string& body) {
    return parse_generation_request(kind, parse_request_body(body), model);
  };

  // response_format: the properties in the schema's order, not alphabetical.
  const auto schema = parse_body(
      ApiKind::kCompletion,
      R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"p",)"
      R"("strict":true,"schema":{"type":"object","properties":{"name":{"type":"string"},)"
      R"("age":{"type":"integer"},"friends":{"type":"array","items":{"type":"string"}},)"
      R"("has_pet":{"type":"boolean"},"mood":{"enum":["ok","sad"]}},)"
      R"("required":["name","age","friends","has_pet","mood"],"additionalProperties":false}}}})");
  ASSERT_NE(schema.params.constraint, nullptr);
  auto declared = schema.params.constraint->new_state();
  EXPECT_TRUE(declared.accept_bytes(
      R"({"name": "Ann", "age": 3, "friends": [], "has_pet": true, "mood": "ok"})"));
  EXPECT_TRUE(declared.can_end());
  EXPECT_FALSE(schema.params.constraint->new_state().accept_bytes(R"({"age")"));

  // Messages, their tool calls' arguments (a JSON string) and the tools reach the template as
  // sent; chat_template_kwargs come after the context's own variables, or replace one in place.
  parse_body(ApiKind::kChat,
             R"({"messages":[{"role":"user","content":"x","name":"u"},)"
             R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1",)"
             R"("type":"function","function":{"name":"f",)"
             R"("arguments":"{\"unit\": \"c\", \"city\": \"Rome\"}"}}]}],)"
             R"("tools":[{"type":"function","function":{"name":"f",)"
             R"("parameters":{"type":"object","properties":{"unit":{},"city":{}}}}}],)"
             R"("chat_template_kwargs":{"zeta":1,"bos_token":"B","alpha":2}})");
  std::vector<std::string> keys;
  for (const auto& [key, value] : context.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"messages", "add_generation_prompt", "bos_token",
                                            "eos_token", "tools", "zeta", "alpha"}));
  EXPECT_EQ(context["bos_token"], "B");
  EXPECT_EQ(context["messages"][0].dump(), R"({"role":"user","content":"x","name":"u"})");
  EXPECT_EQ(context["messages"][1]["tool_calls"][0]["function"]["arguments"].dump(),
            R"({"unit":"c","city":"Rome"})");
  EXPECT_EQ(context["tools"][0]["function"]["parameters"]["properties"].dump(),
            R"({"unit":{},"city":{}})");

  // Repeated keys: the last value (logit_bias, kv_policy, a sampling field).
  const auto repeated = parse_body(
      ApiKind::kCompletion,
      R"({"prompt":"x","temperature":2,"logit_bias":{"5":1,"7":3,"5":-2},"temperature":0.5,)"
      R"("kv_policy":{"name":"streaming","S":4,"W":64,"W":32}})");
  EXPECT_EQ(repeated.params.temperature, 0.5f);
  EXPECT_EQ(repeated.params.logit_bias, (std::map<TokenId, float>{{5, -2.0f}, {7, 3.0f}}));
  EXPECT_EQ(repeated.kv_policy, sparsity::parse_policy("streaming:S=4,W=32"));
}

}  // namespace
}  // namespace sieve::server
