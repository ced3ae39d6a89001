#include "web/assets.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace mnemo::web {
namespace {

std::string ReadSource(const std::string& rel) {
  std::ifstream in(std::string(MNEMO_SOURCE_DIR) + "/" + rel, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(WebAssets, PageIsTheSourceFileByteForByte) {
  std::string type;
  std::string_view page = Asset("/", &type);
  EXPECT_EQ(type, "text/html; charset=utf-8");
  const std::string src = ReadSource("src/web/index.html");
  ASSERT_FALSE(src.empty());
  EXPECT_EQ(page, src);
  EXPECT_EQ(Asset("/index.html", nullptr), page);
}

TEST(WebAssets, ChartLibraryIsEmbeddedWithItsTypes) {
  std::string type;
  std::string_view js = Asset("/uPlot.iife.min.js", &type);
  EXPECT_EQ(type, "text/javascript; charset=utf-8");
  EXPECT_EQ(js, ReadSource("src/web/node_modules/uplot/dist/uPlot.iife.min.js"));
  EXPECT_NE(js.find("uPlot"), std::string_view::npos);
  std::string_view css = Asset("/uPlot.min.css", &type);
  EXPECT_EQ(type, "text/css; charset=utf-8");
  EXPECT_NE(css.find(".uplot"), std::string_view::npos);
}

TEST(WebAssets, PageReferencesOnlyEmbeddedAssets) {
  std::string_view page = Asset("/", nullptr);
  for (const char* ref : {"src=\"uPlot.iife.min.js\"", "href=\"uPlot.min.css\""}) {
    EXPECT_NE(page.find(ref), std::string_view::npos) << ref;
  }
  EXPECT_EQ(page.find("http://"), std::string_view::npos) << "the page must not load anything from elsewhere";
  EXPECT_EQ(page.find("https://"), std::string_view::npos);
}

TEST(WebAssets, UnknownPathsAreEmpty) {
  std::string type = "unchanged";
  EXPECT_TRUE(Asset("/metrics", &type).empty());
  EXPECT_TRUE(Asset("", &type).empty());
  EXPECT_TRUE(Asset("/uPlot.iife.min.js/", &type).empty());
  EXPECT_EQ(type, "unchanged");
}

}  // namespace
}  // namespace mnemo::web
