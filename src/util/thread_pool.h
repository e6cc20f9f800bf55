#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part in
// every loop, so a pool of N threads starts N-1 workers. Idle workers block in a futex wait
// (std::atomic::wait) after a short bounded spin: an idle server burns no CPU.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace sieve {

class ThreadPool {
 public:
  // num_threads <= 0 means one per hardware thread.
  explicit ThreadPool(int num_threads = 0);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges that cover [0, n), in chunks of `grain` items
  // (default: n split evenly over the threads). Returns when every chunk is done. Not
  // re-entrant: fn must not call parallel_for on the same pool.
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 0);

  // Calls fn(i, i + 1) for every i in [0, n): thread t first walks its own share, items
  // [n * t / T, n * (t + 1) / T), in order; a thread done with its share then takes the last
  // items of the share with the most left, from its end. So each thread reads one long run
  // (what the hardware prefetchers follow, e.g. a decode matmul's weight rows), and a thread
  // slowed by something else on its core is relieved instead of waited for. Not re-entrant.
  void parallel_for_shares(int64_t n, const RangeFn& fn);

 private:
  void worker_loop(uint64_t seen, int participant);
  void run_chunks();
  void run_shares(int participant);
  void run_loop(int participant) { shares_active_ ? run_shares(participant) : run_chunks(); }
  void dispatch();  // starts the posted loop on the workers, runs this thread's part, waits

  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_workers_{0};
  std::atomic<bool> stop_{false};
  // The current loop; written before generation_ is bumped, read by workers after.
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  std::atomic<int64_t> next_chunk_{0};
  // parallel_for_shares: per thread, its share's remaining items [front, back) packed as
  // front << 32 | back (one CAS claims an item from either end).
  bool shares_active_ = false;
  std::unique_ptr<std::atomic<uint64_t>[]> shares_;
};

}  // namespace sieve
