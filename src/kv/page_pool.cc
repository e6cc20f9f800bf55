#include "kv/page_pool.h"

#include <fmt/format.h>

#include <cassert>

namespace sieve::kv {

PagePool::PagePool(int32_t num_pages)
    : num_pages_(num_pages),
      num_free_(num_pages),
      ref_counts_(num_pages, 0),
      hashes_(num_pages),
      next_(num_pages + 1),
      prev_(num_pages + 1) {
  assert(num_pages >= 0);
  // Circular list sentinel -> 0 -> 1 -> ... -> num_pages-1 -> sentinel.
  for (int32_t node = 0; node <= num_pages; ++node) {
    next_[node] = node == num_pages ? 0 : node + 1;
    prev_[node] = node == 0 ? num_pages : node - 1;
  }
}

size_t PagePool::index(PageId page) const {
  assert(page.value >= 0 && page.value < num_pages_);
  return static_cast<size_t>(page.value);
}

void PagePool::link_before(int32_t node, int32_t page) {
  int32_t before = prev_[node];
  next_[before] = page;
  prev_[page] = before;
  next_[page] = node;
  prev_[node] = page;
  ++num_free_;
}

void PagePool::unlink(int32_t page) {
  next_[prev_[page]] = next_[page];
  prev_[next_[page]] = prev_[page];
  --num_free_;
}

std::optional<PageId> PagePool::allocate() {
  if (num_free_ == 0) return std::nullopt;
  int32_t page = next_[num_pages_];
  unlink(page);
  assert(ref_counts_[page] == 0);
  ref_counts_[page] = 1;
  if (hashes_[page]) {
    cached_.erase(*hashes_[page]);
    hashes_[page].reset();
    ++num_evictions_;
  }
  return PageId{page};
}

void PagePool::retain(PageId page) {
  size_t i = index(page);
  if (ref_counts_[i]++ == 0) unlink(page.value);
}

void PagePool::release(PageId page) {
  size_t i = index(page);
  assert(ref_counts_[i] > 0);
  if (--ref_counts_[i] > 0) return;
  // Cached: tail (evicted last, LRU). Not cached: head (reused first).
  link_before(hashes_[i] ? num_pages_ : next_[num_pages_], page.value);
}

std::optional<PageId> PagePool::find_cached(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

bool PagePool::publish(PageId page, const BlockHash& hash) {
  size_t i = index(page);
  assert(ref_counts_[i] > 0 && !hashes_[i]);
  if (!cached_.emplace(hash, page).second) return false;
  hashes_[i] = hash;
  return true;
}

bool PagePool::reset_cache() {
  if (num_free_ != num_pages_) return false;
  cached_.clear();
  for (auto& hash : hashes_) hash.reset();
  return true;
}

std::vector<PageId> PagePool::free_queue() const {
  std::vector<PageId> pages;
  pages.reserve(num_free_);
  for (int32_t node = next_[num_pages_]; node != num_pages_; node = next_[node]) {
    pages.push_back(PageId{node});
  }
  return pages;
}

std::optional<std::string> PagePool::invariant_violation() const {
  int32_t num_zero = 0;
  for (int32_t page = 0; page < num_pages_; ++page) {
    if (ref_counts_[page] < 0)
      return fmt::format("page {} has ref count {}", page, ref_counts_[page]);
    if (ref_counts_[page] == 0) ++num_zero;
    if (hashes_[page]) {
      auto it = cached_.find(*hashes_[page]);
      if (it == cached_.end() || it->second.value != page) {
        return fmt::format("page {} has a hash the index does not map to it", page);
      }
    }
  }
  for (const auto& [hash, page] : cached_) {
    if (page.value < 0 || page.value >= num_pages_ || hashes_[page.value] != hash) {
      return fmt::format("the index maps a hash to page {}, which does not hold it", page.value);
    }
  }
  if (num_zero != num_free_) {
    return fmt::format("{} pages have ref count 0 but num_free is {}", num_zero, num_free_);
  }
  int32_t length = 0;
  bool seen_cached = false;
  for (int32_t node = next_[num_pages_]; node != num_pages_; node = next_[node]) {
    if (node < 0 || node >= num_pages_ || ++length > num_free_) {
      return fmt::format("the free queue is longer than num_free ({}) or malformed", num_free_);
    }
    if (prev_[next_[node]] != node) return fmt::format("free queue links broken at page {}", node);
    if (ref_counts_[node] != 0) {
      return fmt::format("page {} is queued with ref count {}", node, ref_counts_[node]);
    }
    if (hashes_[node]) {
      seen_cached = true;
    } else if (seen_cached) {
      return fmt::format("free page {} without a hash is queued behind a cached page", node);
    }
  }
  if (length != num_free_) {
    return fmt::format("the free queue holds {} pages but num_free is {}", length, num_free_);
  }
  return std::nullopt;
}

}  // namespace sieve::kv
