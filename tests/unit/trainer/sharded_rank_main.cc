// One trainer rank of sharded_trainer_test, as its own process: joins a Gloo group through the
// test's store, trains the fixed batch of that test (a policy-gradient step, then an SFT step)
// with the layout it is given, and writes what the test compares.
//
//   sharded_rank STORE GROUP RANK RANKS SHARD OUT [flag ...]
//
// SHARD: none | optimizer | gradients | parameters. Flags: model=tiny|qwen3 (tied embeddings,
// q/k norms and attention biases), minis=M (mini-batches of the policy-gradient step),
// micro=K (micro-batch size), steps=S (the first S of the two steps; 2), dtype=bfloat16,
// checkpointing, timeout=S (each collective's deadline; 60), leave_after=S (this rank exits
// after S steps, as a trainer that died would; the others go on and must fail cleanly),
// kl (a KL term against the
// reference, and SequenceKl of the batch), load=DIR (every rank restores the trainer state in DIR
// first, trainer_state.h), start=K (begin with step K of the two), save=DIR (every rank saves the
// trainer state into DIR after the steps), tp=T (tensor parallel: RANKS = DP x T processes; rank
// r is tensor-parallel rank r % T of data-parallel rank r / T, SHARD applies to the data-parallel
// groups), heads=Q/KV (query and key/value heads), vocab=V (a larger vocabulary than the batch
// uses), clip=C (the gradient-norm clip; 0.5), keep (shard parameters: layers stay gathered from
// their forward to their backward, reshard_after_forward false), ranges=E (shard parameters:
// after the steps every unit is also gathered in ranges of E elements, as a publish does, in
// bfloat16 and in float32; tensor parallel: every tensor in pieces of E rows). Rank 0 writes OUT
// (the whole float32 weights after the steps, concatenated in NamedParameters() order) and
// OUT.metrics ("step key value" lines; step -1 "gathers": the all-gathers of parameter units the
// steps posted, with shard parameters; with ranges, step -1 "range_pieces" and "range_mismatch":
// the ranges gathered and the largest difference from the whole weights cast the same way). Exits 0
// on success, 1 with a message on stderr otherwise.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/gloo_communicator.h"
#include "model/transformer.h"
#include "testing/train_batch.h"
#include "trainer/policy_trainer.h"
#include "trainer/trainer_state.h"

namespace gyre::trainer {
namespace {

model::ModelSpec SpecNamed(const std::string& name) {
  model::ModelSpec s;
  s.vocab_size = 24;
  s.hidden_size = 32;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 8;
  s.intermediate_size = 48;
  s.max_seq_len = 32;
  s.tie_embeddings = false;
  if (name == "qwen3") {
    s.num_layers = 3;
    s.tie_embeddings = true;
    s.qk_norm = true;
    s.attention_bias = true;
  }
  return s;
}

using testing::RankShard;

int Fail(const std::string& what) {
  std::cerr << "sharded_rank: " << what << "\n";
  return 1;
}

int Run(int argc, char** argv) {
  if (argc < 7) return Fail("usage: sharded_rank STORE GROUP RANK RANKS SHARD OUT [flag ...]");
  const std::string store = argv[1], group_name = argv[2];
  const int rank = std::atoi(argv[3]), ranks = std::atoi(argv[4]);
  const std::string out_path = argv[6];
  StatusOr<Shard> shard = ParseShard(argv[5]);
  if (!shard.ok()) return Fail(shard.status().message());
  std::map<std::string, std::string> flags;
  for (int i = 7; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    flags[a.substr(0, eq)] = eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  auto flag = [&](const std::string& k, const std::string& d) {
    return flags.count(k) ? flags[k] : d;
  };
  model::ModelSpec spec = SpecNamed(flag("model", "tiny"));
  if (flags.count("heads")) {  // heads=Q/KV: query and key/value heads
    const std::string h = flags["heads"];
    spec.num_heads = std::atoi(h.c_str());
    spec.num_kv_heads = std::atoi(h.substr(h.find('/') + 1).c_str());
  }
  if (flags.count("vocab")) spec.vocab_size = std::atoi(flags["vocab"].c_str());
  const int minis = std::atoi(flag("minis", "1").c_str());
  const bool kl = flags.count("kl") > 0;
  const int tp = std::atoi(flag("tp", "1").c_str());
  if (tp < 1 || ranks % tp != 0) return Fail("tp must divide RANKS");
  const int dp_ranks = ranks / tp, dp_rank = rank / tp, tp_rank = rank % tp;
  const double timeout = std::atof(flag("timeout", "60").c_str());

  at::set_num_threads(1);
  PolicyTrainer t(model::Transformer::Create(spec, 3, 0.1), 1e-2, 0.01, 0.9, 0.999);
  if (flag("dtype", "float32") == "bfloat16") t.SetComputeDtype(at::kBFloat16);
  t.SetActivationCheckpointing(flags.count("checkpointing") > 0);
  if (flags.count("chunk")) t.SetLogprobChunkTokens(std::atoi(flags["chunk"].c_str()));
  if (Status s = t.SetSharding(*shard); !s.ok()) return Fail(s.message());
  auto join = [&](const std::string& name, int member,
                  int size) -> StatusOr<std::unique_ptr<comm::Communicator>> {
    comm::GlooOptions o;
    o.store_address = store;
    o.group = name;
    o.rank = member;
    o.size = size;
    return comm::CreateGlooCommunicator(o);
  };
  std::unique_ptr<comm::Communicator> group, tp_group;
  if (tp > 1) {
    auto g = join(group_name + "-tp" + std::to_string(dp_rank), tp_rank, tp);
    if (!g.ok()) return Fail(g.status().message());
    tp_group = std::move(*g);
    // Every member is connected before any of them may leave (a refused layout exits at once).
    if (Status s = tp_group->Barrier(comm::DeadlineAfter(timeout)); !s.ok()) {
      return Fail(s.message());
    }
    if (Status s = t.SetTensorParallel(tp_group.get(), timeout); !s.ok()) return Fail(s.message());
  }
  if (dp_ranks > 1) {
    auto g =
        join(tp > 1 ? group_name + "-dp" + std::to_string(tp_rank) : group_name, dp_rank, dp_ranks);
    if (!g.ok()) return Fail(g.status().message());
    group = std::move(*g);
    DataParallelOptions dp;
    dp.bucket_bytes = 4096;
    dp.timeout_s = timeout;
    dp.reshard_after_forward = flags.count("keep") == 0;
    if (Status s = t.SetDataParallel(group.get(), dp); !s.ok()) return Fail(s.message());
  }
  if (flags.count("load")) {
    if (Status s = LoadTrainerState(flags["load"], &t); !s.ok())
      return Fail("load: " + s.message());
  }
  std::ofstream metrics;
  if (rank == 0) metrics.open(out_path + ".metrics");
  metrics.precision(10);
  const std::vector<TrainSample> batch = testing::SmallTrainBatch();
  const int start = std::atoi(flag("start", "0").c_str());
  int step = 0;
  const int steps = std::atoi(flag("steps", "2").c_str());
  const int leave_after = std::atoi(flag("leave_after", "-1").c_str());
  for (auto objective : {Objective::kPolicyGradient, Objective::kSft}) {
    if (step >= steps) break;
    if (step == leave_after) std::_Exit(0);
    if (step < start) {
      ++step;
      continue;
    }
    const int m = objective == Objective::kSft ? 1 : minis;
    TrainOptions opts;
    opts.micro_batch_size = std::atoi(flag("micro", "2").c_str());
    opts.grad_clip = std::atof(flag("clip", "0.5").c_str());  // must use the global norm
    opts.mini_batches = m;
    if (flags.count("entropy") && objective == Objective::kPolicyGradient) {
      opts.entropy_coef = 0.05;  // the entropy bonus: entropies with their gradient
    }
    if (kl && objective == Objective::kPolicyGradient) {
      opts.loss.kl = kernels::KlKind::kK3;
      opts.loss.kl_coef = 0.5f;
    }
    const std::vector<TrainSample> part = RankShard(batch, dp_ranks, dp_rank, m, &opts);
    auto result = t.Step(part, objective, 1e-2, opts);
    if (!result.ok())
      return Fail("step " + std::to_string(step) + ": " + result.status().message());
    for (const auto& [k, v] : *result) {
      if (rank == 0) metrics << step << " " << k << " " << v << "\n";
    }
    ++step;
  }
  if (rank == 0 && t.parameter_shards() != nullptr) {
    metrics << -1 << " gathers " << t.parameter_shards()->gathers() << "\n";
  }
  if (kl) {
    // The KL of this rank's samples to the reference after the steps (the policy moved), one
    // "sample value" line each in OUT.klR.
    TrainOptions opts;
    std::vector<size_t> indices;
    const std::vector<TrainSample> part = RankShard(batch, dp_ranks, dp_rank, 1, &opts, &indices);
    auto kls = t.SequenceKl(part, kernels::KlKind::kK3, 1.0, 2);
    if (!kls.ok()) return Fail("SequenceKl: " + kls.status().message());
    std::ofstream kl_out(out_path + ".kl" + std::to_string(dp_rank) +
                         (tp_rank > 0 ? ".tp" + std::to_string(tp_rank) : ""));
    kl_out.precision(10);
    for (size_t i = 0; i < indices.size(); ++i) kl_out << indices[i] << " " << (*kls)[i] << "\n";
  }
  if (flags.count("save")) {
    if (Status s = SaveTrainerState(flags["save"], t, ""); !s.ok()) {
      return Fail("save: " + s.message());
    }
  }
  auto weights = t.FullWeights();
  if (!weights.ok()) return Fail("FullWeights: " + weights.status().message());
  if (flags.count("ranges") && (t.tp_size() > 1 || t.gathers_ranges())) {
    // Every rank gathers the same pieces (collectives); rank 0 compares them with the whole
    // weights. Tensor parallel: every tensor in pieces of E whole rows (cut where a row split
    // changes rank). Otherwise every unit in ranges of E elements, in bfloat16 and float32.
    const int64_t span = std::atoll(flags["ranges"].c_str());
    const std::vector<model::ParameterUnit> units = model::ParameterUnits(t.model().spec());
    double worst = 0;
    int64_t pieces = 0;
    size_t k = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < units[u].names.size(); ++i, ++k) {
        const at::Tensor whole = (*weights)[k].second.detach().to(at::kFloat);
        parts.push_back(whole.reshape({-1}));
        if (t.tp_size() == 1) continue;
        const std::string& name = units[u].names[i];
        const int64_t extent = whole.size(0);
        std::vector<int64_t> ends = {extent};
        if (model::TensorParallelDim(name) == 0) {
          for (int r = 0; r < t.tp_size(); ++r) {
            ends.push_back(model::TensorParallelRange(name, extent, r, t.tp_size()).second);
          }
        }
        for (int64_t row = 0; row < extent;) {
          int64_t n = std::min(span, extent - row);
          for (int64_t e : ends) {
            if (e > row) n = std::min(n, e - row);
          }
          auto rows = t.GatherWholeRows(static_cast<int>(u), static_cast<int>(i), row, n);
          if (!rows.ok()) return Fail("GatherWholeRows: " + rows.status().message());
          worst = std::max(worst, (*rows - whole.narrow(0, row, n)).abs().max().item<double>());
          ++pieces;
          row += n;
        }
      }
      if (t.tp_size() > 1) continue;
      const at::Tensor whole = at::cat(parts);
      for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
        for (int64_t begin = 0; begin < whole.numel(); begin += span) {
          const int64_t n = std::min(span, whole.numel() - begin);
          const at::Tensor out = at::empty({n}, at::TensorOptions().dtype(dtype));
          if (Status s = t.GatherUnitRange(static_cast<int>(u), begin, out); !s.ok()) {
            return Fail("GatherUnitRange: " + s.message());
          }
          const at::Tensor want = whole.narrow(0, begin, n).to(dtype).to(at::kFloat);
          worst = std::max(worst, (out.to(at::kFloat) - want).abs().max().item<double>());
          ++pieces;
        }
      }
    }
    if (rank == 0) {
      metrics << -1 << " range_pieces " << pieces << "\n-1 range_mismatch " << worst << "\n";
    }
  }
  if (rank == 0) {
    std::vector<at::Tensor> parts;
    for (const auto& [name, w] : *weights) parts.push_back(w.detach().to(at::kFloat).reshape({-1}));
    const at::Tensor flat = at::cat(parts).contiguous();
    std::FILE* f = std::fopen(out_path.c_str(), "wb");
    if (f == nullptr) return Fail("cannot write " + out_path);
    const size_t n = static_cast<size_t>(flat.numel());
    const bool wrote = std::fwrite(flat.data_ptr<float>(), sizeof(float), n, f) == n;
    if (std::fclose(f) != 0 || !wrote) return Fail("cannot write " + out_path);
  }
  return 0;
}

}  // namespace
}  // namespace gyre::trainer

int main(int argc, char** argv) { return gyre::trainer::Run(argc, argv); }
