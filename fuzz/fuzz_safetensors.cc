// Fuzzes the safetensors reader, model::SafetensorsFile::Open (src/model/safetensors.cc), and
// what a loader does with a file it accepts: a View of every tensor (each of whose bytes is read,
// so a view reaching past the mapping faults), Checkpoint::OpenFile, and LoadSafetensors into a
// small model's parameters (dtype conversion, shape checks). Input: the file's bytes, read
// through a path (an in-memory file).
//
// Checks: every view has exactly the bytes of its entry's [begin, end) range.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/model_fixtures.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace {

gyre::fuzz::MemFile* g_file = nullptr;
std::unique_ptr<gyre::model::Transformer>* g_model = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  g_file = new gyre::fuzz::MemFile("model.safetensors");
  g_model = new std::unique_ptr<gyre::model::Transformer>(gyre::fuzz::MakeFuzzModel());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g_file->Set(data, size);
  auto file = gyre::model::SafetensorsFile::Open(g_file->path());
  if (!file.ok()) return 0;
  for (const auto& [name, entry] : (*file)->entries()) {
    auto view = (*file)->View(name);
    if (!view.ok()) continue;
    const uint64_t nbytes = entry.end - entry.begin;
    GYRE_CHECK(static_cast<uint64_t>(view->nbytes()) == nbytes)
        << name << ": view of " << view->nbytes() << " bytes for a range of " << nbytes;
    const volatile uint8_t* p = static_cast<const uint8_t*>(view->data_ptr());
    uint8_t sum = 0;
    for (uint64_t i = 0; i < nbytes; ++i) sum ^= p[i];
    (void)sum;
  }
  auto ckpt = gyre::model::Checkpoint::OpenFile(g_file->path());
  if (ckpt.ok()) {
    for (const std::string& name : (*ckpt)->Names()) (void)(*ckpt)->View(name);
  }
  (void)gyre::model::LoadSafetensors(g_file->path(), (*g_model)->NamedParameters());
  return 0;
}
