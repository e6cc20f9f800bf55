#include "grammar/grammar_cache.h"

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "util/error.h"

namespace sieve::grammar {
namespace {

std::string cache_key(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::kGbnf:
      return "g" + spec.text;
    case GrammarKind::kJsonObject:
      return "o";
    case GrammarKind::kJsonSchema:
      return "s" + parse_schema(spec.text).value.dump();
  }
  return "";
}

}  // namespace

std::string spec_to_gbnf(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::kGbnf:
      return spec.text;
    case GrammarKind::kJsonObject:
      return json_object_gbnf();
    case GrammarKind::kJsonSchema:
      return json_schema_to_gbnf(spec.text);
  }
  return "";
}

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity,
                           MaskerOptions options)
    : vocabulary_(std::move(vocabulary)),
      capacity_(std::max<size_t>(capacity, 1)),
      options_(options) {}

std::shared_ptr<const TokenMasker> GrammarCache::get(const GrammarSpec& spec) {
  const std::string key = cache_key(spec);
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
      return it->second.masker;
    }
  }
  auto masker = std::make_shared<const TokenMasker>(CompiledGrammar::from_gbnf(spec_to_gbnf(spec)),
                                                    vocabulary_, options_);
  std::lock_guard lock(mutex_);
  ++num_compiled_;
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.masker;  // another thread was first
  lru_.push_front(key);
  entries_.emplace(key, Entry{masker, lru_.begin()});
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return masker;
}

size_t GrammarCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

size_t GrammarCache::num_compiled() const {
  std::lock_guard lock(mutex_);
  return num_compiled_;
}

}  // namespace sieve::grammar
