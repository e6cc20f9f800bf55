#pragma once
// The numerical op interface. Kernels see pointers, shapes and dtypes only: never a request,
// a sequence or a scheduler type. Each op has a scalar reference in namespace `ref` (plain
// loops, the definition of correct) and a SIMD implementation chosen at run time for the
// best instruction set the CPU has (Highway dynamic dispatch: AVX2, AVX-512, ...).
// The model does not call these free functions: it runs them through a kernels::Backend
// (backend.h), whose CPU implementation wraps them; a CUDA backend will be a second
// implementation of that interface.
//
// DType and its traits table (names, block layouts, GGUF ids): dtype.h.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::kernels {

// A backend's own form of a weight matrix, made by its Backend::prepare_weights() and owned by
// that backend: opaque to everyone else (the CPU backend's is a repacking, cpu/pack.h; a device
// backend's would be its copy in device memory).
struct PreparedMatrix;

// A row-major weight matrix [rows][cols] stored in `dtype`; a row is row_bytes(dtype, cols).
struct MatrixView {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // Optional: the backend's prepared form of the same matrix, which only the backend that made
  // it reads (its matmul, instead of `data`). `data` may then be null (a matrix stacked from
  // others, whose stacked bytes were only needed to prepare it: model/llama.cc).
  const PreparedMatrix* prepared = nullptr;
};

// --- conversions (scalar, exact ggml rounding) ---
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even, NaN preserved
// f32 -> dtype and back for one row of n values (n a multiple of block_elems(dtype)).
void quantize_row(DType dtype, const float* src, void* dst, int64_t n);
void dequantize_row(DType dtype, const void* src, float* dst, int64_t n);
// A matmul's activations -> Q8_0 blocks of 32 (n a multiple of 32) as ggml's x86 CPU backend
// quantizes them (its AVX2 / AVX-512 quantize_row_q8_0 and quantize_row_q8_1, not the reference
// quantizer that writes weights, which quantize_row(kQ8_0) is): per block d = max|x| / 127, kept
// as f16 (d[b] is that f16 value as f32), and q = x * (127 / max|x|) rounded half to even. With
// `s` (may be null) also Q8_1's sum term s[b] = f16(d * sum q) with d before its f16 rounding.
// Differs from quantize_row(kQ8_0) (x * (1 / d), ties away from zero) only at ties and last-ulp
// cases, which activations from 4- and 5-bit embeddings (values k * d_w) hit often.
void quantize_activations_q8(const float* x, int64_t n, int8_t* q, float* d, float* s);

// --- matrix multiply ---
// y[i * w.rows + r] = sum_c x[i * w.cols + c] * w[r][c]   for i < num_x, r < w.rows.
// num_x == 1 is the decode (matrix-vector) path; larger num_x is prefill (matrix-matrix),
// which reads each weight row once for all x rows. Parallel over rows of w.
// For Q8_0 / Q4_0 weights, x is first quantized to Q8_0 blocks (as ggml does) and the dot
// products run in integers with one f32 scale per block.
void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool);

// Host memory for weights that are streamed every token (the CPU backend's packed copies,
// cpu/pack.h) and for measuring how fast such memory reads. The bytes start on a cache line: the
// packed tiles load whole 64-byte lines, and from the 16 bytes past one that malloc gives, every
// load spans two (kernels_bench: L3-resident packed decode 20-40% slower). Blocks of 2 MiB or
// more start on a 2 MiB boundary and ask for transparent huge pages (madvise), so that decode,
// which streams all of them every token, does not walk the page tables every 4 KiB.
void* allocate_packed(size_t bytes);
void free_packed(void* p, size_t bytes);

// --- vector ops (single-threaded; callers parallelise over rows/heads) ---
float dot(const float* a, const float* b, int64_t n);
void axpy(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x
// out = x / sqrt(mean(x^2) + eps) * weight
void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t n);
// gate = silu(gate) * up
void silu_mul(float* gate, const float* up, int64_t n);
// In place; returns the maximum (before exponentiation) and writes nothing else.
float softmax(float* x, int64_t n);
// In place, every head of head_dim values (a power of two) of num_rows contiguous rows of
// num_heads heads: x <- H x / sqrt(head_dim), H the Walsh–Hadamard matrix in Sylvester order
// (H[i][j] = (-1)^popcount(i & j)). Orthonormal and symmetric, so it is its own inverse, and
// rotating both q and k leaves q·k unchanged while spreading a channel outlier over all
// channels (what a quantized KV cache wants of its keys, paged_attention.h). Cost head_dim *
// log2(head_dim) adds per head.
void rotate_heads(float* x, int64_t num_rows, int64_t num_heads, int64_t head_dim);
// The wrapping sum of n words, read with the widest loads this CPU has and prefetched ahead into
// L2, as decode streams its weights: the memory bandwidth probe (eval/speed.h). A plain C++ sum
// draws less: 8-byte loads read ~20 GB/s from DRAM on two Xeon cores where 64-byte ones read
// 27-28, and 30-31 prefetched.
uint64_t sum_words(const uint64_t* words, int64_t n);
// `iterations` steps of 12 independent chains of vector FMAs (acc = acc x 0.9999 + 1e-6, chain
// i from i / 1024) in registers, with the widest vectors this CPU has: the f32 FMA peak probe
// (eval/speed.h) that prefill GFLOP/s are set against. Returns the chains' sum in lane 0 (in
// chain order); *flops gets the multiply-adds done x 2.
float fma_chains(int64_t iterations, double* flops);

namespace ref {
void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y);
float dot(const float* a, const float* b, int64_t n);
void axpy(float alpha, const float* x, float* y, int64_t n);
void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t n);
void silu_mul(float* gate, const float* up, int64_t n);
float softmax(float* x, int64_t n);
void rotate_heads(float* x, int64_t num_rows, int64_t num_heads, int64_t head_dim);  // in double
}  // namespace ref

// --- SIMD target selection ---
// Names of the SIMD targets compiled in and supported by this CPU, best first. On x86-64:
// "AVX3" (AVX-512), "AVX2", "SSE4", then the portable baseline any x86-64 runs: "SCALAR" when
// built with GCC < 12.3 (Highway disables "EMU128" there), else "EMU128".
std::vector<std::string> available_targets();
// The target the dispatched kernels run on now.
std::string_view active_target();
// Makes every kernel run on `target_name` (one of available_targets()); empty = best again.
// Returns false, changing nothing, for an unknown or unsupported name. For tests and
// benchmarks only: not thread-safe with kernels running concurrently.
bool force_target_for_testing(std::string_view target_name);

}  // namespace sieve::kernels
