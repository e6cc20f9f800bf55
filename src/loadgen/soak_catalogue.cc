// The soak's requests (loadgen/soak.h): the catalogue of greedy requests, their next turns and
// their JSON bodies.
#include <fmt/format.h>

#include "loadgen/soak.h"

namespace sieve::loadgen {

nlohmann::json SoakRequest::body() const {
  nlohmann::json body = {{"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"temperature", 0.0},
                         {"max_tokens", max_tokens}};
  if (endpoint == ApiEndpoint::kChat) {
    body["messages"] = nlohmann::json::array();
    if (earlier) {
      body["messages"].push_back({{"role", "user"}, {"content", earlier->prompt}});
      body["messages"].push_back({{"role", "assistant"}, {"content", earlier->answer}});
    }
    body["messages"].push_back({{"role", "user"}, {"content", prompt}});
  } else {
    body["prompt"] = earlier ? earlier->prompt + earlier->answer + prompt : prompt;
  }
  if (n > 1) body["n"] = n;
  if (logprobs) {
    if (endpoint == ApiEndpoint::kChat) {
      body["logprobs"] = true;
      body["top_logprobs"] = 2;
    } else {
      body["logprobs"] = 2;
    }
  }
  if (!stop.empty()) body["stop"] = stop;
  if (!kv_policy.empty()) body["kv_policy"] = kv_policy;
  return body;
}

std::string SoakRequest::label() const {
  std::string out = endpoint == ApiEndpoint::kChat ? "chat" : "completions";
  if (earlier) out += " next turn";
  out += fmt::format(" max_tokens={}", max_tokens);
  if (n > 1) out += fmt::format(" n={}", n);
  if (logprobs) out += " logprobs";
  if (!stop.empty()) out += " stop";
  if (!kv_policy.empty()) out += " " + kv_policy;
  return out;
}

std::vector<SoakRequest> soak_catalogue(const ModelShape& shape) {
  // Stories for a TinyStories model; the longer ones (~100+ tokens on a small vocabulary) are
  // long enough for the budgets below to drop keys.
  static const std::vector<std::string> kPrompts = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree and",
      "Tom had a small dog called Max. Every morning they walked to the river and looked at the "
      "fish. Max liked to bark at the ducks, and Tom liked to throw stones into the water. One "
      "day the sky turned dark and",
      "The sun was hot and the bird was thirsty.",
      "Sam and Anna wanted to build a big castle of sand on the beach. They got a bucket and a "
      "spade and started to dig. The sea came closer and closer. Anna said, \"We need to be "
      "quick!\" Sam laughed and said,",
  };
  // Every policy that needs no calibration profile (lserve with f=0 has no streaming heads); the
  // compositions name the first KV heads and layers the model has.
  const std::string kv_heads = shape.num_kv_heads >= 2 ? "0+1" : "0";
  const std::string layers =
      shape.num_layers >= 3   ? "layers:full@0-1,(h2o:B=32,W=16)@2,rest=snapkv:B=32,W=16"
      : shape.num_layers == 2 ? "layers:(h2o:B=32,W=16)@1,rest=snapkv:B=32,W=16"
                              : "layers:(h2o:B=32,W=16)@0";
  const std::vector<std::string> kPolicies = {
      "full",
      "streaming:S=4,W=32",
      "h2o:B=32,W=16",
      "snapkv:B=32,W=16",
      "pyramidkv:B=32,W=16",
      "adakv:B=32,W=16",
      "fastgen",
      "quest:K=2",
      "lserve:K=2,f=0",
      "layerwise:L=2,rest=snapkv:B=32,W=16",
      "heads:(streaming:S=4,W=32)@kv=" + kv_heads + ",rest=full",
      layers,
  };
  std::vector<SoakRequest> catalogue;
  const size_t count = 2 * kPolicies.size();
  for (size_t i = 0; i < count; ++i) {
    SoakRequest r;
    r.endpoint = i < kPolicies.size() ? ApiEndpoint::kCompletions : ApiEndpoint::kChat;
    r.prompt = kPrompts[i % kPrompts.size()];
    r.max_tokens = static_cast<int32_t>(24 + (i * 13) % 48);
    r.n = i % 4 == 1 ? 2 : 1;
    r.logprobs = i % 3 == 0;
    if (i % 5 == 2) r.stop = {".", "\n"};
    r.kv_policy = kPolicies[i % kPolicies.size()];
    catalogue.push_back(std::move(r));
  }
  return catalogue;
}

SoakRequest next_turn(const SoakRequest& first, std::string answer, size_t k) {
  SoakRequest next = first;
  next.earlier = SoakRequest::EarlierTurn{.prompt = first.prompt, .answer = std::move(answer)};
  next.prompt =
      first.endpoint == ApiEndpoint::kChat ? "And then what did they do?" : " The next day, they";
  next.n = k % 3 == 1 ? 2 : 1;
  next.logprobs = k % 2 == 0;
  next.stop.clear();
  return next;
}

}  // namespace sieve::loadgen
