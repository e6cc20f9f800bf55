#include "grammar/token_masker.h"

#include "util/error.h"

namespace sieve::grammar {
namespace {

using detail::kCut;
using detail::StackSet;
using detail::Utf8Partial;

struct Frame {
  StackSet stacks;
  Utf8Partial partial;
};

// Depth-first walk of the trie below `node`, running the automaton along. frames[0] holds the
// state at `node`. on_tokens(node) for every node whose bytes the automaton accepts;
// on_cut(node) where a stack reached the cut and the node has tokens below it.
template <typename OnTokens, typename OnCut>
class TrieWalk {
 public:
  TrieWalk(const CompiledGrammar& g, const Vocabulary& v, OnTokens on_tokens, OnCut on_cut)
      : g_(g),
        trie_(v.trie()),
        frames_(v.max_token_length() + 2),
        on_tokens_(on_tokens),
        on_cut_(on_cut) {}
  Frame& start() { return frames_[0]; }
  void run(uint32_t node) { visit(node, 0); }

 private:
  void visit(uint32_t node, size_t depth) {
    const Frame& in = frames_[depth];
    Frame& out = frames_[depth + 1];
    const uint32_t end = trie_[node].subtree_end;
    for (uint32_t child = node + 1; child < end; child = trie_[child].subtree_end) {
      if (!detail::advance_byte(g_, in.stacks, in.partial, trie_[child].byte, out.stacks,
                                out.partial, scratch_)) {
        continue;
      }
      const Vocabulary::TrieNode& c = trie_[child];
      if (c.token_begin != c.token_end) on_tokens_(child);
      if (c.subtree_end == child + 1) continue;  // a leaf
      bool cut = false;
      bool live = false;
      out.stacks.for_each([&](std::span<const uint32_t> stack) {
        if (stack.empty()) return;
        if (stack.back() == kCut) {
          cut = true;
        } else {
          live = true;
        }
      });
      if (cut) on_cut_(child);
      if (live) visit(child, depth + 1);
    }
  }

  const CompiledGrammar& g_;
  std::span<const Vocabulary::TrieNode> trie_;
  std::vector<Frame> frames_;
  std::vector<uint32_t> scratch_;
  OnTokens on_tokens_;
  OnCut on_cut_;
};

template <typename OnTokens, typename OnCut>
TrieWalk<OnTokens, OnCut> make_walk(const CompiledGrammar& g, const Vocabulary& v, OnTokens t,
                                    OnCut c) {
  return TrieWalk<OnTokens, OnCut>(g, v, t, c);
}

void set_tokens(const Vocabulary& v, uint32_t node, TokenBitset& out) {
  const Vocabulary::TrieNode& n = v.trie()[node];
  for (uint32_t i = n.token_begin; i < n.token_end; ++i)
    out.set(static_cast<size_t>(v.trie_tokens()[i]));
}

void push_partial(const Utf8Partial& p, std::vector<uint32_t>& key) {
  key.push_back(p.value);
  key.push_back(uint32_t{p.remaining} | (uint32_t{p.length} << 8));
}

}  // namespace

size_t TokenMasker::VectorHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 1469598103934665603ull ^ v.size();
  for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> grammar,
                         std::shared_ptr<const Vocabulary> vocabulary, MaskerOptions options)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)), options_(options) {
  if (options_.context_depth < 1) fail("grammar: context_depth must be at least 1");
}

MaskerStats TokenMasker::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::shared_ptr<const TokenMasker::KeyTable> TokenMasker::key_table(
    const std::vector<uint32_t>& key, std::span<const uint32_t> key_stack,
    const Utf8Partial& partial) const {
  {
    std::lock_guard lock(mutex_);
    auto it = keys_.find(key);
    if (it != keys_.end()) return it->second;
  }
  auto table = std::make_shared<KeyTable>();
  table->accepted.reset(vocabulary_->size());
  const Vocabulary& v = *vocabulary_;
  auto walk = make_walk(
      *grammar_, v, [&](uint32_t node) { set_tokens(v, node, table->accepted); },
      [&](uint32_t node) { table->cut_subtrees.push_back(node); });
  walk.start().stacks.add(key_stack);
  walk.start().partial = partial;
  walk.run(0);
  std::lock_guard lock(mutex_);
  ++stats_.num_keys;
  return keys_.emplace(key, std::move(table)).first->second;
}

size_t TokenMasker::fill_mask(const GrammarState& state, TokenBitset& out) const {
  const Vocabulary& v = *vocabulary_;
  std::vector<uint32_t> state_key;
  push_partial(state.partial(), state_key);
  state_key.insert(state_key.end(), state.stacks().data().begin(), state.stacks().data().end());
  {
    std::lock_guard lock(mutex_);
    auto it = states_.find(state_key);
    if (it != states_.end()) {
      ++stats_.num_state_hits;
      out = *it->second;
      return out.count();
    }
  }
  out.reset(v.size());
  const size_t depth = options_.context_depth;
  std::vector<uint32_t> key;
  std::vector<uint32_t> key_stack;
  std::vector<uint32_t> context;
  state.stacks().for_each([&](std::span<const uint32_t> stack) {
    if (stack.empty()) return;  // the end: EOS below
    const bool cut = stack.size() > depth;
    const size_t first = cut ? stack.size() - depth : 0;
    key_stack.clear();
    if (cut) key_stack.push_back(kCut);
    key_stack.insert(key_stack.end(), stack.begin() + static_cast<ptrdiff_t>(first), stack.end());
    key.clear();
    push_partial(state.partial(), key);
    key.insert(key.end(), key_stack.begin(), key_stack.end());
    const std::shared_ptr<const KeyTable> table = key_table(key, key_stack, state.partial());
    out.or_with(table->accepted);
    if (!cut || table->cut_subtrees.empty()) return;
    // Below the cut: the rest of the stack, expanded, takes the bytes after each cut node.
    auto walk = make_walk(
        *grammar_, v, [&](uint32_t node) { set_tokens(v, node, out); }, [](uint32_t) {});
    context.assign(stack.begin(), stack.begin() + static_cast<ptrdiff_t>(first));
    detail::expand(*grammar_, context, walk.start().stacks);
    for (uint32_t node : table->cut_subtrees) walk.run(node);
  });
  if (state.can_end()) {
    for (TokenId id : v.eog_ids()) out.set(static_cast<size_t>(id));
  }
  std::lock_guard lock(mutex_);
  ++stats_.num_state_misses;
  if (options_.max_cached_states == 0) return out.count();
  auto cached = std::make_shared<const TokenBitset>(out);
  if (states_.size() >= options_.max_cached_states) states_.clear();
  states_.emplace(std::move(state_key), std::move(cached));
  return out.count();
}

bool TokenMasker::accept_token(GrammarState& state, TokenId id) const {
  const Vocabulary& v = *vocabulary_;
  if (id < 0 || static_cast<size_t>(id) >= v.size()) return false;
  if (v.is_eog(id)) return state.can_end();
  if (!v.is_text(id)) return false;
  return state.accept_bytes(v.token_bytes(id));
}

}  // namespace sieve::grammar
