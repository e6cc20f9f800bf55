#pragma once
// A read-only memory mapping of a whole file. Move-only; unmaps on destruction.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace sieve {

class MappedFile {
 public:
  // Throws sieve::Error naming the path and the OS error if the file cannot be opened or mapped.
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace sieve
