#pragma once
// Internal to src/kernels: the target each dispatch table (one per translation unit of
// per-target code) resolves to right now. They always agree; the tests check that forcing a
// target switches every table. And tuning that depends on the CPU beyond its target.
#include <cstdint>
#include <string_view>

namespace sieve::kernels {

// How far ahead (bytes, 0: not at all) decode prefetches packed F16 / BF16 / F32 weights into
// L2, by CPU vendor, measured from DRAM on the two kinds of machine this project runs on:
// - Intel (2-core Xeon, AVX-512): the hardware prefetchers alone read one stream per thread at
//   65-75% of the memory bandwidth probe's rate, 8 KiB ahead at 88-99% (4096-dim F16 model,
//   1 and 2 threads);
// - AMD (Zen 4): one thread read 23-25 GB/s without, 17-20 prefetching 2-16 KiB ahead.
int64_t packed_float_prefetch_bytes();

// Whether the packed quantized tiles (32-value blocks and super-blocks) prefetch their blocks 8 KiB
// ahead into L2:
// - Intel (2-core Xeon): Q4_K_M decode 14.2-14.9 / 27.2-30.3 GB/s (1 / 2 threads) with, 11.0-11.5
//   / 20.6-22.8 without (super-blocks then laid out with all scales first);
// - AMD (Zen 4): a model's decode read more of the adjacent bandwidth without: Q6_K, blocks in
//   the order a tile reads them, 83-91% against 69-74%; Q4_0 92.6% against 88.1%, Q5_1 94.3%
//   against 84.5% (medians of 5).
bool packed_block_prefetch();

// Whether decode attention over one kv head's pages (every other 4 KiB slice of a layer's pool)
// prefetches the K and V slices two pages ahead:
// - AMD (Zen 4): a 1024-key stream evicted from the caches took ~70-110 us without, ~45 with;
// - Intel (2-core Xeon): 0.060-0.064 ms without against 0.066-0.075 with, prefetching into L1
//   or L2 (attention_bench EngineDecodePerHead, f32, 1024 keys, threads:1).
bool one_head_kv_prefetch();

std::string_view matmul_target_name();            // cpu/matmul.cc
std::string_view vec_ops_target_name();           // cpu/vec_ops.cc
std::string_view attention_scores_target_name();  // cpu/attention_scores.cc

}  // namespace sieve::kernels
