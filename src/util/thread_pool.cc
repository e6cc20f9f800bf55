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
  shares_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(num_threads));
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i)
    workers_.emplace_back([this, i] { worker_loop(/*seen=*/0, /*participant=*/i); });
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

namespace {
constexpr uint64_t kLow32 = 0xFFFFFFFFu;
}  // namespace

void ThreadPool::run_shares(int participant) {
  // Own share from the front...
  std::atomic<uint64_t>& own = shares_[static_cast<size_t>(participant)];
  for (uint64_t state = own.load();;) {
    const uint64_t front = state >> 32, back = state & kLow32;
    if (front >= back) break;
    if (own.compare_exchange_weak(state, (front + 1) << 32 | back)) {
      (*job_)(static_cast<int64_t>(front), static_cast<int64_t>(front + 1));
      state = own.load();
    }
  }
  // ...then the others' from their backs, the share with the most left first.
  for (;;) {
    int victim = -1;
    uint64_t most = 0;
    for (int t = 0; t < num_threads(); ++t) {
      const uint64_t state = shares_[static_cast<size_t>(t)].load();
      const uint64_t front = state >> 32, back = state & kLow32;
      if (back > front && back - front > most) {
        most = back - front;
        victim = t;
      }
    }
    if (victim < 0) return;
    std::atomic<uint64_t>& share = shares_[static_cast<size_t>(victim)];
    uint64_t state = share.load();
    const uint64_t front = state >> 32, back = state & kLow32;
    if (front < back && share.compare_exchange_strong(state, front << 32 | (back - 1)))
      (*job_)(static_cast<int64_t>(back - 1), static_cast<int64_t>(back));
  }
}

// `seen` starts at the pool's initial generation, not at whatever generation_ holds when the
// thread first runs: a loop may already have been posted by then.
void ThreadPool::worker_loop(uint64_t seen, int participant) {
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
    run_loop(participant);
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
  shares_active_ = false;
  dispatch();
}

void ThreadPool::parallel_for_shares(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1 || n > static_cast<int64_t>(kLow32)) {
    for (int64_t i = 0; i < n; ++i) fn(i, i + 1);
    return;
  }
  const auto threads = static_cast<uint64_t>(num_threads());
  const auto items = static_cast<uint64_t>(n);
  for (uint64_t t = 0; t < threads; ++t) {
    shares_[t].store(items * t / threads << 32 | items * (t + 1) / threads);
  }
  job_ = &fn;
  shares_active_ = true;
  dispatch();
}

void ThreadPool::dispatch() {
  active_workers_.store(static_cast<int>(workers_.size()));
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_loop(/*participant=*/0);
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
