#pragma once
// Logging goes through spdlog. Each process names itself once (controller, rollout-0, ...);
// every line carries that name so interleaved logs stay readable.

#include <spdlog/spdlog.h>

#include <string>

namespace gyre {

// Sets the process-wide logger name and level ("trace".."critical", "off"). Thread-safe.
void InitLogging(const std::string& process_name, const std::string& level = "info");

// Makes an exception that escapes a thread (std::terminate) print one line,
// "PROGRAM: fatal: uncaught exception: WHAT", to stderr before the process aborts, so a worker's
// log and the controller's message say what killed it. Call once, early in main.
void InstallTerminateHandler(const char* program);

// Names the calling thread (at most 15 characters are kept), so `top -H`, /proc/PID/task and
// gdb tell Gyre's threads apart. Thread-safe.
void NameThisThread(const char* name);

// The first line of an exception message (c10 appends a C++ backtrace after it).
std::string FirstLine(const std::string& text);

}  // namespace gyre

#define GYRE_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define GYRE_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define GYRE_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
#define GYRE_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
