#include "web/assets.h"

#include "web/assets_data.h"

namespace mnemo::web {

std::string_view Asset(std::string_view path, std::string* content_type) {
  if (path == "/index.html") path = "/";
  for (int i = 0; i < internal::kAssetCount; i++) {
    const internal::EmbeddedAsset& a = internal::kAssets[i];
    if (path == a.path) {
      if (content_type) *content_type = a.content_type;
      return {a.data, a.size};
    }
  }
  return {};
}

}  // namespace mnemo::web
