#pragma once
// The web page `sieve serve` serves at GET / (webui/ in the repository): its files are embedded
// into the binary at build time by cmake/embed_files.cmake, so nothing is installed beside it.
#include <span>
#include <string_view>

namespace sieve::server {

// One file of the page, in static storage.
struct WebAsset {
  std::string_view path;          // URL path: "/" for index.html, else "/webui/..."
  std::string_view content_type;  // e.g. "text/javascript; charset=utf-8"
  std::string_view body;
};

// Every file of the page (library sieve_webui; the source is generated into the build folder).
std::span<const WebAsset> embedded_web_assets();

}  // namespace sieve::server
