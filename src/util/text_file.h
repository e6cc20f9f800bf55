#pragma once
// Reports and other outputs written whole to a file.
#include <string>
#include <string_view>

namespace sieve {

// Writes `contents` to `path` (replacing it); sieve::Error naming the path when it cannot.
void write_file(const std::string& path, std::string_view contents);

}  // namespace sieve
