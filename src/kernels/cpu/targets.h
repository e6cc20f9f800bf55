#pragma once
// Internal to src/kernels: the target each dispatch table (one per translation unit of
// per-target code) resolves to right now. They always agree; the tests check that forcing a
// target switches every table.
#include <string_view>

namespace sieve::kernels {

std::string_view matmul_target_name();            // cpu/matmul.cc
std::string_view vec_ops_target_name();           // cpu/vec_ops.cc
std::string_view attention_scores_target_name();  // cpu/attention_scores.cc

}  // namespace sieve::kernels
