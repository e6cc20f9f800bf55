#include "server/kv_state.h"

#include <fmt/format.h>

#include <charconv>

namespace sieve::server {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded: '+' is a space, %XX a byte; a broken escape stays as is.
std::string url_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex_value(text[i + 1]) >= 0 &&
               hex_value(text[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(text[i + 1]) * 16 + hex_value(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

json optional_number(const std::optional<float>& value) {
  return value ? json(*value) : json(nullptr);
}

double unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// The fields a live and a finished sequence share.
json sequence_json(const engine::KvSequenceSnapshot& s) {
  return {{"id", s.label_id},
          {"index", s.choice},
          {"policy", s.policy},
          {"prompt_tokens", s.num_prompt_tokens},
          {"generated_tokens", s.num_generated_tokens},
          {"context_tokens", s.num_context_tokens},
          {"computed_tokens", s.num_computed_tokens},
          {"pages_held", s.num_pages_held},
          {"pages_shared", s.num_pages_shared},
          {"pages_dense", s.num_pages_dense},
          {"compressed", s.compressed},
          {"attention_recovery", optional_number(s.attention_recovery)}};
}

}  // namespace

KvStateQuery parse_kv_state_query(std::string_view query_string) {
  KvStateQuery out;
  while (!query_string.empty()) {
    const size_t amp = query_string.find('&');
    const std::string_view pair = query_string.substr(0, amp);
    query_string = amp == std::string_view::npos ? "" : query_string.substr(amp + 1);
    const size_t eq = pair.find('=');
    const std::string key = url_decode(pair.substr(0, eq));
    const std::string value = eq == std::string_view::npos ? "" : url_decode(pair.substr(eq + 1));
    if (key == "request") {
      if (value.empty()) {
        out.error = ApiError{.message = "'request' must name a response id, e.g. cmpl-…",
                             .param = "request"};
        return out;
      }
      out.query.label_id = value;
    } else if (key == "index") {
      int32_t index = -1;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), index);
      if (ec != std::errc() || end != value.data() + value.size() || index < 0) {
        out.error =
            ApiError{.message = fmt::format("'index' must be a choice index >= 0, got '{}'", value),
                     .param = "index"};
        return out;
      }
      out.query.choice = index;
    }
  }
  if (out.query.choice && !out.query.label_id) {
    out.error = ApiError{.message = "'index' needs 'request' (the response id it belongs to)",
                         .param = "index"};
  }
  return out;
}

KvStateResponse kv_state_response(const engine::KvSnapshot& snapshot,
                                  const engine::KvSnapshotQuery& query,
                                  const std::string& model_name) {
  if (query.label_id && !snapshot.heads) {
    const std::string which = query.choice
                                  ? fmt::format("'{}' index {}", *query.label_id, *query.choice)
                                  : fmt::format("'{}'", *query.label_id);
    const ApiError error{.status = 404,
                         .message = fmt::format("no running, waiting or recently finished request "
                                                "{} (one that finished is kept as long as the "
                                                "state lists it under 'finished')",
                                                which),
                         .type = "NotFoundError",
                         .param = "request",
                         .code = "request_not_found"};
    return {.status = 404, .body = error.to_json()};
  }
  json sequences = json::array();
  for (const engine::KvSequenceSnapshot& s : snapshot.sequences) {
    json entry = sequence_json(s);
    entry["state"] = std::string(engine::phase_name(s.phase));
    sequences.push_back(std::move(entry));
  }
  json finished = json::array();
  for (const engine::KvFinishedSnapshot& f : snapshot.finished) {
    json entry = sequence_json(f.sequence);
    entry["finish_reason"] = f.finish_reason;
    entry["finished_at"] = unix_seconds(f.finished_at);
    finished.push_back(std::move(entry));
  }
  json precise_heads = json::array();
  for (const auto& [layer, kv_head] : snapshot.precise_heads)
    precise_heads.push_back({{"layer", layer}, {"kv_head", kv_head}});
  json body = {{"time", unix_seconds(snapshot.taken_at)},
               {"model", model_name},
               {"kv_dtype", snapshot.kv_dtype},
               {"page_tokens", snapshot.page_size},
               {"bytes_per_page", snapshot.bytes_per_page},
               {"precise_heads", precise_heads},
               {"precise_spare_areas",
                {{"total", snapshot.num_precise_spare_areas},
                 {"free", snapshot.num_precise_spare_areas_free},
                 {"copies_dropped", snapshot.num_precise_copies_dropped}}},
               {"pool",
                {{"pages_total", snapshot.num_pages},
                 {"pages_used", snapshot.num_pages_used},
                 {"pages_free", snapshot.num_pages_free},
                 {"pages_cached", snapshot.num_pages_cached},
                 {"pages_cached_free", snapshot.num_pages_cached_free},
                 {"pages_parked", snapshot.num_pages_parked},
                 {"parked_sequences", snapshot.num_parked_sequences}}},
               {"requests", {{"running", snapshot.num_running}, {"waiting", snapshot.num_waiting}}},
               {"sequences", std::move(sequences)},
               {"finished", std::move(finished)}};
  if (snapshot.heads) {
    const engine::KvSnapshot::Heads& h = *snapshot.heads;
    json kept = json::array();
    for (int32_t layer = 0; layer < h.num_layers; ++layer) {
      json row = json::array();
      for (int32_t head = 0; head < h.num_kv_heads; ++head) {
        const engine::KvHeadSnapshot& k =
            h.heads[static_cast<size_t>(layer) * h.num_kv_heads + head];
        row.push_back({{"kind", k.kind},
                       {"tokens", k.num_tokens},
                       {"pages_read", k.num_pages_read ? json(*k.num_pages_read) : json(nullptr)},
                       {"recovery", optional_number(k.recovery)}});
      }
      kept.push_back(std::move(row));
    }
    body["heads"] = {{"request", h.label_id},
                     {"index", h.choice},
                     {"layers", h.num_layers},
                     {"kv_heads", h.num_kv_heads},
                     {"kept", std::move(kept)},
                     {"finish_reason", h.finish_reason ? json(*h.finish_reason) : json(nullptr)}};
  }
  return {.status = 200, .body = std::move(body)};
}

}  // namespace sieve::server
