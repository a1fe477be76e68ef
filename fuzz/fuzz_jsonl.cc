// Fuzzes the JSONL dataset loader, controller::LoadJsonl (src/controller/task.cc), then builds a
// problem stream from the dataset (ProblemSource::Create, Next, SaveState / RestoreState).
// Input: the file's bytes, read through a path (an in-memory file).
//
// Checks: a record whose prompt is a message list parses as one (LoadJsonl checked it).

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "controller/task.h"
#include "fuzz/fuzz_util.h"
#include "gyre/config.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gyre::fuzz::MemFile* const file = new gyre::fuzz::MemFile("train.jsonl");
  file->Set(data, size);
  auto problems = gyre::controller::LoadJsonl(file->path());
  if (!problems.ok()) return 0;
  for (const auto& p : *problems) {
    if (p.is_messages) {
      auto messages = gyre::text::ParseMessagesJson(p.prompt);
      GYRE_CHECK(messages.ok()) << "LoadJsonl kept a prompt that does not parse: "
                                << messages.status();
    }
  }
  gyre::DataSection section;
  section.train_path = file->path();
  section.eval_size = 4;
  auto source = gyre::controller::ProblemSource::Create(section, 7);
  GYRE_CHECK(source.ok()) << "a dataset LoadJsonl accepts does not make a problem source: "
                          << source.status();
  for (int i = 0; i < 3; ++i) (void)source->Next();
  const std::string state = source->SaveState();
  auto copy = gyre::controller::ProblemSource::Create(section, 7);
  GYRE_CHECK(copy.ok() && copy->RestoreState(state).ok()) << "SaveState does not restore";
  GYRE_CHECK(copy->Next().prompt == source->Next().prompt) << "a restored stream diverged";
  return 0;
}
