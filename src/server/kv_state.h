#pragma once
// GET /v1/kv/state: a JSON snapshot of the KV cache for a live dashboard (the web UI polls it).
// The engine copies the numbers out between two steps (engine/kv_snapshot.h); this file only
// turns them into JSON and reads the query string. Every field:
//
//   time              unix seconds (fractional) when the engine took the snapshot: at the step
//                     boundary after the ask, or, while the overview is polled (within 3 s of
//                     the last poll), at the end of the latest step (engine/kv_snapshot.h)
//   model             the served model name
//   kv_dtype          "f32" | "f16" | "q8" | "q4" (--kv-dtype)
//   page_tokens       tokens per page
//   bytes_per_page    bytes of K and V one page holds, all layers and KV heads, in kv_dtype (and
//                     the precise heads' f16 rows)
//   precise_heads     [{layer, kv_head}] whose dense rows q8 / q4 pages also keep in f16
//                     (--no-precise-kv-heads: none); empty for f32 / f16
//   pool              pages_total; pages_used (reference count > 0); pages_free (reference
//                     count 0, cached-free included; used + free = total); pages_cached
//                     (published in the prefix cache, in use or free); pages_cached_free (free
//                     but still reusable by a prefix hit until evicted)
//   requests          running, waiting: sequences, as vllm:num_requests_running/_waiting count
//                     them (a request with n samples is n sequences once forked)
//   sequences         one entry per live sequence (sample), in admission order:
//     id                the response id the client got ("cmpl-…" / "chatcmpl-…"); the n samples
//                       of a request, and a completions request's several prompts, share it
//     index             the choice index in that response (prompt p, sample i: p * n + i)
//     policy            the kv_policy it runs, canonical ("snapkv:B=64,W=32,P=7,pool=max"),
//                       "full" when dense
//     state             "waiting" | "preempted" (queued again, to be recomputed) | "prefill" |
//                       "decode"
//     prompt_tokens, generated_tokens, context_tokens (their sum)
//     computed_tokens   tokens with K/V in the cache (0 while waiting or preempted; the token
//                       sampled last is computed by the next step)
//     pages_held        pages it references, shared ones included; so sum(pages_held) >=
//                       pool.pages_used, equal when no page is shared
//     pages_shared      of those, pages another sequence references too (prefix-cache hits,
//                       n > 1 samples before they diverge)
//     pages_dense       ceil(computed_tokens / page_tokens): what it would hold dense (a dense
//                       sequence holds exactly this; a compressed one usually fewer)
//     compressed        its streams own their slices: a policy dropped keys or selects pages
//     attention_recovery  where the policy scores keys (snapkv, pyramidkv, adakv, h2o: the kept
//                       keys' share of the observation window's attention; fastgen: of its
//                       profiling rows'), the mean over scored heads at the last compression;
//                       null where nothing is measured (full, streaming, quest, before the
//                       prompt's compression)
//   finished          the sequences that finished last, newest first: at most 16, none older than
//                     60 s (engine::KvSnapshots::kMaxFinished, kFinishedWindow), so that a request
//                     answered between two polls is still seen. Each has the fields of a sequence
//                     above, as they stood at its last step, its pages not yet returned, except
//                     state; instead:
//     finish_reason     "stop" | "length" | "cancelled" (the client went away or stopped it)
//     finished_at       unix seconds (fractional)
//   heads             only with ?request=ID (and optionally &index=N, default the lowest live
//                     index of ID, else the lowest finished one): what each KV head of that
//                     sequence keeps, live or, once finished, as it stood at its last step
//     request, index, layers, kv_heads
//     finish_reason     null while it lives; once finished, its entry's in `finished`
//     kept              [layers][kv_heads] of
//       kind              "full" | "window" | "snapkv" | "adakv" | "heavy_hitters" | "quest" |
//                         "fastgen:<choice>" (special, special+punct, special+punct+local,
//                         special+punct+local+frequent, full; "fastgen:pending" until decided)
//       tokens            keys the head holds
//       pages_read        quest heads: pages its latest selection read per decode row (sink and
//                         window pages included); null: the head reads every key it keeps
//       recovery          the head's own attention_recovery; null where not measured
//
// ?request= naming no sequence that lives or that `finished` lists (unknown, or finished too long
// ago) is a 404 in the OpenAI error shape; a malformed index a 400.
#include <optional>
#include <string>
#include <string_view>

#include "engine/kv_snapshot.h"
#include "server/api_error.h"

namespace sieve::server {

// The query string of GET /v1/kv/state as an engine query; a 400 ApiError when it is malformed.
// Unknown parameters are ignored (a browser's cache buster).
struct KvStateQuery {
  engine::KvSnapshotQuery query;
  std::optional<ApiError> error;
};
KvStateQuery parse_kv_state_query(std::string_view query_string);

// The response body; a 404 ApiError when the query named a sequence the snapshot lacks.
struct KvStateResponse {
  int status = 200;
  json body;
};
KvStateResponse kv_state_response(const engine::KvSnapshot& snapshot,
                                  const engine::KvSnapshotQuery& query,
                                  const std::string& model_name);

}  // namespace sieve::server
