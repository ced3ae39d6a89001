#include "kv/paged_vector.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mnemo {
namespace {

// Elements never move, default-constructed on append, destroyed with the vector (std::string's
// heap buffers would leak under AddressSanitizer otherwise), across several 2 MB regions.
TEST(PagedVector, ElementsStayPutAcrossRegions) {
  PagedVector<std::string> v;
  std::vector<const std::string*> where;
  const size_t n = 3 * kHugePage / sizeof(std::string) + 5;
  for (size_t i = 0; i < n; i++) {
    std::string& s = v.emplace_back();
    EXPECT_TRUE(s.empty());
    s = "element number " + std::to_string(i) + " with a heap buffer";
    where.push_back(&s);
  }
  ASSERT_EQ(v.size(), n);
  for (size_t i = 0; i < n; i += 101) {
    EXPECT_EQ(&v[i], where[i]);
    EXPECT_EQ(v[i], "element number " + std::to_string(i) + " with a heap buffer");
  }
}

}  // namespace
}  // namespace mnemo
