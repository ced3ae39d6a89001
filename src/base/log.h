// Logging through spdlog. Library code calls spdlog::trace/debug/info/warn/error directly with
// fmt-style formats; this file only decides where lines go and which levels pass.
//
// Levels: error = a failure nobody else will report (a store or transfer failure); warn = a
// failure a client may not see (a dropped KV copy, a request answered with a degraded result);
// info = start-up configuration and rare events (suspensions, refused admissions); debug = per-turn
// and per-eviction detail; trace = per-step detail.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "base/status.h"

namespace mnemo {

// Makes the default logger write "[time] [level] message" to stderr. Idempotent; thread-safe.
void InitLogging();

// Sets the level of the default logger: trace, debug, info, warn, error or off.
// Errors: kInvalidArgument for any other name.
Status SetLogLevel(const std::string& level);

}  // namespace mnemo
