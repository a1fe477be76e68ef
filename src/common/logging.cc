#include "common/logging.h"

#include <pthread.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace gyre {

void NameThisThread(const char* name) {
  char shortened[16];
  std::snprintf(shortened, sizeof(shortened), "%s", name);
  (void)pthread_setname_np(pthread_self(), shortened);
}

void InitLogging(const std::string& process_name, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(process_name);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace gyre

namespace gyre {
namespace {
const char* g_program = "gyre";
}  // namespace

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

void InstallTerminateHandler(const char* program) {
  g_program = program;
  std::set_terminate([] {
    std::string what = "std::terminate called without an active exception";
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = "uncaught exception: " + FirstLine(ex.what());
      } catch (...) {
        what = "uncaught exception of unknown type";
      }
    }
    std::fprintf(stderr, "%s: fatal: %s\n", g_program, what.c_str());
    std::fflush(stderr);
    std::abort();
  });
}

}  // namespace gyre
