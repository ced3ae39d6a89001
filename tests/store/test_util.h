// Temporary directories for store tests (real files on the real file system, so fsync costs).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

#include "store/store.h"
#include "pg_server.h"
#include <gtest/gtest.h>
#include <map>

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

enum class Backend { kSqlite, kPostgres };
inline void PrintTo(Backend b, std::ostream* os) { *os << (b == Backend::kSqlite ? "SQLite" : "PostgreSQL"); }
inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kSqlite ? "Sqlite" : "Postgres";
}

// Where a test's stores live: files in a temporary directory (SQLite), or fresh databases on the
// test PostgreSQL server, one per name. The same name gives the same store (reopening).
class StoreHome {
 public:
  explicit StoreHome(Backend b) : backend_(b) {
    if (b == Backend::kPostgres) {
      server_ = PgServer::Shared(&why_);
    }
  }
  // Empty when the backend can run; else why not (the test skips with it).
  const std::string& unavailable() const { return why_; }
  Backend backend() const { return backend_; }
  PgServer* server() const { return server_; }
  std::string Spec(const std::string& name) {
    if (backend_ == Backend::kSqlite) return dir_.File(name);
    auto it = dbs_.find(name);
    if (it == dbs_.end()) it = dbs_.emplace(name, server_->NewDatabase()).first;
    return it->second;
  }

 private:
  Backend backend_;
  TempDir dir_;
  PgServer* server_ = nullptr;
  std::string why_;
  std::map<std::string, std::string> dbs_;
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
