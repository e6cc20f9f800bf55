#include "util/text_file.h"

#include <fstream>

#include "util/error.h"

namespace sieve {

void write_file(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot write '{}'", path);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out) fail("failed writing '{}'", path);
}

}  // namespace sieve
