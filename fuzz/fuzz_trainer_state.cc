// Fuzzes the trainer's checkpoint reader, trainer::LoadTrainerState
// (src/trainer/trainer_state.cc), on trainer_state.json, with a real PolicyTrainer. The other
// files of the directory (model.safetensors, optimizer.safetensors, config.json) are the ones
// SaveTrainerState wrote for that trainer at start-up, so a trainer_state.json that matches the
// model reaches the tensor checks and the restore. Input: trainer_state.json.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/model_fixtures.h"
#include "trainer/trainer_state.h"

namespace {

std::string* g_dir = nullptr;
gyre::trainer::PolicyTrainer* g_trainer = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  g_dir = new std::string(gyre::fuzz::ScratchDir("trainer_state"));
  g_trainer = gyre::fuzz::MakeFuzzTrainer().release();
  GYRE_CHECK(gyre::trainer::SaveTrainerState(*g_dir, *g_trainer, "").ok());
  const gyre::Status back = gyre::trainer::LoadTrainerState(*g_dir, g_trainer);
  GYRE_CHECK(back.ok()) << "the fixture trainer state does not load: " << back;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gyre::fuzz::WriteFile(*g_dir + "/trainer_state.json", data, size);
  (void)gyre::trainer::LoadTrainerState(*g_dir, g_trainer);
  return 0;
}
