// Fuzzes the controller's checkpoint reader, controller::ReadControllerState
// (src/controller/checkpoint.cc), on controller.json; the other files of the checkpoint directory
// (carried_groups.pb, config.yaml, metrics.jsonl) are the fixture's (controller_fixtures.h), so a
// controller.json that records them correctly reaches the carried-groups checks. What resuming
// does next with an accepted state runs too: the problem stream's RestoreState and the
// carried groups' fit with the saved config. Input: controller.json.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "config/config.h"
#include "controller/checkpoint.h"
#include "controller/task.h"
#include "fuzz/controller_fixtures.h"
#include "fuzz/fuzz_util.h"

namespace {

std::string* g_dir = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  g_dir = new std::string(gyre::fuzz::ScratchDir("controller_state"));
  GYRE_CHECK(
      gyre::controller::WriteControllerState(*g_dir, gyre::fuzz::FixtureControllerState()).ok());
  auto back = gyre::controller::ReadControllerState(*g_dir);
  GYRE_CHECK(back.ok()) << "the fixture checkpoint does not load: " << back.status();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gyre::fuzz::WriteFile(*g_dir + "/controller.json", data, size);
  auto state = gyre::controller::ReadControllerState(*g_dir);
  if (!state.ok()) return 0;
  const gyre::JobConfig config = gyre::fuzz::FixtureJobConfig();
  auto source = gyre::controller::ProblemSource::Create(config.data, config.job.seed);
  GYRE_CHECK(source.ok()) << source.status();
  if (source->RestoreState(state->problem_stream).ok()) (void)source->Next();
  auto saved = gyre::config::ParseJobConfig(state->config_yaml, "config.yaml");
  GYRE_CHECK(saved.ok()) << saved.status();
  (void)gyre::controller::CheckCarriedGroupsFit(state->carried_groups, *saved, "checkpoint");
  return 0;
}
