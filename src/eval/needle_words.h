#pragma once
// The words needles are made of (eval/needle_task.h): keys are distinctive capitalised names and
// nouns, values are runs of common lowercase words. Fixed lists, so a seed means the same cases
// everywhere.
#include <span>
#include <string_view>

namespace sieve::eval {

std::span<const std::string_view> needle_keys();         // ~200 distinct words
std::span<const std::string_view> needle_value_words();  // ~300 distinct words

}  // namespace sieve::eval
