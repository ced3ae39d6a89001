#include "base/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>
#include <utility>

namespace mnemo {

void InitLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Not the colour sink: the lines often go to a file or a journal.
    auto logger = spdlog::stderr_logger_mt("mnemo");
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    logger->flush_on(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  });
}

Status SetLogLevel(const std::string& level) {
  // Our names, not spdlog's ("warning", "err").
  static constexpr std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, l] : kLevels) {
    if (level == name) {
      spdlog::set_level(l);
      return Status::Ok();
    }
  }
  return MakeError(StatusCode::kInvalidArgument, "unknown log level '%s' (trace, debug, info, warn, error, off)",
                   level.c_str());
}

}  // namespace mnemo
