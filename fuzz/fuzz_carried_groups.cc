// Fuzzes the partial-rollout part of a checkpoint, carried_groups.pb, through the reader that
// resuming uses, controller::ReadControllerState (src/controller/checkpoint.cc): protobuf
// parsing, the counts, then CheckCarriedGroups and CheckCarriedGroupsFit.
//
// Input: 8 bytes of policy_version and 8 of next_group_id (little-endian, top two bits dropped so
// both are valid in controller.json), then the bytes of carried_groups.pb. The target writes a
// controller.json that records this file's size, CRC-32 and counts (as WriteControllerState
// would), so the fuzzer gets past the integrity checks to the structural ones.

#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/check.h"
#include "common/crc32.h"
#include "common/logging.h"
#include "controller/checkpoint.h"
#include "fuzz/controller_fixtures.h"
#include "fuzz/fuzz_util.h"
#include "gyre/v1/checkpoint.pb.h"

namespace {

std::string* g_dir = nullptr;

uint64_t ReadLe(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n && i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v & ((uint64_t{1} << 62) - 1);
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is logged
  g_dir = new std::string(gyre::fuzz::ScratchDir("carried_groups"));
  GYRE_CHECK(
      gyre::controller::WriteControllerState(*g_dir, gyre::fuzz::FixtureControllerState()).ok());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int64_t policy_version = static_cast<int64_t>(ReadLe(data, size));
  const uint64_t next_group_id = size > 8 ? ReadLe(data + 8, size - 8) : 0;
  const size_t skip = size < 16 ? size : 16;
  const std::string bytes = gyre::fuzz::AsString(data + skip, size - skip);
  // The counts controller.json records, as WriteControllerState computes them.
  gyre::v1::CarriedGroups parsed;
  int64_t groups = 0, samples = 0, tokens = 0;
  if (parsed.ParseFromString(bytes)) {
    groups = parsed.groups_size();
    for (const auto& g : parsed.groups()) {
      samples += g.unfinished_size();
      for (const auto& u : g.unfinished()) tokens += u.response_ids_size();
    }
  }
  const gyre::controller::ControllerState fixture = gyre::fuzz::FixtureControllerState();
  nlohmann::json j = {{"format", "gyre.controller_state"},
                      {"format_version", 2},
                      {"grpo_step", fixture.grpo_step},
                      {"policy_version", policy_version},
                      {"next_group_id", next_group_id},
                      {"problem_stream", fixture.problem_stream},
                      {"accuracy_before_rl", 0.0},
                      {"final_mean_reward", 0.0},
                      {"wall_seconds", 1.0},
                      {"data_fingerprints", nlohmann::json::object()},
                      {"carried_groups",
                       {{"groups", groups},
                        {"unfinished_samples", samples},
                        {"unfinished_tokens", tokens},
                        {"bytes", bytes.size()},
                        {"crc32", Hex32(gyre::Crc32(bytes.data(), bytes.size()))}}}};
  gyre::fuzz::WriteFile(*g_dir + "/carried_groups.pb", bytes);
  gyre::fuzz::WriteFile(*g_dir + "/controller.json", j.dump());
  auto state = gyre::controller::ReadControllerState(*g_dir);
  if (!state.ok()) return 0;
  GYRE_CHECK(static_cast<int64_t>(state->carried_groups.size()) == groups);
  (void)gyre::controller::CheckCarriedGroupsFit(state->carried_groups,
                                                gyre::fuzz::FixtureJobConfig(), "checkpoint");
  return 0;
}
