// The reference backend: the scalar ref:: kernels and plain loops, single-threaded. Every other
// backend is tested against it (tests/kernels/backend_ops_test.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host_backend.h"

namespace sieve::kernels {

namespace {

class ReferenceBackend final : public HostMemoryBackend {
 public:
  std::string_view name() const override { return "reference"; }

  MatrixView prepare_weights(const MatrixView& w, WeightSource /*source*/) override {
    MatrixView view = w;
    view.prepared = nullptr;  // the references read the ggml layout only
    return view;
  }
  MatrixView prepare_lookup_table(const MatrixView& w) override {
    return prepare_weights(w, WeightSource::kHostMemory);
  }

  void get_rows(const MatrixView& table, std::span<const int32_t> ids, float* out) override {
    const size_t table_row_bytes = row_bytes(table.dtype, table.cols);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto* row = static_cast<const uint8_t*>(table.data) + ids[i] * table_row_bytes;
      dequantize_row(table.dtype, row, out + static_cast<int64_t>(i) * table.cols, table.cols);
    }
  }

  void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y) override {
    ref::matmul(w, x, num_x, y);
  }

  void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t num_rows,
               int64_t n) override {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t r = 0; r < num_rows; ++r) {
      std::copy_n(x + r * n, n, row.begin());  // out may be x
      ref::rmsnorm(row.data(), weight, eps, out + r * n, n);
    }
  }

  void add(const float* x, float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }

  void add_bias(const float* bias, Rows<float> x, int64_t num_rows, int64_t n) override {
    for (int64_t r = 0; r < num_rows; ++r) add(bias, x.row(r), n);
  }

  void silu_mul(Rows<const float> gate, Rows<const float> up, Rows<float> out, int64_t num_rows,
                int64_t n) override {
    for (int64_t r = 0; r < num_rows; ++r) {
      std::copy_n(gate.row(r), n, out.row(r));
      ref::silu_mul(out.row(r), up.row(r), n);
    }
  }

  void copy_rows_2d(Rows<const float> src, Rows<float> dst, int64_t num_rows, int64_t n) override {
    host_rows::copy_rows_2d(src, dst, 0, num_rows, n);
  }

  void gather_rows(Rows<const float> src, std::span<const int32_t> src_rows, Rows<float> dst,
                   int64_t n) override {
    for (size_t i = 0; i < src_rows.size(); ++i)
      std::copy_n(src.row(src_rows[i]), n, dst.row(static_cast<int64_t>(i)));
  }

  void rope(const RopeParams& params, std::span<const int32_t> positions, Rows<float> x,
            int64_t num_heads) override {
    // kernels::rope is scalar and is its own reference (checked against ggml in rope_test).
    for (size_t t = 0; t < positions.size(); ++t)
      kernels::rope(params, positions[t], x.row(static_cast<int64_t>(t)), num_heads);
  }

  void store_kv_rows(Rows<const float> src, int64_t head_dim, DType dtype, void* dst,
                     std::span<const int64_t> dst_offsets) override {
    host_rows::check_kv_dtype(dtype, head_dim);
    host_rows::store_kv_rows(src, head_dim, dtype, dst, dst_offsets.data(), 0,
                             std::ssize(dst_offsets));
  }

  void paged_attention(const PagedKv& kv, const AttentionQuery& q,
                       const AttentionOutput& out) override {
    ref::paged_attention(kv, q, out);
  }

  void paged_attention_batch(std::span<const AttentionJob> jobs) override {
    for (const AttentionJob& job : jobs) {
      ref::paged_attention(job.kv, job.query, job.out);
      for (const ObservationOutput& o : job.observations) {
        const ObservedRows rows = observed_rows(job, o);
        ref::observation_scores(job.kv, rows.query, rows.row_lse, o.num_keys, o.scores);
      }
    }
  }

  void observation_scores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                          int64_t num_keys, float* scores) override {
    ref::observation_scores(kv, window, row_lse, num_keys, scores);
  }

  void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                           const KeySummaries& summaries) override {
    ref::summarize_page_keys(kv, block, num_filled, summaries);
  }

  void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                         int64_t num_heads, int64_t num_blocks, float* bounds) override {
    ref::page_upper_bounds(kv, summaries, q, num_heads, num_blocks, bounds);
  }

  void scale_columns(const float* scale, Rows<float> x, int64_t num_rows, int64_t n) override {
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t c = 0; c < n; ++c) x.row(r)[c] *= scale[c];
    }
  }

  void rotate_heads(Rows<float> x, int64_t num_rows, int64_t num_heads, int64_t head_dim) override {
    for (int64_t r = 0; r < num_rows; ++r) ref::rotate_heads(x.row(r), 1, num_heads, head_dim);
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace sieve::kernels
