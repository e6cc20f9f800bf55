#pragma once
// The KV dtypes the engine tests run over: stories260K in f32 (its head_dim 8 rules out q8 / q4,
// whose rows are blocks of 32), copy-lm (shared/models/copy: a trained llama, head_dim 32,
// 2 KV heads, the same vocabulary) in q8 and q4, and the evaluation model in q8. Each test that
// moves KV (copy-on-write forks, compaction, prefix caching, preemption) runs once per case.
#include <string>

#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "shared_data.h"

namespace sieve::engine {

struct KvDTypeCase {
  std::string name;
  std::string model;  // under shared/, or this repository with in_repo
  kernels::DType dtype = kernels::DType::kF32;
  bool in_repo = false;
  model::LoadedModel load() const {
    return model::load_model(
        {in_repo ? std::string(SIEVE_SOURCE_DIR) + "/" + model : testing::shared_path(model), ""});
  }
};

inline const KvDTypeCase kStoriesF32{"stories260K_f32", "models/stories260K.gguf",
                                     kernels::DType::kF32};
inline const KvDTypeCase kCopyLmQ8{"copylm_q8", "models/copy/copy-lm.gguf", kernels::DType::kQ8_0};
inline const KvDTypeCase kCopyLmQ4{"copylm_q4", "models/copy/copy-lm.gguf", kernels::DType::kQ4_1};
// The evaluation model in q8: its wired induction head is a precise stream (model/kv_cache.h),
// so dense pages carry an f16 copy of that head that forks, prefix hits, preemption and
// compaction must keep right.
inline const KvDTypeCase kEvalQ8Precise{"eval32k_q8_precise", "models/eval-32k.gguf",
                                        kernels::DType::kQ8_0, /*in_repo=*/true};

inline std::string kv_case_name(const ::testing::TestParamInfo<KvDTypeCase>& info) {
  return info.param.name;
}

}  // namespace sieve::engine
