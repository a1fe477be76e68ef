// Rank 1 of TensorParallelEngineTest's engine, as a process of its own:
//   tp_follower STORE_ADDRESS GROUP RANK SIZE
// Builds the fixture's model, joins the Gloo group, checks that its engine refuses requests,
// then follows rank 0 (weight updates copy its slices of the next version; the fixture's refused
// version fails) until rank 0 stops it. Exit code 0 when it was stopped, 1 on any error.
#include <cstdio>
#include <string>

#include "comm/gloo_communicator.h"
#include "comm/tensor_parallel_group.h"
#include "tp_fixture.h"

int main(int argc, char** argv) {
  using namespace gyre;
  if (argc != 5) {
    std::fprintf(stderr, "usage: tp_follower STORE_ADDRESS GROUP RANK SIZE\n");
    return 2;
  }
  const int rank = std::stoi(argv[3]), size = std::stoi(argv[4]);
  const auto spec = rollout::tp_fixture::Spec();
  const auto whole = model::Transformer::Create(spec, rollout::tp_fixture::kFirstSeed,
                                                rollout::tp_fixture::kInitStd);
  const auto next = model::Transformer::Create(spec, rollout::tp_fixture::kNextSeed,
                                               rollout::tp_fixture::kInitStd);
  comm::GlooOptions o;
  o.store_address = argv[1];
  o.group = argv[2];
  o.rank = rank;
  o.size = size;
  o.connect_timeout_s = 60;
  auto c = comm::CreateGlooCommunicator(o);
  if (!c.ok()) {
    std::fprintf(stderr, "join: %s\n", c.status().ToString().c_str());
    return 1;
  }
  comm::CommTensorParallel group(c->get(), 60);
  const auto slice = model::Transformer::TensorParallelSlice(*whole, &group);
  auto engine = rollout::RolloutEngine::Create(slice.get(), rollout::tp_fixture::TightPool());
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const Status refused = (*engine)->Add(rollout::tp_fixture::Requests());
  std::printf("requests refused: %s\n", refused.ToString().c_str());
  if (refused.ok()) return 1;
  const Status s = (*engine)->Follow(
      [&](int64_t version) {
        if (version == rollout::tp_fixture::kRefusedVersion) {
          return Unavailable("the test's follower refuses this version");
        }
        return rollout::tp_fixture::CopySlices(*next, slice.get(), rank, size);
      },
      60);
  std::printf("follow ended: %s after %lld steps\n", s.ToString().c_str(),
              static_cast<long long>((*engine)->stats().steps));
  return s.ok() ? 0 : 1;
}
