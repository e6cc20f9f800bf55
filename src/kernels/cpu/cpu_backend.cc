// The CPU backend: the Highway-dispatched kernels of ops.h, paged_attention.h and
// attention_scores.h on one ThreadPool. The small row ops (residual add, bias, copies, KV
// stores) are memory-bound: SIMD where a dispatched kernel exists (axpy, rmsnorm, silu_mul),
// plain loops otherwise, split over the pool only when the rows are big enough to pay for a
// dispatch.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/pack.h"
#include "kernels/host_backend.h"
#include "util/thread_pool.h"

namespace sieve::kernels {

namespace {

// Below this many floats touched, a pool dispatch (~microseconds) costs more than it saves.
constexpr int64_t kMinParallelFloats = 1 << 15;
// Query rows up to which an attention job is "short" (decode, a few speculative rows): many
// short jobs run one per thread, each single-threaded.
constexpr int64_t kShortJobRows = 4;

// matmul reads a packed matrix's copy only, so the original bytes (pages of the mapped model file)
// would sit in memory beside it until reclaimed: the pages wholly inside them are handed back
// now (MADV_PAGEOUT, Linux 5.4+: a hint; the contents stay, a later read - a tied embedding's
// get_rows - brings them back from the file). Measured RSS of the 2048-dim Q4_0 model: 473 ->
// ~280 MB. Where the hint is unknown, nothing happens.
void release_pages(const MatrixView& w) {
#if defined(__linux__) && defined(MADV_PAGEOUT)
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(w.data);
  const uintptr_t begin = (first + page - 1) / page * page;
  const uintptr_t end = (first + row_bytes(w.dtype, w.cols) * w.rows) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)w;
#endif
}

class CpuBackend final : public HostMemoryBackend {
 public:
  explicit CpuBackend(ThreadPool& pool) : pool_(pool) {}
  CpuBackend(std::unique_ptr<ThreadPool> pool, PrefillDots prefill_dots)
      : owned_pool_(std::move(pool)), pool_(*owned_pool_), prefill_dots_(prefill_dots) {}

  std::string_view name() const override { return "cpu"; }
  int num_threads() const override { return pool_.num_threads(); }

  MatrixView prepare_weights(const MatrixView& w, WeightSource source) override {
    if (w.prepared != nullptr || !packed_matmul_supported(w.dtype)) return w;
    // Held while packing too: the pool runs one parallel loop at a time.
    const std::lock_guard lock(packed_mutex_);
    PackedBytes packed = pack_for_matmul(w, &pool_);
    // Only file pages: paging out anonymous memory (a caller's buffer about to be freed) would
    // write it to swap where there is some.
    if (source == WeightSource::kMappedFile) release_pages(w);
    MatrixView view = w;
    attach_packed(view, packed);  // stays put when packed_ grows (moved, not copied)
    packed_.push_back(std::move(packed));
    return view;
  }

  MatrixView prepare_lookup_table(const MatrixView& w) override { return w; }

  void get_rows(const MatrixView& table, std::span<const int32_t> ids, float* out) override {
    const size_t table_row_bytes = row_bytes(table.dtype, table.cols);
    for_rows(std::ssize(ids), table.cols, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto* row = static_cast<const uint8_t*>(table.data) + ids[i] * table_row_bytes;
        dequantize_row(table.dtype, row, out + i * table.cols, table.cols);
      }
    });
  }

  void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y) override {
    kernels::matmul(w, x, num_x, y, pool_);
  }

  void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t num_rows,
               int64_t n) override {
    for_rows(num_rows, n, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> row;  // in place: the kernel's x and out do not alias
      for (int64_t r = begin; r < end; ++r) {
        const float* in = x + r * n;
        if (in == out + r * n) {
          row.assign(in, in + n);
          in = row.data();
        }
        kernels::rmsnorm(in, weight, eps, out + r * n, n);
      }
    });
  }

  void add(const float* x, float* y, int64_t n) override {
    constexpr int64_t kChunk = 4096;  // floats per task
    for_rows((n + kChunk - 1) / kChunk, kChunk, [&](int64_t begin, int64_t end) {
      const int64_t first = begin * kChunk, last = std::min(n, end * kChunk);
      axpy(1.0f, x + first, y + first, last - first);  // fma(1, x, y) rounds as x + y
    });
  }

  void add_bias(const float* bias, Rows<float> x, int64_t num_rows, int64_t n) override {
    for_rows(num_rows, n, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) axpy(1.0f, bias, x.row(r), n);
    });
  }

  void silu_mul(Rows<const float> gate, Rows<const float> up, Rows<float> out, int64_t num_rows,
                int64_t n) override {
    for_rows(num_rows, 2 * n, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        if (out.row(r) != gate.row(r)) std::memcpy(out.row(r), gate.row(r), n * sizeof(float));
        kernels::silu_mul(out.row(r), up.row(r), n);
      }
    });
  }

  void copy_rows_2d(Rows<const float> src, Rows<float> dst, int64_t num_rows, int64_t n) override {
    for_rows(num_rows, n,
             [&](int64_t begin, int64_t end) { host_rows::copy_rows_2d(src, dst, begin, end, n); });
  }

  void gather_rows(Rows<const float> src, std::span<const int32_t> src_rows, Rows<float> dst,
                   int64_t n) override {
    for_rows(std::ssize(src_rows), n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        std::memcpy(dst.row(i), src.row(src_rows[i]), n * sizeof(float));
    });
  }

  void rope(const RopeParams& params, std::span<const int32_t> positions, Rows<float> x,
            int64_t num_heads) override {
    // Each row also computes its cos/sin table: count it as a few floats per pair.
    for_rows(std::ssize(positions), num_heads * params.head_dim + 8 * params.num_dims,
             [&](int64_t begin, int64_t end) {
               for (int64_t t = begin; t < end; ++t)
                 kernels::rope(params, positions[t], x.row(t), num_heads);
             });
  }

  void store_kv_rows(Rows<const float> src, int64_t head_dim, DType dtype, void* dst,
                     std::span<const int64_t> dst_offsets) override {
    host_rows::check_kv_dtype(dtype, head_dim);
    for_rows(std::ssize(dst_offsets), head_dim, [&](int64_t begin, int64_t end) {
      host_rows::store_kv_rows(src, head_dim, dtype, dst, dst_offsets.data(), begin, end);
    });
  }

  void paged_attention(const PagedKv& kv, const AttentionQuery& q,
                       const AttentionOutput& out) override {
    kernels::paged_attention(kv, with_dots(q), out, pool_);
  }

  // Many short jobs (decode rows of many sequences, or one row's KV-head streams): one job per
  // task, each attention single-threaded, instead of one pool dispatch (and key split + merge)
  // per job. Longer jobs (prefill chunks) take the whole pool each, one after another.
  void paged_attention_batch(std::span<const AttentionJob> jobs) override {
    // Per calling thread, reused: no allocation per call once they have grown. (Named through
    // references: the workers below must see the caller's vectors, not their own.)
    thread_local std::vector<const AttentionJob*> short_jobs_of_thread, long_jobs_of_thread;
    thread_local std::vector<std::exception_ptr> errors_of_thread;
    std::vector<const AttentionJob*>& short_jobs = short_jobs_of_thread;
    std::vector<const AttentionJob*>& long_jobs = long_jobs_of_thread;
    std::vector<std::exception_ptr>& errors = errors_of_thread;
    short_jobs.clear();
    long_jobs.clear();
    for (const AttentionJob& job : jobs)
      (std::ssize(job.query.positions) <= kShortJobRows ? short_jobs : long_jobs).push_back(&job);
    if (pool_.num_threads() > 1 && std::ssize(short_jobs) >= pool_.num_threads()) {
      errors.assign(short_jobs.size(), nullptr);
      pool_.parallel_for(
          std::ssize(short_jobs),
          [&](int64_t begin, int64_t end) {
            thread_local ThreadPool inline_pool(1);
            for (int64_t i = begin; i < end; ++i) {
              try {
                run_job(*short_jobs[i], inline_pool);
              } catch (...) {  // a worker must not throw: rethrown on the caller's thread below
                errors[i] = std::current_exception();
              }
            }
          },
          1);
      for (const std::exception_ptr& error : errors) {
        if (error) std::rethrow_exception(error);
      }
    } else {
      long_jobs.insert(long_jobs.begin(), short_jobs.begin(), short_jobs.end());
    }
    for (const AttentionJob* job : long_jobs) run_job(*job, pool_);
  }

  void observation_scores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                          int64_t num_keys, float* scores) override {
    kernels::observation_scores(kv, window, row_lse, num_keys, scores, pool_);
  }

  void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                           const KeySummaries& summaries) override {
    kernels::summarize_page_keys(kv, block, num_filled, summaries);
  }

  void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                         int64_t num_heads, int64_t num_blocks, float* bounds) override {
    // One KV head (a Quest stream's summaries): its blocks split over the pool, each block's
    // bound independent of the others. (Several heads' bounds interleave by head: left whole.)
    const int64_t floats =
        num_blocks * (summaries.key_halves ? kv.page_size : 2 * num_heads) * kv.head_dim;
    if (kv.num_kv_heads != 1 || pool_.num_threads() == 1 || floats < kMinParallelFloats) {
      kernels::page_upper_bounds(kv, summaries, q, num_heads, num_blocks, bounds);
      return;
    }
    pool_.parallel_for(num_blocks, [&](int64_t begin, int64_t end) {
      PagedKv part = kv;
      part.block_table =
          kv.block_table.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
      kernels::page_upper_bounds(part, summaries, q, num_heads, end - begin, bounds + begin);
    });
  }

  void scale_columns(const float* scale, Rows<float> x, int64_t num_rows, int64_t n) override {
    for_rows(num_rows, n, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* row = x.row(r);
        for (int64_t c = 0; c < n; ++c) row[c] *= scale[c];
      }
    });
  }

  void rotate_heads(Rows<float> x, int64_t num_rows, int64_t num_heads, int64_t head_dim) override {
    for_rows(num_rows, num_heads * head_dim, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) kernels::rotate_heads(x.row(r), 1, num_heads, head_dim);
    });
  }

 private:
  AttentionQuery with_dots(AttentionQuery q) const {
    if (q.prefill_dots == PrefillDots::kF32) q.prefill_dots = prefill_dots_;
    return q;
  }

  void run_job(const AttentionJob& job, ThreadPool& pool) const {
    kernels::paged_attention(job.kv, with_dots(job.query), job.out, pool);
    for (const ObservationOutput& o : job.observations) {
      const ObservedRows rows = observed_rows(job, o);
      kernels::observation_scores(job.kv, rows.query, rows.row_lse, o.num_keys, o.scores, pool);
    }
  }

  // fn(begin, end) over [0, num_rows): on the pool when the rows are worth a dispatch.
  template <typename Fn>
  void for_rows(int64_t num_rows, int64_t floats_per_row, const Fn& fn) {
    if (num_rows > 1 && pool_.num_threads() > 1 && num_rows * floats_per_row >= kMinParallelFloats)
      pool_.parallel_for(num_rows, fn);
    else if (num_rows > 0)
      fn(0, num_rows);
  }

  std::unique_ptr<ThreadPool> owned_pool_;  // make_cpu_backend(num_threads); else null
  ThreadPool& pool_;
  const PrefillDots prefill_dots_ = PrefillDots::kF32;
  std::mutex packed_mutex_;
  std::vector<PackedBytes> packed_;  // repackings handed out by prepare_weights
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(ThreadPool& pool) {
  return std::make_unique<CpuBackend>(pool);
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads, PrefillDots prefill_dots) {
  return std::make_unique<CpuBackend>(std::make_unique<ThreadPool>(num_threads), prefill_dots);
}

}  // namespace sieve::kernels
