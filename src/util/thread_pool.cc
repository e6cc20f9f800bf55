#include "util/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SIEVE_CPU_RELAX() _mm_pause()
#else
#define SIEVE_CPU_RELAX() ((void)0)
#endif

namespace sieve {

namespace {
// Spin this many rounds before sleeping: long enough to catch the next op of a forward pass
// (microseconds apart), short enough that an idle pool sleeps almost at once.
constexpr int kSpinRounds = 4000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(/*seen=*/0); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_chunks() {
  const int64_t num_chunks = (job_n_ + job_grain_ - 1) / job_grain_;
  for (;;) {
    int64_t chunk = next_chunk_.fetch_add(1);
    if (chunk >= num_chunks) break;
    int64_t begin = chunk * job_grain_;
    (*job_)(begin, std::min(job_n_, begin + job_grain_));
  }
}

// `seen` starts at the pool's initial generation, not at whatever generation_ holds when the
// thread first runs: a loop may already have been posted by then.
void ThreadPool::worker_loop(uint64_t seen) {
  for (;;) {
    uint64_t current = generation_.load();
    for (int i = 0; i < kSpinRounds && current == seen; ++i) {
      SIEVE_CPU_RELAX();
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      generation_.wait(seen);
      continue;
    }
    seen = current;
    if (stop_.load()) return;
    run_chunks();
    if (active_workers_.fetch_sub(1) == 1) active_workers_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  if (grain <= 0) grain = (n + num_threads() - 1) / num_threads();
  if (workers_.empty() || grain >= n) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  next_chunk_.store(0);
  active_workers_.store(static_cast<int>(workers_.size()));
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_chunks();
  // The workers finish microseconds apart from this thread in a forward pass: spin first, as
  // they do, so that no step pays a futex sleep and wake-up.
  int active = active_workers_.load(std::memory_order_acquire);
  for (int i = 0; i < kSpinRounds && active != 0; ++i) {
    SIEVE_CPU_RELAX();
    active = active_workers_.load(std::memory_order_acquire);
  }
  for (; active != 0; active = active_workers_.load()) active_workers_.wait(active);
}

}  // namespace sieve
