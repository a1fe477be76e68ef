#pragma once
// Logging goes through spdlog. Each process names itself once (controller, rollout-0, ...);
// every line carries that name so interleaved logs stay readable.

#include <spdlog/spdlog.h>

#include <string>

namespace gyre {

// Sets the process-wide logger name and level ("trace".."critical", "off"). Thread-safe.
void InitLogging(const std::string& process_name, const std::string& level = "info");

}  // namespace gyre

#define GYRE_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define GYRE_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define GYRE_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
#define GYRE_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
