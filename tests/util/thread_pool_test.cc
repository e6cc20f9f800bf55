#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace sieve {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 17, 1000, 100003}) {
    for (int64_t grain : {0, 1, 7, 1 << 20}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(
          n,
          [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, ManyBackToBackLoops) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    pool.parallel_for(
        10, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); }, 1);
  }
  EXPECT_EQ(total.load(), 20000);
}

TEST(ThreadPool, SharesCoverEveryIndexExactlyOnceInOrderWithinAThread) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 5, 17, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex mutex;
      std::map<std::thread::id, std::vector<int64_t>> order;
      pool.parallel_for_shares(n, [&](int64_t begin, int64_t end) {
        ASSERT_EQ(end, begin + 1);
        hits[begin].fetch_add(1);
        const std::lock_guard lock(mutex);
        order[std::this_thread::get_id()].push_back(begin);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n=" << n << " i=" << i;
      }
      // A thread walks its own share upward, one item after the other; what it then takes from
      // the others comes from their ends, downward within a share.
      const auto share_of = [&](int64_t i) {
        int64_t t = 0;
        while (n * (t + 1) / threads <= i) ++t;
        return t;
      };
      for (const auto& [id, items] : order) {
        size_t k = 1;
        if (n * share_of(items[0]) / threads == items[0]) {  // began with its own share
          while (k < items.size() && items[k] == items[k - 1] + 1) ++k;
        }
        for (; k < items.size(); ++k) {
          EXPECT_TRUE(items[k] < items[k - 1] || share_of(items[k]) != share_of(items[k - 1]))
              << threads << " threads, n=" << n << ": " << items[k - 1] << " then " << items[k];
        }
      }
    }
  }
}

TEST(ThreadPool, SharesRelieveASlowThread) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> by_worker{0};
  std::atomic<bool> stolen{false};
  // The calling thread stalls on the first item of its share [0, 10) until the worker, done
  // with its own [10, 20), has taken one of the caller's from the end (or 30 s pass).
  pool.parallel_for_shares(20, [&](int64_t begin, int64_t) {
    if (std::this_thread::get_id() == caller) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!stolen.load() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } else {
      by_worker.fetch_add(1);
      if (begin < 10) stolen.store(true);
    }
  });
  EXPECT_TRUE(stolen.load());
  EXPECT_GE(by_worker.load(), 11);  // its own 10, and the caller's last at least
}

TEST(ThreadPool, SingleThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  int64_t sum = 0;
  pool.parallel_for(100, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

}  // namespace
}  // namespace sieve
