// A read-only memory map of a whole file (PROT_READ, MAP_PRIVATE). Model weights are used in place
// from the map: nothing is copied, and pages are read from disk on first touch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace mnemo {

class MappedFile {
 public:
  // Maps the file at path. Empty files are an error (mmap cannot map zero bytes).
  static Result<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;  // page-aligned start of the map
  size_t size_ = 0;                // bytes mapped (= file size)
  std::string path_;
};

}  // namespace mnemo
