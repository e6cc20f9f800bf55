#include "server/api_responses.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

namespace sieve::server {

namespace {

// The output stopped at its length limit: finish_reason stays "length" even with tool calls (as
// OpenAI reports it), and a call it was writing is dropped.
bool cut_off(const std::optional<engine::Finish>& finish) {
  return finish && finish->reason == engine::FinishReason::kLength;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_hex(size_t digits) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (out.size() < digits) out += fmt::format("{:016x}", rng());
  out.resize(digits);
  return out;
}

}  // namespace

json UsageTotals::to_json() const {
  // sieve's extension: KV memory kept against a dense cache (sparsity's saving).
  json kv_cache = {{"pages", kv_pages},
                   {"dense_pages", kv_dense_pages},
                   {"bytes", kv_bytes},
                   {"dense_bytes", kv_dense_bytes},
                   {"continued_tokens", continued_tokens}};
  if (recovery_count > 0) kv_cache["attention_recovery"] = recovery_sum / recovery_count;
  json out = {{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}},
              {"kv_cache", std::move(kv_cache)}};
  if (speculative || spec_draft_tokens > 0) {
    out["speculative"] = {{"draft_tokens", spec_draft_tokens},
                          {"accepted_tokens", spec_accepted_tokens}};
  }
  return out;
}

json finish_reason_json(const std::optional<engine::Finish>& finish) {
  if (!finish) return nullptr;
  return std::string(engine::finish_reason_name(finish->reason));
}

json stop_reason_json(const std::optional<engine::Finish>& finish) {
  if (!finish) return nullptr;
  if (const auto* id = std::get_if<TokenId>(&finish->matched)) return *id;
  if (const auto* s = std::get_if<std::string>(&finish->matched)) return *s;
  return nullptr;
}

ResponseWriter::ResponseWriter(ApiKind kind, std::string model_name,
                               const tok::Tokenizer& tokenizer, bool want_logprobs,
                               ToolCallOptions tool_calls)
    : kind_(kind),
      model_(std::move(model_name)),
      tokenizer_(tokenizer),
      want_logprobs_(want_logprobs),
      tool_calls_(tool_calls),
      id_((kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + random_hex(24)),
      created_(unix_seconds()) {}

json ResponseWriter::base(std::string_view object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseWriter::logprobs_json(std::span<const engine::SampleResult> logprobs,
                                   size_t& offset) const {
  if (!want_logprobs_) return nullptr;
  auto bytes_of = [](const std::string& piece) {
    json b = json::array();
    for (unsigned char c : piece) b.push_back(static_cast<int>(c));
    return b;
  };
  if (kind_ == ApiKind::kChat) {
    json content = json::array();
    for (const engine::SampleResult& r : logprobs) {
      const std::string piece = tokenizer_.token_to_piece(r.token, true);
      json top = json::array();
      for (const engine::TokenLogprob& t : r.top) {
        const std::string p = tokenizer_.token_to_piece(t.id, true);
        top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece},
                         {"logprob", r.logprob.value_or(0.0f)},
                         {"bytes", bytes_of(piece)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const engine::SampleResult& r : logprobs) {
    const std::string piece = tokenizer_.token_to_piece(r.token, true);
    tokens.push_back(piece);
    token_logprobs.push_back(r.logprob.value_or(0.0f));
    // As vLLM: the sampled token is always among its top_logprobs.
    json top = json::object();
    for (const engine::TokenLogprob& t : r.top)
      top[tokenizer_.token_to_piece(t.id, true)] = t.logprob;
    top[piece] = r.logprob.value_or(0.0f);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

json ResponseWriter::echo_logprobs_json(const Echo& echo,
                                        std::span<const engine::SampleResult> logprobs,
                                        size_t& offset) const {
  if (!want_logprobs_ || !echo.logprobs) return logprobs_json(logprobs, offset);
  const std::vector<engine::SampleResult>& prompt = *echo.logprobs;
  // A prompt token's offset is where its text starts in echo.text: the pieces before it, less the
  // leading space an SPM tokenizer's decode strips (the first piece's, or the second's after
  // BOS); clamped to the text for a prompt that does not decode to itself (control tokens
  // written in it).
  std::vector<TokenId> ids;
  for (const engine::SampleResult& r : prompt) ids.push_back(r.token);
  size_t pieces = 0;
  for (TokenId id : ids) pieces += tokenizer_.token_to_piece(id).size();
  const size_t stripped = pieces - std::min(pieces, tokenizer_.decode(ids).size());
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  size_t before = 0;
  for (const engine::SampleResult& r : prompt) {
    const std::string piece = tokenizer_.token_to_piece(r.token, true);
    tokens.push_back(piece);
    offsets.push_back(std::min(echo.text.size(), before - std::min(before, stripped)));
    before += tokenizer_.token_to_piece(r.token).size();
    if (!r.logprob) {  // the first token: nothing came before it
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(*r.logprob);
    json top = json::object();
    for (const engine::TokenLogprob& t : r.top)
      top[tokenizer_.token_to_piece(t.id, true)] = t.logprob;
    top[piece] = *r.logprob;
    top_logprobs.push_back(std::move(top));
  }
  offset = echo.text.size();
  json own = logprobs_json(logprobs, offset);
  auto append = [&own](json& head, const char* key) {
    for (json& v : own[key]) head.push_back(std::move(v));
    return std::move(head);
  };
  return {{"tokens", append(tokens, "tokens")},
          {"token_logprobs", append(token_logprobs, "token_logprobs")},
          {"top_logprobs", append(top_logprobs, "top_logprobs")},
          {"text_offset", append(offsets, "text_offset")}};
}

json ResponseWriter::response(const std::vector<ChoiceState>& choices,
                              const UsageTotals& usage) const {
  json out = base(kind_ == ApiKind::kChat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    size_t offset = 0;
    json choice = {{"index", i}};
    json finish_reason = finish_reason_json(c.finish);
    if (kind_ == ApiKind::kChat && tool_calls_.format != ToolCallFormat::kNone) {
      ParsedToolCalls parsed = parse_tool_calls(tool_calls_, c.text, cut_off(c.finish));
      json message = {{"role", "assistant"},
                      {"content", parsed.content ? json(*parsed.content) : json(nullptr)}};
      if (!parsed.calls.empty()) {
        json calls = json::array();
        for (const ToolCall& call : parsed.calls) calls.push_back(tool_call_json(call));
        message["tool_calls"] = std::move(calls);
        if (!cut_off(c.finish)) finish_reason = "tool_calls";
      }
      choice["message"] = std::move(message);
    } else if (kind_ == ApiKind::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.echo ? c.echo->text + c.text : c.text;
    }
    choice["logprobs"] = c.echo ? echo_logprobs_json(*c.echo, c.logprobs, offset)
                                : logprobs_json(c.logprobs, offset);
    choice["finish_reason"] = std::move(finish_reason);
    choice["stop_reason"] = stop_reason_json(c.finish);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage.to_json();
  return out;
}

json ResponseWriter::role_chunk(int32_t index) const {
  json out = base("chat.completion.chunk");
  out["choices"] = json::array({{{"index", index},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  return out;
}

json ResponseWriter::delta_chunk(int32_t index, const std::string& text,
                                 std::span<const engine::SampleResult> logprobs,
                                 const std::optional<engine::Finish>& finish, size_t& offset,
                                 const Echo* echo) const {
  json choice = {{"index", index}};
  if (kind_ == ApiKind::kChat) {
    choice["delta"] = text.empty() && finish ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = echo ? echo->text + text : text;
  }
  choice["logprobs"] = echo               ? echo_logprobs_json(*echo, logprobs, offset)
                       : logprobs.empty() ? json(nullptr)
                                          : logprobs_json(logprobs, offset);
  choice["finish_reason"] = finish_reason_json(finish);
  if (finish) choice["stop_reason"] = stop_reason_json(finish);
  json out = base(kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array({std::move(choice)});
  return out;
}

std::vector<json> ResponseWriter::tool_delta_chunks(ChoiceState& choice, int32_t index,
                                                    const std::string& text,
                                                    std::span<const engine::SampleResult> logprobs,
                                                    const std::optional<engine::Finish>& finish,
                                                    size_t& offset) const {
  ToolCallParser& parser = *choice.tool_parser;
  ToolCallDelta delta = parser.push(text);
  if (finish) {
    ToolCallDelta rest = parser.finish(cut_off(finish));
    delta.content += rest.content;
    for (ToolCall& call : rest.calls) delta.calls.push_back(std::move(call));
  }
  std::vector<json> deltas;
  if (!delta.content.empty() || (!logprobs.empty() && delta.calls.empty())) {
    deltas.push_back({{"content", delta.content}});
  }
  const size_t first_index = parser.num_calls() - delta.calls.size();
  for (size_t i = 0; i < delta.calls.size(); ++i) {
    const ToolCall& call = delta.calls[i];
    const size_t call_index = first_index + i;
    deltas.push_back(
        {{"tool_calls", json::array({{{"index", call_index},
                                      {"id", call.id},
                                      {"type", "function"},
                                      {"function", {{"name", call.name}, {"arguments", ""}}}}})}});
    deltas.push_back(
        {{"tool_calls",
          json::array({{{"index", call_index}, {"function", {{"arguments", call.arguments}}}}})}});
  }
  if (deltas.empty() && finish) deltas.push_back(json::object());
  std::vector<json> chunks;
  for (size_t i = 0; i < deltas.size(); ++i) {
    json c = {{"index", index}, {"delta", std::move(deltas[i])}};
    c["logprobs"] = i == 0 && !logprobs.empty() ? logprobs_json(logprobs, offset) : json(nullptr);
    const bool last = i + 1 == deltas.size();
    c["finish_reason"] = nullptr;
    if (last && finish) {
      c["finish_reason"] = parser.num_calls() > 0 && !cut_off(finish) ? json("tool_calls")
                                                                      : finish_reason_json(finish);
      c["stop_reason"] = stop_reason_json(finish);
    }
    json out = base("chat.completion.chunk");
    out["choices"] = json::array({std::move(c)});
    chunks.push_back(std::move(out));
  }
  return chunks;
}

json ResponseWriter::usage_chunk(const UsageTotals& usage) const {
  json out = base(kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage.to_json();
  return out;
}

json model_card(const ModelInfo& model, const std::string& name) {
  return json{{"id", name},
              {"object", "model"},
              {"created", unix_seconds()},
              {"owned_by", "sieve"},
              {"root", model.served_name},
              {"parent", nullptr},
              {"max_model_len", model.context_length},
              // sieve's own: the shape a request's kv_policy may name (layers:, heads:@kv=).
              {"sieve", {{"num_layers", model.num_layers}, {"num_kv_heads", model.num_kv_heads}}}};
}

json model_list(const ModelInfo& model) {
  json cards = json::array({model_card(model, model.served_name)});
  for (const std::string& alias : model.aliases) cards.push_back(model_card(model, alias));
  return {{"object", "list"}, {"data", std::move(cards)}};
}

json tokenize_response(const std::vector<TokenId>& ids, int64_t context_length) {
  return {{"count", ids.size()}, {"max_model_len", context_length}, {"tokens", ids}};
}

json detokenize_response(const std::string& text) { return {{"prompt", text}}; }

}  // namespace sieve::server
