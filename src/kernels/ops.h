#pragma once
// The numerical op interface. Kernels see pointers, shapes and dtypes only: never a request,
// a sequence or a scheduler type. Each op has a scalar reference in namespace `ref` (plain
// loops, the definition of correct) and a SIMD implementation chosen at run time for the
// best instruction set the CPU has (Highway dynamic dispatch: AVX2, AVX-512, ...).
// The model does not call these free functions: it runs them through a kernels::Backend
// (backend.h), whose CPU implementation wraps them; a CUDA backend will be a second
// implementation of that interface.
//
// Weight block layouts are exactly ggml's (GGUF):
//   F32   4 bytes/value            F16  IEEE half          BF16  upper half of an f32
//   Q8_0  blocks of 32: { f16 d; int8 q[32]; }           (34 bytes)  x = d * q
//   Q4_0  blocks of 32: { f16 d; uint8 qs[16]; }          (18 bytes)
//         x[j] = d * ((qs[j] & 0xF) - 8),  x[j + 16] = d * ((qs[j] >> 4) - 8)
// and the other ggml weight types (block structs and value formulas in kernels/blocks.h):
//   Q4_1 (32 / 20 bytes), Q5_0 (32 / 22), Q5_1 (32 / 24), IQ4_NL (32 / 18),
//   K-quants in super-blocks of 256: Q2_K (84), Q3_K (110), Q4_K (144), Q5_K (176), Q6_K (210),
//   IQ4_XS (256 / 136).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sieve {
class ThreadPool;
}

namespace sieve::kernels {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,  // blocks of 32
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_XS,  // super-blocks of 256
};
// Every dtype, in enum order (for loops in tests, parsers and error messages).
inline constexpr DType kAllDTypes[] = {
    DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,   DType::kQ4_0,
    DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K,
    DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,   DType::kIQ4_XS,
};
std::string_view to_string(DType dtype);
int64_t block_elems(DType dtype);                 // 1 for float types, 32 or 256 for quantized ones
size_t block_bytes(DType dtype);                  // 4, 2, 2, 34, 18, ...
bool is_quantized(DType dtype);                   // block_elems > 1
size_t row_bytes(DType dtype, int64_t num_cols);  // num_cols must be a multiple of block_elems

// A row-major weight matrix [rows][cols] stored in `dtype`; a row is row_bytes(dtype, cols).
struct MatrixView {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // Optional: the same matrix repacked by pack_for_matmul(), which matmul() uses instead of
  // `data` where packed_matmul_supported(dtype). The owner keeps it alive. `data` may then be
  // null (a matrix stacked from others, whose stacked bytes were only needed for packing:
  // model/llama.cc).
  const void* packed = nullptr;
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

// Weights repacked for matmul on x86 CPUs with AVX-512, where packed_matmul_supported(dtype):
// F16 and BF16 as cpu/matmul_float_avx512.h's packed groups (64 rows, column by column, the same
// size rounded up to 64 rows: one sequential stream per thread in decode, and each output's sums
// in column order whatever the batch); with VNNI, the quantized types:
// Q8_0, the 32-value blocks Q4_0, Q4_1, Q5_0, Q5_1 and
// IQ4_NL, Q4_K, Q5_K and Q6_K. Groups of 16 rows (the last one padded with zero rows), and per
// group and block the 16 rows' scales side by side, then their values interleaved so that one
// 64-byte load holds 4 columns of all 16 rows (one int32 lane per row), the operand of vpdpbusd
// against 4 broadcast activation bytes: matmul needs no horizontal sums and decodes each weight
// once for up to 8 activation rows. Q8_0, per block 544 bytes:
//   16 f16 scales (row order), then for k = 0..7, for row r = 0..15: the 4 bytes of columns
//   4k..4k+3 of row r, each as w + 128 (u8);
// the 32-value blocks as cpu/matmul_vnni_small_blocks.h's packed_block_bytes() (nibbles stay
// packed), the same size as the blocks, rounded up to 16 rows; Q4_K as
// cpu/matmul_super_blocks_vnni.h's kPackedQ4_KBytes, 2.8% more (scales and mins as bytes), Q5_K
// as its kPackedQ5_KBytes (+2.3%), Q6_K as its kPackedQ6_KBytes, the same size.
//
// The bytes start on a cache line: the packed tiles load whole 64-byte lines, and from the 16
// bytes past one that malloc gives, every load spans two (kernels_bench: L3-resident packed
// decode 20-40% slower). Copies of 2 MiB or more start on a 2 MiB boundary and ask for
// transparent huge pages (madvise), so that decode, which streams all of them every token, does
// not walk the page tables every 4 KiB.
void* allocate_packed(size_t bytes);
void free_packed(void* p, size_t bytes);
template <class T>
struct PackedAllocator {
  using value_type = T;
  PackedAllocator() = default;
  template <class U>
  PackedAllocator(const PackedAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator
  T* allocate(size_t n) { return static_cast<T*>(allocate_packed(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { free_packed(p, n * sizeof(T)); }
  friend bool operator==(const PackedAllocator&, const PackedAllocator&) { return true; }
};
using PackedBytes = std::vector<uint8_t, PackedAllocator<uint8_t>>;
bool packed_matmul_supported(DType dtype);
// Where packed_matmul_supported(w.dtype); on `pool`'s threads when given (load time: ~0.2 s per
// 250 MB of weights on one thread here).
PackedBytes pack_for_matmul(const MatrixView& w, ThreadPool* pool = nullptr);

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
