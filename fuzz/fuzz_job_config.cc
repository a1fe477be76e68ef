// Fuzzes the job-file loader, config::ParseJobConfig (src/config/config_parse.cc): YAML text, then
// `--set` overrides, then ValidateJobConfig. Input: the YAML text, optionally followed by a NUL
// byte and NUL-separated "key=value" overrides.
//
// Besides "no crash", it checks the round trip config.h promises: DumpJobConfig of any config
// that loaded parses back to the same values (ConfigValues).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "config/config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = gyre::fuzz::AsString(data, size);
  const size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  for (size_t p = nul; p != std::string::npos && overrides.size() < 16;) {
    const size_t next = input.find('\0', p + 1);
    overrides.push_back(input.substr(p + 1, next == std::string::npos ? next : next - p - 1));
    p = next;
  }
  auto cfg = gyre::config::ParseJobConfig(yaml, "fuzz.yaml", overrides);
  if (!cfg.ok()) return 0;
  GYRE_CHECK(gyre::config::ValidateJobConfig(*cfg).ok()) << "a loaded config fails validation";
  const std::string dumped = gyre::config::DumpJobConfig(*cfg);
  auto again = gyre::config::ParseJobConfig(dumped, "dumped.yaml");
  GYRE_CHECK(again.ok()) << "DumpJobConfig output does not load: " << again.status() << "\n"
                         << dumped;
  GYRE_CHECK(gyre::config::ConfigValues(*again) == gyre::config::ConfigValues(*cfg))
      << "DumpJobConfig -> ParseJobConfig changed the config:\n"
      << dumped;
  return 0;
}
