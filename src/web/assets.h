// The status page that mnemo serve shows at "/": one HTML page and the uPlot chart library,
// compiled into the binary (see CMakeLists.txt). The page polls GET /metrics once a second.
#pragma once

#include <string>
#include <string_view>

namespace mnemo::web {

// The embedded file served at `path`: "/" (or "/index.html") is the page, "/uPlot.iife.min.js"
// and "/uPlot.min.css" the chart library. Returns an empty view for any other path; otherwise
// sets *content_type (if not null) to the value for the Content-Type header. The bytes live for
// the whole program; the call is thread-safe and cheap (a scan of three entries).
std::string_view Asset(std::string_view path, std::string* content_type);

}  // namespace mnemo::web
