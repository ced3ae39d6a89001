// The table that embed.cmake generates (web_assets_data.cpp in the build tree).
#pragma once

#include <cstddef>

namespace mnemo::web::internal {

struct EmbeddedAsset {
  const char* path;          // URL path, e.g. "/"
  const char* content_type;  // Content-Type header value
  const char* data;          // the file's bytes (followed by a NUL not counted in size)
  size_t size;               // bytes
};

extern const EmbeddedAsset kAssets[];
extern const int kAssetCount;

}  // namespace mnemo::web::internal
