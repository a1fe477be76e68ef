// Fuzzes the GGUF reader, model::GgufFile::Open (src/model/gguf.cc), and what the converter does
// with a file it accepts: the typed metadata lookups it makes and a dequantisation of every tensor
// (each of whose bytes is read, so data reaching past the mapping faults). Input: the file's
// bytes, read through a path (an in-memory file).
//
// Checks: a dequantised tensor has exactly its element count of values.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "fuzz/fuzz_util.h"
#include "model/gguf.h"

namespace {

gyre::fuzz::MemFile* g_file = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  g_file = new gyre::fuzz::MemFile("model.gguf");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g_file->Set(data, size);
  auto file = gyre::model::GgufFile::Open(g_file->path());
  if (!file.ok()) return 0;
  const auto& f = **file;
  for (const char* key : {"general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre"}) {
    (void)f.String(key);
  }
  (void)f.Uint("llama.block_count");
  (void)f.Float("llama.rope.freq_base");
  (void)f.Strings("tokenizer.ggml.tokens");
  std::vector<float> values;
  for (const auto& t : f.tensors()) {
    if (t.elements > (int64_t{1} << 24)) continue;  // the fuzzer's memory, not a finding
    if (!f.Dequantize(t, &values).ok()) continue;
    GYRE_CHECK(static_cast<int64_t>(values.size()) == t.elements)
        << t.name << ": " << values.size() << " values for " << t.elements << " elements";
  }
  return 0;
}
