// Temporary directories for store tests (real files on the real file system, so fsync costs).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

#include "store/store.h"

namespace mnemo::testing_util {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mnemo_store_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A minimal completed response (model "m"). (Strings are moved in, not assigned from literals:
// GCC 12 warns falsely, -Wrestrict, on inlined short literal assignments, bug 105329.)
inline StoredResponse MakeResponse(std::string id, std::string owner = "",
                                   std::optional<int64_t> session_id = std::nullopt, int64_t end_token = 0) {
  StoredResponse r;
  r.id = std::move(id);
  r.owner = std::move(owner);
  r.session_id = session_id;
  r.end_token = end_token;
  r.model = std::string("m");
  r.status = std::string("completed");
  return r;
}

inline ListOptions Paging(bool ascending, std::string after, int limit) {
  ListOptions o;
  o.ascending = ascending;
  o.after = std::move(after);
  o.limit = limit;
  return o;
}

inline StoreOptions WithDurability(Durability d) {
  StoreOptions o;
  o.durability = d;
  return o;
}

}  // namespace mnemo::testing_util
