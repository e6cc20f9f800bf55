#pragma once
// A backend: one device's memory and every op the forward pass runs on it. The model (src/model)
// is its only caller: it allocates its KV pages and scratch here, and runs embedding, matmuls,
// norms, RoPE, KV writes and attention through these calls, never through the free functions of
// ops.h. Like ops.h, it sees pointers, shapes and dtypes only: no request, sequence or scheduler
// type. A backend owns its parallelism (the CPU one its ThreadPool): callers pass no pool.
//
// Which backend runs is chosen once, when the model is loaded (model::LoadOptions::backend, a
// BackendOptions; the CLI's --device and --threads): make_backend() builds it, the model prepares
// its weights on it and keeps it (Model::backend()), and everyone who runs the model (the
// engine, eval, the CLI's bench and perplexity) runs on that one, so no code above src/model
// names a backend.
//
// Implementations: make_cpu_backend() (the Highway kernels of ops.h, paged_attention.h, ...,
// dispatched to the best SIMD target) and make_reference_backend() (the scalar ref:: functions,
// single-threaded; the definition of correct). tests/kernels/backend_ops_test.cc runs every op
// of every backend against the reference; a new backend is one line in its factory list there
// and one device name in make_backend().
//
// A CUDA backend implements this class: allocate() is device memory, upload() / download() are
// host <-> device copies, prepare_weights() uploads a weight matrix once, and each op is a
// kernel launch. Neither the forward pass nor anything above it changes when it is added.
//
// One caller at a time: ops of one backend must not run concurrently (the CPU backend's pool
// runs one loop at a time). A model is run by one engine thread; tests that share a loaded model
// between engines run them one after another.
//
// Memory rules:
// - Float pointers passed to ops, and the K/V pointers inside a PagedKv, are device memory: in
//   a DeviceBuffer from this backend's allocate(), or (CPU backends) any host memory. Only this
//   backend's ops and copies dereference them; the caller reads results through download().
// - Integer spans (token ids, positions, row offsets, block tables) and ops' small parameter
//   structs are host memory, read during the call; a device backend uploads what it needs.
// - A DeviceBuffer is owned by whoever holds it and must not outlive its backend. Weight views
//   returned by prepare_weights() stay valid as long as the backend and the original view do
//   (model::Model holds the backend its weights were prepared on). Backends that share a
//   memory read each other's buffers and views: every CPU backend and the reference read host
//   memory, so a model prepared on one CPU backend runs on another (the engine's, on its pool).
// - Ops return when their results may be read by the next op or by download(); a device backend
//   may queue work, as long as download() waits for it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kernels/attention_scores.h"
#include "kernels/ops.h"
#include "kernels/paged_attention.h"
#include "kernels/rope.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::kernels {

// Owns `bytes` bytes of one backend's memory; move-only. Zero-filled when allocated; on CPU
// backends host memory aligned to 64 bytes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        release_(std::exchange(other.release_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      release_ = std::exchange(other.release_, nullptr);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  friend class Backend;
  using ReleaseFn = void (*)(void* data);
  DeviceBuffer(void* data, size_t bytes, ReleaseFn release)
      : data_(data), bytes_(bytes), release_(release) {}
  void reset() {
    if (data_ && release_) release_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
  ReleaseFn release_ = nullptr;
};

// Rows of floats in device memory: row r starts at data + r * stride (stride in floats, >= the
// row length the op is given).
template <typename T>
struct Rows {
  T* data = nullptr;
  int64_t stride = 0;
  T* row(int64_t r) const { return data + r * stride; }
  operator Rows<const T>() const  // NOLINT(google-explicit-constructor): rows are readable
      requires(!std::is_const_v<T>) {
    return {data, stride};
  }
};

// observation_scores() over an attention job's query rows, after its attention.
struct ObservationOutput {
  int64_t num_keys = 0;
  float* scores = nullptr;  // [kv.num_kv_heads][num_keys]
  // > 0: only the job's last last_rows rows observe (a prompt chunk that ends on SnapKV's
  // window, scored in the chunk's own step instead of by Model::observe afterwards).
  int64_t last_rows = 0;
};
// One sequence's (or one KV head's stream's) attention, for paged_attention_batch().
struct AttentionJob {
  PagedKv kv;
  AttentionQuery query;
  AttentionOutput out;
  // Each needs out.row_lse; they run after the attention, on the same threads.
  std::span<const ObservationOutput> observations;
};

// The query rows an observation of `job` reads, and their log-sum-exps.
struct ObservedRows {
  AttentionQuery query;
  const float* row_lse = nullptr;
};
inline ObservedRows observed_rows(const AttentionJob& job, const ObservationOutput& o) {
  const auto num_q = static_cast<int64_t>(job.query.positions.size());
  const int64_t skip = o.last_rows > 0 && o.last_rows < num_q ? num_q - o.last_rows : 0;
  AttentionQuery query = job.query;
  query.q += skip * query.num_heads * job.kv.head_dim;
  query.positions = query.positions.subspan(static_cast<size_t>(skip));
  return {query, job.out.row_lse + skip * query.num_heads};
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Host threads its ops run on (the CPU backend's pool); 1 for the single-threaded reference.
  virtual int num_threads() const { return 1; }

  // --- memory ---
  virtual DeviceBuffer allocate(size_t bytes) = 0;                      // zero-filled
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;    // host -> device
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  // device -> host
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;      // device -> device
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Where a weight matrix's bytes lie. kMappedFile: pages of the read-only mapped model file,
  // which a backend that made its own copy may hand back to the OS (a later read brings them
  // back from the file); kHostMemory: the caller's memory, left alone.
  enum class WeightSource { kHostMemory, kMappedFile };
  // The view matmul() and get_rows() should be given for a weight matrix; the backend keeps what
  // it makes alive, and MatrixView::prepared (opaque to the caller) is its own form of the matrix.
  // CPU: the same bytes, with a repacking (cpu/pack.h) as `prepared` where
  // packed_matmul_supported(dtype) (F16 / BF16 with AVX-512; with VNNI Q8_0, the 32-value 4- /
  // 5-bit blocks, the K-quants and IQ4_XS); a device backend: a copy in device memory.
  virtual MatrixView prepare_weights(const MatrixView& w, WeightSource source) = 0;
  // The same for a matrix only get_rows() reads (an untied embedding table): CPU: the same
  // bytes, no repacking; a device backend: a copy in device memory.
  virtual MatrixView prepare_lookup_table(const MatrixView& w) = 0;

  // --- ops on rows of activations (y, x: device memory; see ops.h for each formula) ---
  // out[i] = row ids[i] of `table`, dequantized: [ids.size()][table.cols] (embedding lookup).
  virtual void get_rows(const MatrixView& table, std::span<const int32_t> ids, float* out) = 0;
  // y[i * w.rows + r] = sum_c x[i * w.cols + c] * w[r][c]; as kernels::matmul().
  virtual void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y) = 0;
  // out[r] = rmsnorm(x[r]) * weight for num_rows contiguous rows of n; out == x is allowed
  // (in place). A per-head norm is rows of head_dim.
  virtual void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t num_rows,
                       int64_t n) = 0;
  virtual void add(const float* x, float* y, int64_t n) = 0;  // y += x (residual)
  // x[r] += bias for num_rows rows of n (bias: [n]).
  virtual void add_bias(const float* bias, Rows<float> x, int64_t num_rows, int64_t n) = 0;
  // out[r] = silu(gate[r]) * up[r], n per row; out may be gate, not up.
  virtual void silu_mul(Rows<const float> gate, Rows<const float> up, Rows<float> out,
                        int64_t num_rows, int64_t n) = 0;
  // dst[r][0, n) = src[r][0, n): splitting a fused output, gathering one GQA group's heads.
  virtual void copy_rows_2d(Rows<const float> src, Rows<float> dst, int64_t num_rows,
                            int64_t n) = 0;
  // dst[i][0, n) = src[src_rows[i]][0, n): e.g. the rows that want logits.
  virtual void gather_rows(Rows<const float> src, std::span<const int32_t> src_rows,
                           Rows<float> dst, int64_t n) = 0;
  // Row t of x holds num_heads heads of params.head_dim, rotated for positions[t].
  virtual void rope(const RopeParams& params, std::span<const int32_t> positions, Rows<float> x,
                    int64_t num_heads) = 0;

  // --- KV storage (layout: paged_attention.h) ---
  // Writes row r of src (head_dim floats) at element offset dst_offsets[r] of `dst`, storage of
  // `dtype` (kF32: floats; kF16: halves, rounded as f32_to_f16; kQ8_0 / kQ4_1: the row's blocks
  // as quantize_row writes them, at byte row_bytes(dtype, dst_offsets[r]), head_dim a multiple
  // of 32). One call per K or V.
  virtual void store_kv_rows(Rows<const float> src, int64_t head_dim, DType dtype, void* dst,
                             std::span<const int64_t> dst_offsets) = 0;

  // --- attention and its scores (paged_attention.h, attention_scores.h) ---
  virtual void paged_attention(const PagedKv& kv, const AttentionQuery& q,
                               const AttentionOutput& out) = 0;
  // Runs every job, in any order or concurrently (their outputs must not overlap); the
  // backend decides how to spread them over its threads. Rethrows a job's exception.
  virtual void paged_attention_batch(std::span<const AttentionJob> jobs) = 0;
  virtual void observation_scores(const PagedKv& kv, const AttentionQuery& window,
                                  const float* row_lse, int64_t num_keys, float* scores) = 0;
  virtual void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                                   const KeySummaries& summaries) = 0;
  virtual void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                                 int64_t num_heads, int64_t num_blocks, float* bounds) = 0;
  // out[h][t][0, head_dim) = key t of kv head h as f32, for t < num_keys (load_kv_row): the keys
  // a KV policy scores itself (KeyDiff). [kv.num_kv_heads][num_keys][head_dim] floats.
  virtual void gather_keys(const PagedKv& kv, int64_t num_keys, float* out) = 0;

  // --- appended ops ---
  // Each of the num_heads heads of head_dim (a power of two) in rows 0..num_rows-1 of x, in
  // place: x <- H x / sqrt(head_dim) (kernels::rotate_heads, ops.h): applied to the queries and
  // keys of a layer before a quantized KV cache stores / attends, q·k unchanged.
  virtual void rotate_heads(Rows<float> x, int64_t num_rows, int64_t num_heads,
                            int64_t head_dim) = 0;
  // x[r][c] *= scale[c] for num_rows rows of n (scale: [n]): the model's static key smoothing
  // (llama.cc), like add_bias.
  virtual void scale_columns(const float* scale, Rows<float> x, int64_t num_rows, int64_t n) = 0;

 protected:
  // For implementations: a buffer that `release` frees when its owner drops it.
  static DeviceBuffer wrap_buffer(void* data, size_t bytes, DeviceBuffer::ReleaseFn release) {
    return DeviceBuffer(data, bytes, release);
  }
};

// The Highway kernels on `pool` (which must outlive the backend), on the SIMD target
// active_target() names at each call.
std::unique_ptr<Backend> make_cpu_backend(ThreadPool& pool);
// The same on a pool of its own of num_threads threads (<= 0: one per hardware thread).
// prefill_dots: every attention job's AttentionQuery::prefill_dots (the arithmetic of prefill
// chunks' attention, where the CPU has bf16 dot products).
std::unique_ptr<Backend> make_cpu_backend(int num_threads,
                                          PrefillDots prefill_dots = PrefillDots::kF32);
// The scalar references, single-threaded.
std::unique_ptr<Backend> make_reference_backend();

// The choice make_backend() makes: a device name and, for the CPU, its worker threads.
struct BackendOptions {
  std::string device = "cpu";  // "cpu" (make_cpu_backend) or "reference" (make_reference_backend)
  int threads = 0;             // cpu: worker threads, <= 0: one per hardware thread
  PrefillDots prefill_dots = PrefillDots::kF32;  // cpu: make_cpu_backend's
};
// The device names make_backend() accepts, for help texts and errors.
inline constexpr const char* kBackendDevices = "cpu, reference";
// Throws sieve::Error naming the valid devices for an unknown one.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

}  // namespace sieve::kernels
