#pragma once
// The engine's configuration, one struct passed down to every stage (engine/engine.h).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kernels/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "sparsity/calibration.h"
#include "speculative/speculative_config.h"

namespace sieve::engine {

struct EngineConfig {
  int32_t num_kv_pages = 0;  // 0: derived from kv_memory_bytes
  // The page pool in bytes; unset: default_kv_memory_bytes (sized from the model).
  std::optional<uint64_t> kv_memory_bytes;
  int32_t page_size = 16;
  int32_t max_batch_tokens = 512;
  // A request with a bounded sparse policy (streaming, snapkv, pyramidkv, h2o heads) is
  // compressed every this many prompt tokens (rounded up to pages and to its observation
  // window), so a long prompt holds at most its budget + one chunk; 0: once, after the prompt.
  int32_t sparse_prefill_chunk = 512;
  int32_t max_num_seqs = 64;
  int32_t max_queued = 1024;
  bool enable_prefix_caching = true;
  // Conversations on a compressed cache: a finished request with a sparse kv_policy leaves its
  // K/V parked (kv/kv_manager.h) for a next prompt that starts with its prompt + output, under
  // the same policy; parked pages are taken back before anyone is preempted, and together hold
  // at most this share of the pool (0: never parked).
  double max_parked_share = 0.5;
  // K/V element type (model/kv_cache.h): kF32; kF16 (half the KV memory and half the bytes
  // decode attention reads per key; rounding moves logprobs by ~1e-3); kQ8_0 / kQ4_1 (q8 / q4:
  // 0.27x / 0.16x of f32's bytes; the model's head_dim must be a multiple of 32, checked when
  // the engine is made). kv_memory_bytes counts real bytes: a q4 pool has ~3.2x the pages of an
  // f16 one.
  kernels::DType kv_dtype = model::kKvDefaultDType;
  // q8 / q4: keep the heads whose keys those bits round far worse than the others' in f16 too
  // (model::KvCache's precise streams, Model::precise_kv_streams; eval-32k's wired induction
  // head). Their f16 rows count in kv_memory_bytes.
  bool precise_kv_heads = true;
  // Which KV heads are streaming-like (`sieve calibrate`), for lserve and heads:...@profile=F.
  // Must be for this model (Model::fingerprint()); null: such policies are refused.
  std::shared_ptr<const sparsity::CalibrationProfile> calibration;
  // Speculative decoding for requests that do not say (speculative/speculative_config.h). Drafts
  // are verified exactly: greedy output equals plain decoding's token for token, and so does
  // sampled output for the same seed (see SpeculativeDriver::verify). Sequences with a sparse KV
  // policy decode without drafts (their windows move one token per step, which a k-token
  // verification step would not reproduce).
  //
  // draft_model: the engine loads speculative.model (when that is the method here) once, at
  // construction, on the target's backend, and refuses a draft whose vocabulary is not the
  // target's. Its KV pool mirrors the target's (the same page size and number of pages, see
  // engine/draft_model.h), and both come out of kv_memory_bytes: each page of the budget costs the
  // target's bytes plus the draft's. A request may ask for draft_model only with this file.
  speculative::SpeculativeConfig speculative;
  // The target model's file, for messages (a draft_model with another vocabulary); may be empty.
  std::string model_path;
};

// The default page pool's ceiling: the fixed default `sieve serve` had before the pool was sized
// from the model. A model whose full default pool is larger (a 7B model with f32 KV holds ~1k
// tokens in it) should be given --kv-memory from the memory the machine can spare.
inline constexpr uint64_t kDefaultKvMemoryCapBytes = 512ull << 20;

// The page pool when EngineConfig::kv_memory_bytes is unset: room for max_num_seqs sequences of
// the model's whole context each, in pages of the KV dtype, at most kDefaultKvMemoryCapBytes
// and at least one page. stories260K (5 layers x 4 KV heads x head_dim 8, f32 K and V, 20 KiB
// per 16-token page; context 512; 64 sequences): 64 x 32 pages = 40 MiB. Throws sieve::Error
// when the dtype cannot store the model's heads (KvCache::bytes_per_page).
uint64_t default_kv_memory_bytes(const model::ModelConfig& model, const EngineConfig& config);

}  // namespace sieve::engine
