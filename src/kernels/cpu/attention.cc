// paged_attention(): per-target entry points (compiled once per Highway target) and dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/attention-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {

void PagedAttentionImpl(const PagedKv& kv, const AttentionQuery& q, const AttentionOutput& out,
                        ThreadPool& pool) {
  attention::PagedAttention(kv, q, out, pool);
}
const char* AttentionTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cassert>

#include "kernels/cpu/attention_bf16.h"

namespace sieve::kernels {

HWY_EXPORT(PagedAttentionImpl);
HWY_EXPORT(AttentionTargetName);

void paged_attention(const PagedKv& kv, const AttentionQuery& q, const AttentionOutput& out,
                     ThreadPool& pool) {
  assert(is_kv_dtype(kv.dtype));
  assert(!is_block_kv_dtype(kv.dtype) || kv.head_dim % block_elems(kv.dtype) == 0);
  HWY_DYNAMIC_DISPATCH(PagedAttentionImpl)(kv, q, out, pool);
}

std::string_view paged_attention_target_name() {
  return HWY_DYNAMIC_DISPATCH(AttentionTargetName)();
}

std::optional<PrefillDots> parse_prefill_dots(std::string_view name) {
  if (name == "f32") return PrefillDots::kF32;
  if (name == "bf16-pv") return PrefillDots::kBf16Pv;
  if (name == "bf16") return PrefillDots::kBf16;
  return std::nullopt;
}

std::string_view prefill_dots_name(PrefillDots dots) {
  switch (dots) {
    case PrefillDots::kBf16Pv:
      return "bf16-pv";
    case PrefillDots::kBf16:
      return "bf16";
    default:
      return "f32";
  }
}

bool bf16_attention_supported() {
  return bf16::supported() && paged_attention_target_name().starts_with("AVX3");
}

}  // namespace sieve::kernels
#endif  // HWY_ONCE
