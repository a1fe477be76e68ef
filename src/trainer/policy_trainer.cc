#include "trainer/policy_trainer.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

#include "algorithm/registry.h"
#include "comm/tensor_parallel_group.h"
#include "common/check.h"
#include "kernels/policy_loss_terms.h"
#include "ops/ops.h"
#include "trainer/grad_reducer.h"
#include "trainer/user_losses.h"

namespace gyre::trainer {

struct PolicyTrainer::Optimizer {
  std::unique_ptr<torch::optim::AdamW> adamw;
  std::vector<at::Tensor> params;
};

struct PolicyTrainer::Snapshot {
  int64_t version = 0;
  // Per parameter, in Optimizer::params order. steps[i] == 0: no AdamW state yet (the moments'
  // buffers are then stale and unused).
  std::vector<at::Tensor> weights, exp_avg, exp_avg_sq;
  std::vector<int64_t> steps;
  ShardedAdamW::State sharded;  // a sharded trainer's optimizer slice (the vectors above unused)
};

namespace {

// `weights` (one per parameter, NamedParameters() order) named as the units of `shards` list them.
StatusOr<model::NamedTensors> NamedAsUnits(const ParameterShards& shards,
                                           const std::vector<at::Tensor>& weights) {
  model::NamedTensors named;
  for (int u = 0; u < shards.num_units(); ++u) {
    for (const std::string& name : shards.unit(u).names) {
      named.emplace_back(name,
                         named.size() < weights.size() ? weights[named.size()] : at::Tensor());
    }
  }
  if (weights.size() != named.size()) {
    return InvalidArgument("expected " + std::to_string(named.size()) + " weights, got " +
                           std::to_string(weights.size()));
  }
  return named;
}

// kParameters: a failed collective inside a forward or backward (a gather asked for by the model)
// surfaces as an exception; the public calls turn it into a Status after `cleanup`.
template <typename T, typename Fn, typename Cleanup>
StatusOr<T> CatchCollectiveFailure(bool split, Fn fn, Cleanup cleanup) {
  if (!split) return fn();
  try {
    return fn();
  } catch (const std::exception& e) {
    cleanup();
    return Unavailable(std::string("fully sharded step failed: ") + e.what());
  }
}

}  // namespace

PolicyTrainer::PolicyTrainer(std::unique_ptr<model::Transformer> model, double lr,
                             double weight_decay, double beta1, double beta2)
    : model_(std::move(model)),
      units_(model::ParameterUnits(model_->spec())),
      optimizer_(std::make_unique<Optimizer>()) {
  for (const auto& [name, t] : model_->NamedParameters()) optimizer_->params.push_back(t);
  torch::optim::AdamWOptions opts(lr);
  opts.weight_decay(weight_decay).betas({beta1, beta2});
  optimizer_->adamw = std::make_unique<torch::optim::AdamW>(optimizer_->params, opts);
  hyper_.weight_decay = weight_decay;
  hyper_.beta1 = beta1;
  hyper_.beta2 = beta2;
  hyper_.eps = opts.eps();
}

Status PolicyTrainer::SetTensorParallel(comm::Communicator* comm, double timeout_s) {
  if (comm == nullptr || comm->size() == 1) return Status::Ok();
  if (tp_group_ != nullptr) {
    return FailedPrecondition("this trainer already holds a tensor-parallel slice");
  }
  if (shards_ != nullptr) {
    return FailedPrecondition(
        "tensor parallelism is set up before the parameters are split (trainer.shard: "
        "parameters splits them at the first step)");
  }
  if (!optimizer_->adamw->state().empty() || (sharded_ && sharded_->has_state()) ||
      reference_ != nullptr || version_ != 0) {
    return FailedPrecondition("tensor parallelism is set up before the first step");
  }
  GYRE_RETURN_IF_ERROR(model::CheckTensorParallel(model_->spec(), comm->size()));
  auto group = std::make_unique<comm::CommTensorParallel>(comm, timeout_s);
  tp_comm_ = group.get();
  tp_group_ = std::move(group);
  model_ = model::Transformer::TensorParallelSlice(*model_, tp_group_.get());
  // A new optimizer over the slices, with the same settings.
  const auto defaults =
      static_cast<const torch::optim::AdamWOptions&>(optimizer_->adamw->defaults());
  optimizer_ = std::make_unique<Optimizer>();
  tp_split_.clear();
  for (const auto& [name, t] : model_->NamedParameters()) {
    optimizer_->params.push_back(t);
    tp_split_.push_back(model::TensorParallelDim(name) >= 0);
  }
  optimizer_->adamw = std::make_unique<torch::optim::AdamW>(optimizer_->params, defaults);
  if (sharded_) {  // ZeRO-1/2 over the slices: this rank's part of them among its DP group
    sharded_ = std::make_unique<ShardedAdamW>(optimizer_->params, shard_mode_, hyper_, dp_rank(),
                                              dp_size());
  }
  if (dp_ != nullptr) {  // the gradient reducer hooks the new parameters
    DataParallelOptions dp = dp_options_;
    return SetDataParallel(dp_, dp);
  }
  return Status::Ok();
}

Status PolicyTrainer::SetSharding(Shard mode) {
  if (mode == sharding()) return Status::Ok();
  const bool has_state =
      sharded_ != nullptr ? sharded_->has_state() : !optimizer_->adamw->state().empty();
  if (has_state || shards_ != nullptr) {
    return FailedPrecondition(std::string("trainer.shard cannot change to '") + ShardName(mode) +
                              "' once the optimizer has state");
  }
  sharded_.reset();
  if (mode != Shard::kNone) {
    for (const auto& p : optimizer_->params) {
      if (p.scalar_type() != at::kFloat || !p.is_contiguous()) {
        return FailedPrecondition("trainer.shard needs contiguous float32 weights");
      }
    }
  }
  shard_mode_ = mode;
  // kParameters splits the model at its first step (ShardParameters).
  if (mode == Shard::kOptimizer || mode == Shard::kGradients) {
    sharded_ =
        std::make_unique<ShardedAdamW>(optimizer_->params, mode, hyper_, dp_rank(), dp_size());
  }
  // ZeRO-2 reduce-scatters instead of all-reducing: rebuild the reducer for the new mode.
  if (dp_ != nullptr) {
    DataParallelOptions dp = dp_options_;
    return SetDataParallel(dp_, dp);
  }
  return Status::Ok();
}

Status PolicyTrainer::ShardParameters() {
  if (shard_mode_ != Shard::kParameters || shards_ != nullptr) return Status::Ok();
  const model::ModelSpec spec = model_->spec();
  const at::Device device = model_->device();
  auto queue = std::make_unique<CollectiveQueue>(dp_, dp_timeout_s_);
  // Tensor parallel: the units of this rank's slices, split over its data-parallel group.
  const std::vector<model::ParameterUnit> units =
      model::TensorParallelUnits(spec, tp_rank(), tp_size());
  GYRE_ASSIGN_OR_RETURN(auto shards, ParameterShards::Create(spec, model_->NamedParameters(),
                                                             queue.get(), compute_dtype_, device,
                                                             /*trainable=*/true, units));
  shards->set_reduce_staging_bytes(dp_options_.bucket_bytes);
  shards->set_reshard_after_forward(dp_options_.reshard_after_forward);
  std::unique_ptr<ParameterShards> ref_shards;
  if (reference_ != nullptr) {
    GYRE_ASSIGN_OR_RETURN(ref_shards, ParameterShards::Create(spec, reference_->NamedParameters(),
                                                              queue.get(), compute_dtype_, device,
                                                              /*trainable=*/false, units));
  }
  // AdamW state the whole model had (a checkpoint restored before the split) goes with the
  // slices.
  const std::vector<ParamState> whole_state = OptimizerState();
  bool has_state = false;
  for (const ParamState& ps : whole_state) has_state = has_state || ps.step > 0;
  if (has_state) GYRE_RETURN_IF_ERROR(CheckSliceState(*shards, whole_state));
  // Everything made: let the whole model go.
  const bool checkpointing = model_->activation_checkpointing();
  optimizer_->adamw.reset();
  optimizer_->params = shards->masters();
  model_ =
      model::Transformer::Gathered(spec, shards.get(), compute_dtype_, device, tp_group_.get());
  model_->SetActivationCheckpointing(checkpointing);
  if (ref_shards != nullptr) {
    reference_ = model::Transformer::Gathered(spec, ref_shards.get(), compute_dtype_, device,
                                              tp_group_.get());
    reference_compute_.reset();
  }
  // The slices' AdamW state: one rank's ShardedAdamW over them (the same arithmetic as
  // torch::optim::AdamW, element for element).
  sharded_ = std::make_unique<ShardedAdamW>(optimizer_->params, Shard::kOptimizer, hyper_, 0, 1);
  queue_ = std::move(queue);
  shards_ = std::move(shards);
  ref_shards_ = std::move(ref_shards);
  if (has_state) InstallSliceState(whole_state);
  return Status::Ok();
}

Status PolicyTrainer::CheckSliceState(const ParameterShards& shards,
                                      const std::vector<ParamState>& state) {
  size_t count = 0;
  for (int u = 0; u < shards.num_units(); ++u) count += shards.unit(u).names.size();
  if (state.size() != count) {
    return InvalidArgument("optimizer state for " + std::to_string(state.size()) +
                           " parameters, the model has " + std::to_string(count));
  }
  size_t k = 0;
  for (int u = 0; u < shards.num_units(); ++u) {
    const model::ParameterUnit& unit = shards.unit(u);
    for (size_t i = 0; i < unit.names.size(); ++i, ++k) {
      const ParamState& ps = state[k];
      if (ps.step < 0)
        return InvalidArgument("optimizer step of '" + unit.names[i] + "' is negative");
      if (ps.step == 0) continue;
      for (const at::Tensor* t : {&ps.exp_avg, &ps.exp_avg_sq}) {
        if (t->defined() && (!at::isFloatingType(t->scalar_type()) ||
                             t->sizes() != at::IntArrayRef(unit.shapes[i]))) {
          return InvalidArgument("optimizer moments of '" + unit.names[i] +
                                 "' do not match the parameter's shape");
        }
      }
    }
  }
  return Status::Ok();
}

void PolicyTrainer::InstallSliceState(const std::vector<ParamState>& state) {
  // Unit by unit straight into the slices' optimizer: no more than one unit's slice is made
  // besides the state itself.
  std::vector<int64_t> steps;
  int64_t offset = 0;
  size_t k = 0;
  for (int u = 0; u < shards_->num_units(); ++u) {
    std::vector<at::Tensor> um, uv;
    int64_t step = 0;
    for (size_t i = 0; i < shards_->unit(u).names.size(); ++i, ++k) {
      step = std::max(step, state[k].step);
      um.push_back(state[k].step > 0 ? state[k].exp_avg : at::Tensor());
      uv.push_back(state[k].step > 0 ? state[k].exp_avg_sq : at::Tensor());
    }
    StatusOr<at::Tensor> sm = shards_->SliceOf(u, um);
    StatusOr<at::Tensor> sv = shards_->SliceOf(u, uv);
    GYRE_CHECK(sm.ok() && sv.ok()) << "AdamW state checked by CheckSliceState";
    sharded_->SetMomentRange(offset, *sm, *sv);
    offset += sm->numel();
    steps.push_back(step);
  }
  sharded_->SetSteps(steps);
}

Status PolicyTrainer::RestoreSplitState(const std::vector<at::Tensor>& weights,
                                        const std::vector<ParamState>& state, int64_t version) {
  if (tp_group_ != nullptr && shard_mode_ != Shard::kParameters) {
    // This rank's slices of the whole tensors (checked and copied by RestoreState).
    std::vector<ParamState> mine = state;
    const model::NamedTensors params = model_->NamedParameters();
    for (size_t i = 0; i < mine.size() && i < params.size(); ++i) {
      const std::string& name = params[i].first;
      auto cut = [&](const at::Tensor& t) {
        return t.defined() ? model::TensorParallelSliceOf(name, t, tp_rank(), tp_size()) : t;
      };
      mine[i].exp_avg = cut(mine[i].exp_avg);
      mine[i].exp_avg_sq = cut(mine[i].exp_avg_sq);
      if (mine[i].step > 0 && !mine[i].exp_avg.defined()) {
        mine[i].exp_avg = at::zeros_like(optimizer_->params[i]);
      }
      if (mine[i].step > 0 && !mine[i].exp_avg_sq.defined()) {
        mine[i].exp_avg_sq = at::zeros_like(optimizer_->params[i]);
      }
    }
    if (!sharded_) return RestoreState(SlicesOf(weights), mine, version);
    // ZeRO-1/2 over the slices: this rank's part of each slice's moments.
    const std::vector<at::Tensor> slices = SlicesOf(weights);
    GYRE_RETURN_IF_ERROR(CheckWeights(slices));
    if (version < 0) return InvalidArgument("negative policy version " + std::to_string(version));
    if (mine.size() != params.size()) {
      return InvalidArgument("optimizer state for " + std::to_string(mine.size()) +
                             " parameters, the model has " + std::to_string(params.size()));
    }
    std::vector<int64_t> steps;
    std::vector<at::Tensor> m, v;
    for (const ParamState& ps : mine) {
      steps.push_back(ps.step);
      m.push_back(ps.step > 0 ? ps.exp_avg : at::Tensor());
      v.push_back(ps.step > 0 ? ps.exp_avg_sq : at::Tensor());
    }
    GYRE_RETURN_IF_ERROR(sharded_->SetFromWhole(steps, m, v));  // checks first, then commits
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.detach().copy_(slices[i]);
    version_ = version;
    return Status::Ok();
  }
  if (shard_mode_ != Shard::kParameters) {
    return FailedPrecondition("RestoreSplitState needs trainer.shard: parameters");
  }
  if (version < 0) return InvalidArgument("negative policy version " + std::to_string(version));
  GYRE_RETURN_IF_ERROR(ShardParameters());
  // Tensor parallel: this rank's slices of the whole tensors, which the shards then split.
  std::vector<ParamState> mine = state;
  if (tp_group_ != nullptr) {
    const std::vector<std::string> names = ParameterNames();
    for (size_t i = 0; i < mine.size() && i < names.size(); ++i) {
      for (at::Tensor* t : {&mine[i].exp_avg, &mine[i].exp_avg_sq}) {
        if (t->defined()) *t = model::TensorParallelSliceOf(names[i], *t, tp_rank(), tp_size());
      }
    }
  }
  GYRE_ASSIGN_OR_RETURN(const model::NamedTensors named, NamedAsUnits(*shards_, SlicesOf(weights)));
  // Checked before anything changes (SetWeights checks the weights first).
  GYRE_RETURN_IF_ERROR(CheckSliceState(*shards_, mine));
  GYRE_RETURN_IF_ERROR(shards_->SetWeights(named));
  InstallSliceState(mine);
  version_ = version;
  return Status::Ok();
}

StatusOr<std::vector<at::Tensor>> PolicyTrainer::GatherUnitWeights(int u) {
  if (shards_ == nullptr && tp_group_ != nullptr) {
    const std::vector<model::ParameterUnit> units = model::ParameterUnits(model_->spec());
    if (u < 0 || u >= static_cast<int>(units.size())) {
      return InvalidArgument("no parameter unit " + std::to_string(u));
    }
    size_t first = 0;
    for (int k = 0; k < u; ++k) first += units[static_cast<size_t>(k)].names.size();
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < units[static_cast<size_t>(u)].names.size(); ++i) {
      GYRE_ASSIGN_OR_RETURN(at::Tensor whole, GatherSlices(units[static_cast<size_t>(u)].names[i],
                                                           optimizer_->params[first + i]));
      out.push_back(std::move(whole));
    }
    return out;
  }
  if (shards_ == nullptr) {
    return FailedPrecondition("GatherUnitWeights needs a trainer whose parameters are split");
  }
  if (u < 0 || u >= shards_->num_units()) {
    return InvalidArgument("no parameter unit " + std::to_string(u));
  }
  GYRE_ASSIGN_OR_RETURN(std::vector<at::Tensor> tensors, shards_->GatherUnit(u));
  GYRE_RETURN_IF_ERROR(GatherUnitSlices(u, &tensors));
  return tensors;
}

Status PolicyTrainer::GatherUnitRange(int u, int64_t begin, const at::Tensor& out) {
  if (!gathers_ranges()) {
    return FailedPrecondition(
        "GatherUnitRange needs a trainer whose parameters are split and not tensor parallel");
  }
  if (u < 0 || u >= shards_->num_units()) {
    return InvalidArgument("no parameter unit " + std::to_string(u));
  }
  return shards_->GatherRange(u, begin, out);
}

StatusOr<at::Tensor> PolicyTrainer::GatherWholeRows(int u, int i, int64_t row, int64_t rows) {
  at::NoGradGuard no_grad;
  if (tp_group_ == nullptr)
    return FailedPrecondition("GatherWholeRows needs a tensor-parallel trainer");
  const std::vector<model::ParameterUnit>& units = units_;
  if (u < 0 || u >= static_cast<int>(units.size()) || i < 0 ||
      i >= static_cast<int>(units[static_cast<size_t>(u)].names.size())) {
    return InvalidArgument("no tensor " + std::to_string(i) + " in parameter unit " +
                           std::to_string(u));
  }
  const model::ParameterUnit& unit = units[static_cast<size_t>(u)];
  const std::string& name = unit.names[static_cast<size_t>(i)];
  const std::vector<int64_t>& whole = unit.shapes[static_cast<size_t>(i)];
  if (whole.empty() || row < 0 || rows < 1 || row > whole[0] - rows) {
    return InvalidArgument("rows [" + std::to_string(row) + ", " + std::to_string(row + rows) +
                           ") are not inside " + name);
  }
  const int dim = model::TensorParallelDim(name);
  const int ranks = tp_group_->size();
  int owner = -1;  // a row split: the rank holding the rows
  int64_t local_row = row;
  if (dim == 0) {
    for (int r = 0; r < ranks && owner < 0; ++r) {
      const auto [begin, end] = model::TensorParallelRange(name, whole[0], r, ranks);
      if (row >= begin && row + rows <= end) {
        owner = r;
        local_row = row - begin;
      }
    }
    if (owner < 0) {
      return InvalidArgument("rows [" + std::to_string(row) + ", " + std::to_string(row + rows) +
                             ") of " + name + " are not all on one tensor-parallel rank");
    }
  }
  // This rank's rows of its slice (what the others need from it), float32.
  at::Tensor local;
  if (owner < 0 || owner == tp_rank()) {
    size_t first = 0;  // the tensor's index among the slices, in ParameterUnits order
    for (int k = 0; k < u; ++k) first += units[static_cast<size_t>(k)].names.size();
    first += static_cast<size_t>(i);
    if (shards_ == nullptr) {
      local = optimizer_->params[first].detach().narrow(0, local_row, rows).contiguous();
    } else {
      // The slice is itself split over the data-parallel ranks: its rows are one range of the
      // unit's flat weights, gathered from the ranks owning it.
      const model::ParameterUnit& slices = shards_->unit(u);
      int64_t offset = 0;
      for (int k = 0; k < i; ++k)
        offset += c10::multiply_integers(slices.shapes[static_cast<size_t>(k)]);
      std::vector<int64_t> shape = slices.shapes[static_cast<size_t>(i)];
      const int64_t row_elements = c10::multiply_integers(shape.begin() + 1, shape.end());
      shape[0] = rows;
      local = at::empty({rows * row_elements},
                        at::TensorOptions().dtype(at::kFloat).device(model_->device()));
      GYRE_RETURN_IF_ERROR(shards_->GatherRange(u, offset + local_row * row_elements, local));
      local = local.view(shape);
    }
  }
  if (dim < 0) return local;  // whole on every rank
  try {
    if (dim == 0) {
      std::vector<int64_t> shape = whole;
      shape[0] = rows;
      at::Tensor out =
          owner == tp_rank()
              ? local
              : at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(model_->device()));
      tp_group_->Broadcast(out, owner);
      return out;
    }
  } catch (const std::exception& e) {
    return Unavailable("gathering rows of " + name + " from its tensor-parallel rank: " + e.what());
  }
  // Split along the columns: every rank holds its columns of these rows.
  return GatherSlices(name, local);
}

Status PolicyTrainer::GatherUnitSlices(int u, std::vector<at::Tensor>* tensors) {
  if (tp_group_ == nullptr) return Status::Ok();
  const model::ParameterUnit& unit = shards_->unit(u);
  for (size_t i = 0; i < tensors->size() && i < unit.names.size(); ++i) {
    GYRE_ASSIGN_OR_RETURN((*tensors)[i], GatherSlices(unit.names[i], (*tensors)[i]));
  }
  return Status::Ok();
}

Status PolicyTrainer::GatherUnits(bool moments,
                                  const std::function<Status(const GatheredUnit&)>& visit) {
  if (shards_ == nullptr && tp_group_ != nullptr) {
    // Each parameter gathered from its slices; the moments from the AdamW state (the ranks step
    // together, so every rank gathers the same tensors).
    const std::vector<model::ParameterUnit> units = model::ParameterUnits(model_->spec());
    const std::vector<int64_t> steps = UnitSteps();
    const auto& state = optimizer_->adamw->state();
    const model::NamedTensors ref =
        reference_ != nullptr ? reference_->NamedParameters() : model::NamedTensors();
    Status first;
    size_t k = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      GatheredUnit g;
      g.index = static_cast<int>(u);
      g.def = &units[u];
      g.step = steps[u];
      for (size_t i = 0; i < units[u].names.size(); ++i, ++k) {
        const std::string& name = units[u].names[i];
        const at::Tensor& p = optimizer_->params[k];
        GYRE_ASSIGN_OR_RETURN(at::Tensor w, GatherSlices(name, p));
        g.weights.push_back(std::move(w));
        if (moments && g.step > 0 && sharded_) {
          // ZeRO-1/2: the data-parallel ranks' parts of this slice's moments, summed.
          GYRE_ASSIGN_OR_RETURN(at::Tensor m, ShardedMoment(k, /*second=*/false));
          GYRE_ASSIGN_OR_RETURN(at::Tensor v, ShardedMoment(k, /*second=*/true));
          GYRE_ASSIGN_OR_RETURN(m, GatherSlices(name, m));
          GYRE_ASSIGN_OR_RETURN(v, GatherSlices(name, v));
          g.exp_avg.push_back(std::move(m));
          g.exp_avg_sq.push_back(std::move(v));
        } else if (moments && g.step > 0) {
          auto it = state.find(p.unsafeGetTensorImpl());
          const auto* st = it != state.end()
                               ? static_cast<const torch::optim::AdamWParamState*>(it->second.get())
                               : nullptr;
          GYRE_ASSIGN_OR_RETURN(at::Tensor m,
                                GatherSlices(name, st ? st->exp_avg() : at::zeros_like(p)));
          GYRE_ASSIGN_OR_RETURN(at::Tensor v,
                                GatherSlices(name, st ? st->exp_avg_sq() : at::zeros_like(p)));
          g.exp_avg.push_back(std::move(m));
          g.exp_avg_sq.push_back(std::move(v));
        }
        if (!ref.empty()) {
          GYRE_ASSIGN_OR_RETURN(at::Tensor r, GatherSlices(name, ref[k].second));
          g.reference.push_back(std::move(r));
        }
      }
      if (first.ok()) first = visit(g);
    }
    return first;
  }
  if (shards_ == nullptr) {
    return FailedPrecondition("GatherUnits needs a trainer whose parameters are split");
  }
  std::vector<int64_t> offsets;  // of each unit's slice in the slices' optimizer's flat state
  int64_t offset = 0;
  for (const at::Tensor& m : shards_->masters()) {
    offsets.push_back(offset);
    offset += m.numel();
  }
  // Views of the slices' optimizer state: a copy would be this rank's whole share again.
  const std::vector<int64_t>& steps = sharded_->steps();
  const at::Tensor& exp_avg = sharded_->exp_avg();
  const at::Tensor& exp_avg_sq = sharded_->exp_avg_sq();
  Status first;
  for (int u = 0; u < shards_->num_units(); ++u) {
    GatheredUnit g;
    g.index = u;
    g.def = &shards_->unit(u);
    GYRE_ASSIGN_OR_RETURN(g.weights, shards_->GatherUnit(u));
    GYRE_RETURN_IF_ERROR(GatherUnitSlices(u, &g.weights));
    g.step = steps[static_cast<size_t>(u)];
    if (moments) {
      const int64_t chunk = shards_->masters()[static_cast<size_t>(u)].numel();
      // Every rank gathers, also when this one has no step (the ranks step together).
      GYRE_ASSIGN_OR_RETURN(g.exp_avg,
                            shards_->GatherUnitSlices(u, exp_avg.narrow(0, offsets[u], chunk)));
      GYRE_ASSIGN_OR_RETURN(g.exp_avg_sq,
                            shards_->GatherUnitSlices(u, exp_avg_sq.narrow(0, offsets[u], chunk)));
      GYRE_RETURN_IF_ERROR(GatherUnitSlices(u, &g.exp_avg));
      GYRE_RETURN_IF_ERROR(GatherUnitSlices(u, &g.exp_avg_sq));
      if (g.step == 0) {
        g.exp_avg.clear();
        g.exp_avg_sq.clear();
      }
    }
    if (ref_shards_ != nullptr) {
      GYRE_ASSIGN_OR_RETURN(g.reference, ref_shards_->GatherUnit(u));
      GYRE_RETURN_IF_ERROR(GatherUnitSlices(u, &g.reference));
    }
    if (first.ok()) first = visit(g);
  }
  return first;
}

StatusOr<at::Tensor> PolicyTrainer::GatherSlices(const std::string& name, const at::Tensor& local) {
  at::NoGradGuard no_grad;
  const int dim = model::TensorParallelDim(name);
  if (dim < 0) return local.detach().clone();  // whole on every rank
  // The split dimension first, padded to the widest slice (the last vocabulary slice may be
  // shorter), gathered, and the ranks' parts put together.
  const int ranks = tp_group_->size();
  const at::Tensor mine = local.detach().transpose(0, dim);
  const bool vocabulary = name == "model.embed_tokens.weight" || name == "lm_head.weight";
  const int64_t extent = vocabulary ? model_->spec().vocab_size : mine.size(0) * ranks;
  const auto [begin0, end0] = model::TensorParallelRange(name, extent, 0, ranks);
  std::vector<int64_t> padded_shape = mine.sizes().vec();
  padded_shape[0] = end0 - begin0;
  at::Tensor padded = at::zeros(padded_shape, mine.options());
  padded.narrow(0, 0, mine.size(0)).copy_(mine);
  at::Tensor all;
  try {
    all = tp_group_->AllGather(padded);
  } catch (const std::exception& e) {
    return Unavailable(std::string("gathering the tensor-parallel slices of ") + name + ": " +
                       e.what());
  }
  std::vector<at::Tensor> parts;
  for (int r = 0; r < ranks; ++r) {
    const auto [begin, end] = model::TensorParallelRange(name, extent, r, ranks);
    parts.push_back(all[r].narrow(0, 0, end - begin));
  }
  return at::cat(parts, 0).transpose(0, dim).contiguous();
}

std::vector<std::string> PolicyTrainer::ParameterNames() const {
  std::vector<std::string> names;
  for (const model::ParameterUnit& u : model::ParameterUnits(model_->spec())) {
    names.insert(names.end(), u.names.begin(), u.names.end());
  }
  return names;
}

std::vector<at::Tensor> PolicyTrainer::SlicesOf(const std::vector<at::Tensor>& whole) const {
  if (tp_group_ == nullptr) return whole;
  std::vector<at::Tensor> out;
  const std::vector<std::string> names = ParameterNames();
  for (size_t i = 0; i < whole.size(); ++i) {
    out.push_back(whole[i].defined() && i < names.size()
                      ? model::TensorParallelSliceOf(names[i], whole[i], tp_rank(), tp_size())
                      : whole[i]);
  }
  return out;
}

Status PolicyTrainer::RebindTensorParallel(comm::Communicator* comm) {
  if (tp_comm_ == nullptr || comm == nullptr || comm->size() != tp_comm_->size() ||
      comm->rank() != tp_comm_->rank()) {
    return FailedPrecondition("this trainer holds tensor-parallel rank " +
                              std::to_string(tp_rank()) + " of " + std::to_string(tp_size()) +
                              "'s slices, which cannot move to another layout: save a "
                              "checkpoint and load it into the new layout");
  }
  tp_comm_->Rebind(comm);
  return Status::Ok();
}

std::vector<double> PolicyTrainer::NormWeights() const {
  if (tp_group_ == nullptr) return {};
  std::vector<double> out;
  for (bool split : tp_split_) out.push_back(split ? 1.0 : 1.0 / tp_size());
  return out;
}

StatusOr<at::Tensor> PolicyTrainer::ShardedMoment(size_t param, bool second) {
  at::Tensor part = sharded_->MomentPart(param, second);
  if (dp_ == nullptr || dp_->size() == 1) return part;
  const bool device = dp_->backend() == "nccl";
  at::Tensor buf = device ? part.contiguous() : part.cpu().contiguous();
  GYRE_RETURN_IF_ERROR(dp_->AllReduceSum(buf.data_ptr<float>(), static_cast<size_t>(buf.numel()),
                                         comm::DataType::kFloat32,
                                         comm::DeadlineAfter(dp_timeout_s_))
                           .WithContext("gathering the sharded optimizer's moments"));
  return buf.to(part.device());
}

std::vector<int64_t> PolicyTrainer::UnitSteps() const {
  if (shards_ != nullptr) return sharded_->steps();
  std::vector<int64_t> out;
  if (sharded_) {  // ZeRO-1/2 (over tensor-parallel slices): per parameter
    size_t k = 0;
    for (const model::ParameterUnit& u : model::ParameterUnits(model_->spec())) {
      int64_t step = 0;
      for (size_t i = 0; i < u.names.size() && k < sharded_->steps().size(); ++i, ++k) {
        step = std::max(step, sharded_->steps()[k]);
      }
      out.push_back(step);
    }
    return out;
  }
  const auto& state = optimizer_->adamw->state();
  size_t k = 0;
  for (const model::ParameterUnit& u : model::ParameterUnits(model_->spec())) {
    int64_t step = 0;
    for (size_t i = 0; i < u.names.size() && k < optimizer_->params.size(); ++i, ++k) {
      auto it = state.find(optimizer_->params[k].unsafeGetTensorImpl());
      if (it != state.end()) {
        step = static_cast<const torch::optim::AdamWParamState&>(*it->second).step();
      }
    }
    out.push_back(step);
  }
  return out;
}

StatusOr<model::NamedTensors> PolicyTrainer::FullWeights() {
  model::NamedTensors out;
  if (shards_ == nullptr && tp_group_ != nullptr) {
    for (const auto& [name, p] : model_->NamedParameters()) {
      GYRE_ASSIGN_OR_RETURN(at::Tensor whole, GatherSlices(name, p));
      out.emplace_back(name, std::move(whole));
    }
    return out;
  }
  if (shards_ == nullptr) {
    at::NoGradGuard no_grad;
    for (const auto& [name, p] : model_->NamedParameters())
      out.emplace_back(name, p.detach().clone());
    return out;
  }
  for (int u = 0; u < shards_->num_units(); ++u) {
    GYRE_ASSIGN_OR_RETURN(std::vector<at::Tensor> tensors, GatherUnitWeights(u));
    for (size_t i = 0; i < tensors.size(); ++i) {
      out.emplace_back(shards_->unit(u).names[i], std::move(tensors[i]));
    }
  }
  return out;
}

StatusOr<int64_t> PolicyTrainer::PassesOnEveryRank(int64_t local) {
  if (shards_ == nullptr || dp_ == nullptr || dp_->size() == 1) return local;
  std::vector<double> counts(static_cast<size_t>(dp_->size()), 0.0);
  counts[static_cast<size_t>(dp_->rank())] = static_cast<double>(local);
  GYRE_RETURN_IF_ERROR(AllReduce(counts.data(), counts.size())
                           .WithContext("sharded parameters: the ranks' micro-batch counts"));
  return static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
}

Status PolicyTrainer::EndPass(const model::Transformer& model) {
  if (shards_ == nullptr) return Status::Ok();
  ParameterShards* owner = &model == reference_.get() ? ref_shards_.get() : shards_.get();
  if (owner == nullptr) return Status::Ok();
  return owner->EndPass();
}

Status PolicyTrainer::EmptyPass(const model::Transformer* reference, bool backward) {
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kLong).device(model_->device());
  model::PackedBatch one;
  one.tokens = at::zeros({1, 1}, opts);
  one.positions = at::zeros({1, 1}, opts);
  one.segments = at::zeros({1, 1}, opts);
  one.logit_index = at::zeros({1}, opts);
  at::AutoGradMode grad(backward);
  const at::Tensor logits = model_->ForwardPacked(one);
  if (reference != nullptr) {
    at::NoGradGuard no_grad;
    (void)reference->ForwardPacked(one);
    GYRE_RETURN_IF_ERROR(EndPass(*reference));
  }
  if (backward) (logits.sum() * 0.0).backward();
  return EndPass(*model_);
}

void PolicyTrainer::BeginGradients() {
  if (sharded_) {
    sharded_->BeginStep();
  } else {
    optimizer_->adamw->zero_grad();
  }
  // The backward passes reduce-scatter each unit's gradient straight into the slices' optimizer's
  // gradient buffer (one rank's ShardedAdamW over the slices: its slice is all of them).
  if (shards_) shards_->BeginStep(sharded_->gradient_slice());
}

void PolicyTrainer::DropGradients() {
  if (shards_) shards_->ReleaseGradients();
  if (sharded_) {
    sharded_->ReleaseGradients();
  } else {
    optimizer_->adamw->zero_grad();
  }
}

PolicyTrainer::~PolicyTrainer() = default;

void PolicyTrainer::SetActivationCheckpointing(bool on) { model_->SetActivationCheckpointing(on); }

bool PolicyTrainer::activation_checkpointing() const { return model_->activation_checkpointing(); }

void PolicyTrainer::SetComputeDtype(at::ScalarType dtype) {
  compute_dtype_ = dtype;
  reference_compute_.reset();
}

const model::Transformer& PolicyTrainer::ComputeReference() {
  if (reference_->dtype() == compute_dtype_) return *reference_;
  if (reference_compute_ == nullptr) {
    at::NoGradGuard no_grad;  // frozen: plain tensors, cast once
    reference_compute_ = model::Transformer::CastOf(*reference_, compute_dtype_);
  }
  return *reference_compute_;
}

void PolicyTrainer::FreezeReference() {
  if (shards_ != nullptr) {
    ref_shards_ = shards_->FrozenCopy();
    reference_ = model::Transformer::Gathered(model_->spec(), ref_shards_.get(), compute_dtype_,
                                              model_->device(), tp_group_.get());
    reference_compute_.reset();
    return;
  }
  if (tp_group_ != nullptr) {  // the reference holds the same slices as the policy
    reference_ = model::Transformer::FrozenCopy(*model_);
    reference_compute_.reset();
    return;
  }
  auto ref = model::Transformer::Create(model_->spec(), 0, -1.0);
  ref->To(model_->device());
  at::NoGradGuard no_grad;
  const model::NamedTensors src = model_->NamedParameters();
  const model::NamedTensors dst = ref->NamedParameters();
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].second.detach().copy_(src[i].second.detach());
    dst[i].second.detach().requires_grad_(false);
  }
  reference_ = std::move(ref);
  reference_compute_.reset();
}

Status PolicyTrainer::RestoreReference(const std::vector<at::Tensor>& weights) {
  if (tp_group_ != nullptr && shards_ == nullptr) {
    const model::NamedTensors params = model_->NamedParameters();
    if (weights.size() != params.size()) {
      return InvalidArgument("reference policy: expected " + std::to_string(params.size()) +
                             " weights, got " + std::to_string(weights.size()));
    }
    const std::vector<at::Tensor> mine = SlicesOf(weights);
    for (size_t i = 0; i < params.size(); ++i) {
      if (!mine[i].defined() || mine[i].scalar_type() != params[i].second.scalar_type() ||
          mine[i].sizes() != params[i].second.sizes()) {
        return InvalidArgument("reference policy: weight '" + params[i].first +
                               "' does not match the model's shape and dtype");
      }
    }
    auto ref = model::Transformer::FrozenCopy(*model_);
    at::NoGradGuard no_grad;
    const model::NamedTensors dst = ref->NamedParameters();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].second.detach().copy_(mine[i]);
    reference_ = std::move(ref);
    reference_compute_.reset();
    return Status::Ok();
  }
  if (shards_ != nullptr) {
    StatusOr<model::NamedTensors> named = NamedAsUnits(*shards_, SlicesOf(weights));
    if (!named.ok()) return named.status().WithContext("reference policy");
    std::unique_ptr<ParameterShards> ref = shards_->FrozenCopy();
    GYRE_RETURN_IF_ERROR(ref->SetWeights(*named).WithContext("reference policy"));
    ref_shards_ = std::move(ref);
    reference_ = model::Transformer::Gathered(model_->spec(), ref_shards_.get(), compute_dtype_,
                                              model_->device(), tp_group_.get());
    reference_compute_.reset();
    return Status::Ok();
  }
  const model::NamedTensors params = model_->NamedParameters();
  if (weights.size() != params.size()) {
    return InvalidArgument("reference policy: expected " + std::to_string(params.size()) +
                           " weights, got " + std::to_string(weights.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& w = weights[i];
    if (!w.defined() || w.scalar_type() != params[i].second.scalar_type() ||
        w.sizes() != params[i].second.sizes()) {
      return InvalidArgument("reference policy: weight '" + params[i].first +
                             "' does not match the model's shape and dtype");
    }
  }
  auto ref = model::Transformer::Create(model_->spec(), 0, -1.0);
  ref->To(model_->device());
  at::NoGradGuard no_grad;
  const model::NamedTensors dst = ref->NamedParameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i].second.detach().copy_(weights[i]);
    dst[i].second.detach().requires_grad_(false);
  }
  reference_ = std::move(ref);
  reference_compute_.reset();
  return Status::Ok();
}

std::vector<PolicyTrainer::ParamState> PolicyTrainer::OptimizerState() const {
  std::vector<ParamState> out;
  if (optimizer_->adamw == nullptr) return out;  // split into parameter slices
  const auto& state = optimizer_->adamw->state();
  for (const auto& p : optimizer_->params) {
    ParamState ps;
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it != state.end()) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      ps.step = s.step();
      ps.exp_avg = s.exp_avg().detach().clone();
      ps.exp_avg_sq = s.exp_avg_sq().detach().clone();
    }
    out.push_back(std::move(ps));
  }
  return out;
}

Status PolicyTrainer::CheckWeights(const std::vector<at::Tensor>& weights) const {
  const model::NamedTensors params = model_->NamedParameters();
  if (weights.size() != params.size()) {
    return InvalidArgument("expected " + std::to_string(params.size()) + " weights, got " +
                           std::to_string(weights.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const at::Tensor& w = weights[i];
    if (!w.defined() || w.scalar_type() != p.scalar_type() || w.sizes() != p.sizes()) {
      return InvalidArgument("weight '" + name + "' does not match the model's shape and dtype");
    }
  }
  return Status::Ok();
}

Status PolicyTrainer::RestoreShardedState(const std::vector<at::Tensor>& weights,
                                          const ShardedAdamW::State& state, int64_t version) {
  if (!sharded_) return FailedPrecondition("RestoreShardedState on an unsharded trainer");
  if (shards_) {
    return FailedPrecondition("RestoreShardedState on a trainer whose parameters are split");
  }
  GYRE_RETURN_IF_ERROR(CheckWeights(weights));
  if (version < 0) return InvalidArgument("negative policy version " + std::to_string(version));
  GYRE_RETURN_IF_ERROR(sharded_->Set(state));  // checks first, then commits
  at::NoGradGuard no_grad;
  const model::NamedTensors params = model_->NamedParameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].second.detach().copy_(weights[i]);
  version_ = version;
  return Status::Ok();
}

Status PolicyTrainer::RestoreState(const std::vector<at::Tensor>& weights,
                                   const std::vector<ParamState>& state, int64_t version) {
  if (sharded_) return FailedPrecondition("RestoreState on a sharded trainer");
  const model::NamedTensors params = model_->NamedParameters();
  if (weights.size() != params.size() || state.size() != params.size()) {
    return InvalidArgument("expected state for " + std::to_string(params.size()) +
                           " parameters, got " + std::to_string(weights.size()) + " weights and " +
                           std::to_string(state.size()) + " optimizer entries");
  }
  if (version < 0) return InvalidArgument("negative policy version " + std::to_string(version));
  GYRE_RETURN_IF_ERROR(CheckWeights(weights));
  auto same = [](const at::Tensor& t, const at::Tensor& like) {
    return t.defined() && t.scalar_type() == like.scalar_type() && t.sizes() == like.sizes();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const ParamState& ps = state[i];
    if (ps.step < 0) return InvalidArgument("optimizer step of '" + name + "' is negative");
    if (ps.step > 0 && (!same(ps.exp_avg, p) || !same(ps.exp_avg_sq, p))) {
      return InvalidArgument("optimizer moments of '" + name +
                             "' do not match the parameter's shape and dtype");
    }
  }
  // Everything checked: commit.
  at::NoGradGuard no_grad;
  auto& adam_state = optimizer_->adamw->state();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].second.detach().copy_(weights[i]);
    at::Tensor& p = optimizer_->params[i];
    if (state[i].step == 0) {
      adam_state.erase(p.unsafeGetTensorImpl());
      continue;
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(state[i].step);
    s->exp_avg(state[i].exp_avg.detach().to(p.device()).clone().contiguous());
    s->exp_avg_sq(state[i].exp_avg_sq.detach().to(p.device()).clone().contiguous());
    adam_state[p.unsafeGetTensorImpl()] = std::move(s);
  }
  version_ = version;
  return Status::Ok();
}

namespace {

// *dst = a copy of src, reusing *dst's buffer when it has src's shape, dtype and device.
void CopyInto(const at::Tensor& src, at::Tensor* dst) {
  if (!dst->defined() || !dst->sizes().equals(src.sizes()) ||
      dst->scalar_type() != src.scalar_type() || dst->device() != src.device()) {
    *dst = at::empty_like(src);
  }
  dst->copy_(src);
}

}  // namespace

void PolicyTrainer::TakeSnapshot() {
  at::NoGradGuard no_grad;
  if (snapshot_ == nullptr) snapshot_ = std::make_unique<Snapshot>();
  Snapshot& snap = *snapshot_;
  const size_t n = optimizer_->params.size();
  snap.version = version_;
  snap.weights.resize(n);
  snap.exp_avg.resize(n);
  snap.exp_avg_sq.resize(n);
  snap.steps.assign(n, 0);
  if (sharded_) {
    for (size_t i = 0; i < n; ++i) CopyInto(optimizer_->params[i].detach(), &snap.weights[i]);
    snap.sharded = sharded_->Get();
    return;
  }
  const auto& state = optimizer_->adamw->state();
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = optimizer_->params[i];
    CopyInto(p.detach(), &snap.weights[i]);
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    snap.steps[i] = s.step();
    CopyInto(s.exp_avg(), &snap.exp_avg[i]);
    CopyInto(s.exp_avg_sq(), &snap.exp_avg_sq[i]);
  }
}

void PolicyTrainer::RestoreSnapshot() {
  GYRE_CHECK(snapshot_ != nullptr) << "no snapshot to restore";
  at::NoGradGuard no_grad;
  const Snapshot& snap = *snapshot_;
  DropGradients();
  if (sharded_) {
    for (size_t i = 0; i < optimizer_->params.size(); ++i) {
      optimizer_->params[i].detach().copy_(snap.weights[i]);
    }
    const Status restored = sharded_->Set(snap.sharded);  // taken from the same layout
    GYRE_CHECK(restored.ok()) << restored.message();
    version_ = snap.version;
    return;
  }
  auto& state = optimizer_->adamw->state();
  for (size_t i = 0; i < optimizer_->params.size(); ++i) {
    at::Tensor& p = optimizer_->params[i];
    p.detach().copy_(snap.weights[i]);
    if (snap.steps[i] == 0) {
      state.erase(p.unsafeGetTensorImpl());  // created by a mini-batch of the failed step
      continue;
    }
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) {  // dropped by reset_optimizer_state at the start of the failed step
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(snap.steps[i]);
      fresh->exp_avg(snap.exp_avg[i].clone());
      fresh->exp_avg_sq(snap.exp_avg_sq[i].clone());
      state[p.unsafeGetTensorImpl()] = std::move(fresh);
      continue;
    }
    // Otherwise AdamW kept it (it never drops a parameter's state): overwrite it in place.
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    s.step(snap.steps[i]);
    s.exp_avg().copy_(snap.exp_avg[i]);
    s.exp_avg_sq().copy_(snap.exp_avg_sq[i]);
  }
  version_ = snap.version;
}

Status PolicyTrainer::Validate(const std::vector<TrainSample>& batch, Objective objective,
                               const TrainOptions& options) const {
  const bool pg = objective == Objective::kPolicyGradient;
  const bool needs_rollout = pg && (options.proximal != Proximal::kRecompute ||
                                    options.loss.correction != kernels::Correction::kNone);
  const bool needs_versions = pg && options.proximal == Proximal::kLogLinear;
  if (pg && options.loss.correction == kernels::Correction::kM2po &&
      options.proximal != Proximal::kRecompute) {
    return InvalidArgument(
        "the m2po correction needs the recomputed proximal policy (Proximal::kRecompute)");
  }
  // A data-parallel rank may hold no sample of a small batch; it still joins the collectives.
  if (batch.empty() && (dp_ == nullptr || dp_->size() == 1)) {
    return InvalidArgument("empty training batch");
  }
  const auto& spec = model_->spec();
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& s = batch[i];
    const std::string where = "sample " + std::to_string(i);
    if (s.prompt.empty() || s.response.empty()) {
      return InvalidArgument(where + ": prompt and response must be non-empty");
    }
    if (static_cast<int64_t>(s.prompt.size() + s.response.size()) > spec.max_seq_len) {
      return InvalidArgument(where + ": " + std::to_string(s.prompt.size() + s.response.size()) +
                             " tokens exceed max_seq_len " + std::to_string(spec.max_seq_len));
    }
    for (const auto* ids : {&s.prompt, &s.response}) {
      for (int32_t id : *ids) {
        if (id < 0 || id >= spec.vocab_size) {
          return InvalidArgument(where + ": token id " + std::to_string(id) + " out of range");
        }
      }
    }
    if (!s.loss_mask.empty() && s.loss_mask.size() != s.response.size()) {
      return InvalidArgument(where + ": loss_mask has " + std::to_string(s.loss_mask.size()) +
                             " entries for " + std::to_string(s.response.size()) + " tokens");
    }
    // For every objective: SFT ignores them, but a sample that disagrees with itself is refused
    // (found by fuzz_trainer_rpc: an SFT step read past a short list).
    if (!s.rollout_logprobs.empty() && s.rollout_logprobs.size() != s.response.size()) {
      return InvalidArgument(where + ": logprobs has " + std::to_string(s.rollout_logprobs.size()) +
                             " entries for " + std::to_string(s.response.size()) + " tokens");
    }
    if (needs_rollout && s.rollout_logprobs.size() != s.response.size()) {
      return InvalidArgument(where + ": has no rollout log-probs, which the " +
                             std::string(algorithm::NameOf(options.loss.correction)) +
                             " correction and the chosen proximal policy need");
    }
    if (needs_versions && s.versions.size() != s.response.size()) {
      return InvalidArgument(where + ": has " + std::to_string(s.versions.size()) +
                             " token versions for " + std::to_string(s.response.size()) +
                             " tokens; the log-linear proximal policy needs one per token");
    }
    if (!std::isfinite(s.advantage)) return InvalidArgument(where + ": advantage is not finite");
  }
  return Status::Ok();
}

std::vector<std::pair<int64_t, int64_t>> PackFirstFit(const std::vector<int64_t>& lengths,
                                                      int64_t width, int64_t* rows) {
  std::vector<size_t> order(lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> used;  // tokens per row
  std::vector<std::pair<int64_t, int64_t>> at(lengths.size());
  for (size_t s : order) {
    size_t row = 0;
    while (row < used.size() && used[row] + lengths[s] > width) ++row;
    if (row == used.size()) used.push_back(0);
    at[s] = {static_cast<int64_t>(row), used[row]};
    used[row] += lengths[s];
  }
  *rows = std::max<int64_t>(1, static_cast<int64_t>(used.size()));
  return at;
}

namespace {

// The tensors of one micro-batch [start, end) of a batch. Per-token tensors are [S, R] (R the
// longest response); response token t of sample s is predicted by the token before it. The N
// response tokens, sample after sample, are also listed flat: the model returns their logits
// [N, V] (ResponseLogits) and Grid scatters per-token values back into [S, R].
struct MicroBatch {
  int64_t S = 0, R = 0;
  at::Tensor targets, mask, adv, rollout_lp, old_lp;
  at::Tensor rollout_mask;  // mask, where the sample carries rollout log-probs
  bool has_old = true;      // every sample carries old_logprobs
  // Proximal::kLogLinear: kernels::LogLinearProximalAlpha per token (undefined otherwise).
  at::Tensor alpha;
  at::Tensor flat_targets;  // int64 [N]
  at::Tensor grid_index;    // int64 [N]: s * R + t
  // Packed (PolicyTrainer::SetSequencePacking): the rows the model runs on.
  bool packed = false;
  model::PackedBatch pack;
  // Padded: inputs[s] is (prompt + response)[:-1] right-padded to L, and padded_index [N] the
  // flat index s * L + prompt_len - 1 + t of each response token's predicting position.
  at::Tensor inputs, padded_index;
  // Positions the model runs on, and how many of them are padding.
  int64_t computed = 0, pad = 0;
};

// Which log-linear weights BuildMicroBatch fills in (none unless proximal_version >= 0).
struct LogLinear {
  int64_t proximal_version = -1;
  int64_t current_version = -1;
};

// How BuildMicroBatch lays out a micro-batch: packed or padded, and with packing whether samples
// that share a prompt share one copy of it (PromptSharing). lin and att estimate the forward's
// cost per token computed (the decoder layers' weights) and per attention score computed.
struct Layout {
  bool packed = true;
  PromptSharing sharing = PromptSharing::kAuto;
  double lin = 1.0, att = 0.0;
};

Layout LayoutFor(const model::ModelSpec& m, bool packed, PromptSharing sharing) {
  Layout l;
  l.packed = packed;
  l.sharing = sharing;
  const double q = static_cast<double>(m.num_heads * m.head_dim);
  const double kv = static_cast<double>(m.num_kv_heads * m.head_dim);
  const double h = static_cast<double>(m.hidden_size);
  const double layers = static_cast<double>(m.num_layers);
  l.lin = 2.0 * layers * (h * (2.0 * q + 2.0 * kv) + 3.0 * h * m.intermediate_size);
  l.att = 4.0 * layers * q;  // q.k and the weighted sum of v
  return l;
}

// Where sample s of a packed micro-batch sits: its row, the column of its prompt's last token
// (which predicts response token 0) and the column of its response token 0 as an input (which
// predicts token 1; the tokens after it follow).
struct Placement {
  int64_t row = 0, prompt_last = 0, response = 0;
};

// A unit PackFirstFit places: one sample, or (shared prompt) a group of samples with the same
// prompt laid out as the prompt once followed by each member's response[:-1].
struct PackUnit {
  std::vector<int64_t> members;  // local sample indices
  bool shared = false;
  int64_t length = 0;
};

// The units of samples [start, start + S) of `batch`, input lengths len[s] = prompt + response
// - 1. share: samples with the same non-empty prompt form shared units (of two or more).
std::vector<PackUnit> PackUnits(const std::vector<TrainSample>& batch, size_t start,
                                const std::vector<int64_t>& len, bool share) {
  const int64_t S = static_cast<int64_t>(len.size());
  std::vector<PackUnit> units;
  std::map<std::vector<int32_t>, size_t> by_prompt;  // prompt -> index into units
  for (int64_t s = 0; s < S; ++s) {
    const TrainSample& x = batch[start + static_cast<size_t>(s)];
    if (share && !x.prompt.empty()) {
      auto [it, added] = by_prompt.emplace(x.prompt, units.size());
      if (!added) {
        units[it->second].members.push_back(s);
        continue;
      }
    }
    units.push_back({{s}, false, len[static_cast<size_t>(s)]});
  }
  for (PackUnit& u : units) {
    if (u.members.size() < 2) continue;
    u.shared = true;
    u.length = static_cast<int64_t>(batch[start + static_cast<size_t>(u.members[0])].prompt.size());
    for (int64_t s : u.members) {
      u.length += std::max<int64_t>(
          0, static_cast<int64_t>(batch[start + static_cast<size_t>(s)].response.size()) - 1);
    }
  }
  return units;
}

// The lengths of `units` and the width of their rows (the longest, at least 1).
std::vector<int64_t> UnitLengths(const std::vector<PackUnit>& units, int64_t* width) {
  std::vector<int64_t> lengths;
  *width = 1;
  for (const PackUnit& u : units) {
    lengths.push_back(u.length);
    *width = std::max(*width, u.length);
  }
  return lengths;
}

// The estimated forward cost and the attention scores held of packing `units` (PackFirstFit
// into rows as wide as the longest).
struct PackCost {
  double flops = 0, scores = 0;
};
PackCost CostOf(const std::vector<PackUnit>& units, const Layout& layout) {
  int64_t width = 1, rows = 0;
  PackFirstFit(UnitLengths(units, &width), width, &rows);
  const double w = static_cast<double>(width), r = static_cast<double>(rows);
  return {r * w * layout.lin + r * w * w * layout.att, r * w * w};
}

// Packs the micro-batch's samples [start, start + len.size()) (input lengths len[s] = prompt +
// response - 1) into rows as wide as the longest unit (PackFirstFit), sharing prompts as
// `layout` says. Fills mb->pack and returns where each sample sits.
std::vector<Placement> PackRows(const std::vector<TrainSample>& batch, size_t start,
                                const std::vector<int64_t>& len, const Layout& layout,
                                MicroBatch* mb) {
  const int64_t S = static_cast<int64_t>(len.size());
  std::vector<PackUnit> units = PackUnits(batch, start, len, layout.sharing != PromptSharing::kOff);
  auto any_shared = [&units] {
    return std::any_of(units.begin(), units.end(), [](const PackUnit& u) { return u.shared; });
  };
  if (layout.sharing == PromptSharing::kAuto && any_shared()) {
    // Group by group: while sharing every group still shared costs more than sharing none,
    // the widest shared unit (the one whose attention costs most) goes back to one unit per
    // sample. Short answers to a shared prompt stay shared, long ones get their own rows.
    const PackCost alone = CostOf(PackUnits(batch, start, len, false), layout);
    for (;;) {
      const PackCost cost = CostOf(units, layout);
      if (cost.flops < alone.flops && cost.scores <= 2.0 * alone.scores) break;
      size_t widest = units.size();
      for (size_t u = 0; u < units.size(); ++u) {
        if (units[u].shared && (widest == units.size() || units[u].length > units[widest].length)) {
          widest = u;
        }
      }
      if (widest == units.size()) break;  // none left shared: the plain layout
      const std::vector<int64_t> members = units[widest].members;
      units.erase(units.begin() + static_cast<std::ptrdiff_t>(widest));
      for (int64_t s : members) units.push_back({{s}, false, len[static_cast<size_t>(s)]});
    }
  }
  int64_t width = 1, rows = 0;
  const std::vector<int64_t> lengths = UnitLengths(units, &width);
  const bool shares = any_shared();
  const std::vector<std::pair<int64_t, int64_t>> at = PackFirstFit(lengths, width, &rows);
  mb->computed = rows * width;
  mb->pad = mb->computed;
  for (int64_t n : lengths) mb->pad -= n;
  mb->pack.tokens = at::zeros({rows, width}, at::kLong);
  mb->pack.positions = at::zeros({rows, width}, at::kLong);
  // Padding at a row's end is segment S (its own); sample s is segment s; the shared prompt of
  // unit u is segment S + 1 + u.
  mb->pack.segments = at::full({rows, width}, S, at::kLong);
  if (shares) mb->pack.trunks = at::full({rows, width}, S, at::kLong);
  auto tk = mb->pack.tokens.accessor<int64_t, 2>();
  auto ps = mb->pack.positions.accessor<int64_t, 2>();
  auto sg = mb->pack.segments.accessor<int64_t, 2>();
  // Without shared units trunks stays undefined (a dummy accessor is never written).
  const at::Tensor trunks = shares ? mb->pack.trunks : at::zeros({1, 1}, at::kLong);
  auto tr = trunks.accessor<int64_t, 2>();
  std::vector<Placement> placed(static_cast<size_t>(S));
  for (size_t u = 0; u < units.size(); ++u) {
    const PackUnit& unit = units[u];
    const int64_t row = at[u].first;
    int64_t col = at[u].second;
    if (!unit.shared) {
      const int64_t s = unit.members[0];
      const TrainSample& x = batch[start + static_cast<size_t>(s)];
      const int64_t P = static_cast<int64_t>(x.prompt.size());
      for (int64_t t = 0; t < len[static_cast<size_t>(s)]; ++t) {
        tk[row][col + t] = t < P ? x.prompt[t] : x.response[t - P];
        ps[row][col + t] = t;
        sg[row][col + t] = s;
        if (shares) tr[row][col + t] = s;
      }
      placed[static_cast<size_t>(s)] = {row, col + P - 1, col + P};
      continue;
    }
    const int64_t trunk = S + 1 + static_cast<int64_t>(u);
    const std::vector<int32_t>& prompt = batch[start + static_cast<size_t>(unit.members[0])].prompt;
    const int64_t P = static_cast<int64_t>(prompt.size());
    for (int64_t t = 0; t < P; ++t, ++col) {
      tk[row][col] = prompt[t];
      ps[row][col] = t;
      sg[row][col] = trunk;
      tr[row][col] = trunk;
    }
    for (int64_t s : unit.members) {
      const TrainSample& x = batch[start + static_cast<size_t>(s)];
      placed[static_cast<size_t>(s)] = {row, at[u].second + P - 1, col};
      for (size_t t = 0; t + 1 < x.response.size(); ++t, ++col) {
        tk[row][col] = x.response[t];
        ps[row][col] = P + static_cast<int64_t>(t);
        sg[row][col] = s;
        tr[row][col] = trunk;
      }
    }
  }
  return placed;
}

// Built on the CPU, then moved to `device` (the model's) in one go.
MicroBatch BuildMicroBatch(const std::vector<TrainSample>& batch, size_t start, size_t end,
                           const at::Device& device, const Layout& layout,
                           const LogLinear& loglinear = {}) {
  MicroBatch mb;
  mb.S = static_cast<int64_t>(end - start);
  const bool packed = layout.packed;
  mb.packed = packed;
  int64_t L = 0, N = 0;
  std::vector<int64_t> len;
  for (size_t i = start; i < end; ++i) {
    len.push_back(std::max<int64_t>(
        0, static_cast<int64_t>(batch[i].prompt.size() + batch[i].response.size()) - 1));
    L = std::max<int64_t>(L, len.back());
    mb.R = std::max<int64_t>(mb.R, static_cast<int64_t>(batch[i].response.size()));
    N += static_cast<int64_t>(batch[i].response.size());
  }
  const int64_t S = mb.S, R = mb.R;
  std::vector<Placement> placed;
  int64_t width = 0;
  if (packed) {
    placed = PackRows(batch, start, len, layout, &mb);
    width = mb.pack.tokens.size(1);
    mb.pack.logit_index = at::zeros({N}, at::kLong);
  } else {
    mb.inputs = at::zeros({S, L}, at::kLong);
    mb.padded_index = at::zeros({N}, at::kLong);
    mb.computed = S * L;
    mb.pad = mb.computed;
    for (int64_t n : len) mb.pad -= n;
  }
  at::Tensor& logit_rows = packed ? mb.pack.logit_index : mb.padded_index;
  auto li_a = logit_rows.accessor<int64_t, 1>();
  mb.flat_targets = at::zeros({N}, at::kLong);
  mb.grid_index = at::zeros({N}, at::kLong);
  auto ft_a = mb.flat_targets.accessor<int64_t, 1>();
  auto gr_a = mb.grid_index.accessor<int64_t, 1>();
  mb.targets = at::zeros({S, R}, at::kLong);
  mb.mask = at::zeros({S, R}, at::kFloat);
  mb.adv = at::zeros({S, R}, at::kFloat);
  mb.rollout_lp = at::zeros({S, R}, at::kFloat);
  mb.old_lp = at::zeros({S, R}, at::kFloat);
  mb.rollout_mask = at::zeros({S, R}, at::kFloat);
  auto rm_a = mb.rollout_mask.accessor<float, 2>();
  auto tg_a = mb.targets.accessor<int64_t, 2>();
  auto mk_a = mb.mask.accessor<float, 2>();
  auto ad_a = mb.adv.accessor<float, 2>();
  auto rl_a = mb.rollout_lp.accessor<float, 2>();
  auto ol_a = mb.old_lp.accessor<float, 2>();
  const bool with_alpha = loglinear.proximal_version >= 0;
  if (with_alpha) mb.alpha = at::ones({S, R}, at::kFloat);
  int64_t k = 0;  // flat index of the next response token
  for (int64_t s = 0; s < S; ++s) {
    const TrainSample& x = batch[start + s];
    const int64_t P = static_cast<int64_t>(x.prompt.size());
    const int64_t n = static_cast<int64_t>(x.response.size());
    mb.has_old = mb.has_old && x.old_logprobs.size() == x.response.size();
    if (!packed) {
      auto in_a = mb.inputs.accessor<int64_t, 2>();
      for (int64_t t = 0; t < P + n - 1; ++t) in_a[s][t] = t < P ? x.prompt[t] : x.response[t - P];
    }
    for (int64_t t = 0; t < n; ++t, ++k) {
      if (packed) {
        const Placement& p = placed[static_cast<size_t>(s)];
        li_a[k] = p.row * width + (t == 0 ? p.prompt_last : p.response + t - 1);
      } else {
        li_a[k] = s * L + P - 1 + t;  // the predicting position in the sample's input sequence
      }
      ft_a[k] = x.response[t];
      gr_a[k] = s * R + t;
      tg_a[s][t] = x.response[t];
      mk_a[s][t] = x.loss_mask.empty() ? 1.0f : x.loss_mask[t];
      ad_a[s][t] = x.advantage * mk_a[s][t];
      const bool has_rollout = x.rollout_logprobs.size() == x.response.size();
      rl_a[s][t] = has_rollout ? x.rollout_logprobs[t] : 0.0f;
      rm_a[s][t] = has_rollout ? mk_a[s][t] : 0.0f;
      ol_a[s][t] = x.old_logprobs.size() == x.response.size() ? x.old_logprobs[t] : 0.0f;
    }
    if (with_alpha && x.versions.size() == x.response.size()) {
      auto al_a = mb.alpha.accessor<float, 2>();
      for (int64_t t = 0; t < n; ++t) {
        al_a[s][t] = static_cast<float>(kernels::LogLinearProximalAlpha(
            x.versions[t], loglinear.proximal_version, loglinear.current_version));
      }
    }
  }
  if (!device.is_cpu()) {
    for (at::Tensor* t :
         {&mb.inputs, &mb.padded_index, &mb.pack.tokens, &mb.pack.positions, &mb.pack.segments,
          &mb.pack.trunks, &mb.pack.logit_index, &mb.flat_targets, &mb.grid_index, &mb.targets,
          &mb.mask, &mb.adv, &mb.rollout_lp, &mb.old_lp, &mb.rollout_mask, &mb.alpha}) {
      if (t->defined()) *t = t->to(device, /*non_blocking=*/false);
    }
  }
  return mb;
}

// `model` computing in `dtype`: the model itself when its parameters have that dtype, otherwise
// a cast copy made now, kept in *holder (mixed precision: the float32 master weights receive the
// gradients of a bfloat16 forward).
const model::Transformer& InDtype(const model::Transformer& model, at::ScalarType dtype,
                                  std::unique_ptr<model::Transformer>* holder) {
  if (model.dtype() == dtype) return model;
  *holder = model::Transformer::CastOf(model, dtype);
  return **holder;
}

// Logits [N, V] of a micro-batch's response tokens, sample after sample.
at::Tensor ResponseLogits(const model::Transformer& model, const MicroBatch& mb) {
  if (mb.packed) return model.ForwardPacked(mb.pack);
  at::Tensor logits = model.Forward(mb.inputs);  // [S, L, V]
  return logits.view({-1, logits.size(2)}).index_select(0, mb.padded_index);
}

// Per-token values [N] (response tokens, sample after sample) laid out as [S, R], zero past each
// sample's response. Differentiable in x.
at::Tensor Grid(const at::Tensor& x, const MicroBatch& mb) {
  return at::zeros({mb.S * mb.R}, x.options()).index_copy(0, mb.grid_index, x).view({mb.S, mb.R});
}

// Per-token statistics [S, R] of the response tokens under `model` at `temperature`: log-probs
// and entropies (differentiable) and whether the argmax is the target. Packed micro-batches with
// chunk_tokens > 0 compute them from the LM head's input a chunk of tokens at a time
// (ops::ChunkedTokenStats: no [N, V] logits held, forward or backward); otherwise from the
// materialised logits [N, V]. need_entropy: the entropy is wanted with its graph (the entropy
// bonus); otherwise it is computed without one.
struct ResponseStats {
  at::Tensor logp, entropy, argmax_ok;
};
ResponseStats ResponseTokenStats(const model::Transformer& model, const MicroBatch& mb,
                                 double temperature, int64_t chunk_tokens, bool need_entropy) {
  if (model::TensorParallelGroup* tp = model.tensor_parallel()) {
    // This rank's vocabulary rows of the logits ([N, V / T], or [chunk_tokens, V / T] at a time
    // for packed micro-batches), the statistics over every rank's.
    model::VocabParallelStats st;
    if (mb.packed && chunk_tokens > 0) {
      auto [hidden, weight] = model.ForwardPackedHidden(mb.pack);
      st = model::VocabParallelChunkedTokenStats(hidden, weight, model.vocabulary_range().first,
                                                 mb.flat_targets, temperature, chunk_tokens, tp);
    } else {
      st = model::VocabParallelTokenStats(ResponseLogits(model, mb), model.vocabulary_range().first,
                                          mb.flat_targets, temperature, tp);
    }
    return {Grid(st.logp, mb), Grid(need_entropy ? st.entropy : st.entropy.detach(), mb),
            Grid(st.argmax_ok, mb)};
  }
  if (mb.packed && chunk_tokens > 0) {
    auto [hidden, weight] = model.ForwardPackedHidden(mb.pack);
    const ops::TokenStats st =
        ops::ChunkedTokenStats(hidden, weight, mb.flat_targets, temperature, chunk_tokens);
    return {Grid(st.logp, mb), Grid(need_entropy ? st.entropy : st.entropy.detach(), mb),
            Grid(st.argmax_ok, mb)};
  }
  const at::Tensor logits = ResponseLogits(model, mb);  // [N, V]
  ResponseStats out;
  out.logp = Grid(ops::TokenLogprobs(logits, mb.flat_targets, temperature), mb);
  const at::Tensor z = logits / (temperature > 0 ? temperature : 1.0);
  if (need_entropy) {
    const at::Tensor lsm = at::log_softmax(z, -1);
    out.entropy = Grid(-(lsm.exp() * lsm).sum(-1), mb);
  }
  at::NoGradGuard ng;
  if (!out.entropy.defined()) {
    const at::Tensor lsm = at::log_softmax(z.detach(), -1);
    out.entropy = Grid(-(lsm.exp() * lsm).sum(-1), mb);
  }
  out.argmax_ok = Grid((z.detach().argmax(-1) == mb.flat_targets).to(at::kFloat), mb);
  return out;
}

// Log-probs [S, R] of the response tokens (no entropy graph).
at::Tensor ResponseLogprobs(const model::Transformer& model, const MicroBatch& mb,
                            double temperature, int64_t chunk_tokens) {
  if (model::TensorParallelGroup* tp = model.tensor_parallel()) {
    if (mb.packed && chunk_tokens > 0) {
      auto [hidden, weight] = model.ForwardPackedHidden(mb.pack);
      return Grid(model::VocabParallelChunkedTokenStats(
                      hidden, weight, model.vocabulary_range().first, mb.flat_targets, temperature,
                      chunk_tokens, tp, /*logp_only=*/true)
                      .logp,
                  mb);
    }
    return Grid(
        model::VocabParallelTokenStats(ResponseLogits(model, mb), model.vocabulary_range().first,
                                       mb.flat_targets, temperature, tp, /*logp_only=*/true)
            .logp,
        mb);
  }
  if (mb.packed && chunk_tokens > 0) {
    auto [hidden, weight] = model.ForwardPackedHidden(mb.pack);
    return Grid(ops::ChunkedTokenStats(hidden, weight, mb.flat_targets, temperature, chunk_tokens,
                                       /*logp_only=*/true)
                    .logp,
                mb);
  }
  return Grid(ops::TokenLogprobs(ResponseLogits(model, mb), mb.flat_targets, temperature), mb);
}

// [S, 1] per-sequence weights that turn sum_t m x into x's share of the loss under p.agg, with
// the batch-wide denominators in p: the policy-loss kernel's scale[s], from the same function
// (kernels/policy_loss_terms.h).
at::Tensor AggregationScale(const at::Tensor& mask, const kernels::PolicyLossParams& p) {
  const at::Tensor tokens = mask.sum(1).to(at::kDouble).cpu().contiguous();
  const double* per_seq = tokens.data_ptr<double>();
  std::vector<double> scale(static_cast<size_t>(mask.size(0)));
  for (size_t s = 0; s < scale.size(); ++s) {
    // The trainer always passes the global denominators (local counts are not used).
    scale[s] = kernels::terms::AggregationScale(p, 0.0, 0.0, per_seq[s],
                                                static_cast<double>(mask.size(1)));
  }
  return at::tensor(scale, at::TensorOptions().dtype(at::kDouble)).to(mask.options()).unsqueeze(1);
}

}  // namespace

Status PolicyTrainer::ComputeOldLogprobs(std::vector<TrainSample>* batch,
                                         const TrainOptions& options) {
  at::NoGradGuard no_grad;
  std::unique_ptr<model::Transformer> cast;
  const model::Transformer& model = InDtype(*model_, compute_dtype_, &cast);
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, options.micro_batch_size));
  const int64_t local = static_cast<int64_t>((batch->size() + step - 1) / step);
  GYRE_ASSIGN_OR_RETURN(const int64_t passes, PassesOnEveryRank(local));
  for (size_t start = 0; start < batch->size(); start += step) {
    const size_t end = std::min(batch->size(), start + step);
    MicroBatch mb = BuildMicroBatch(*batch, start, end, model_->device(),
                                    LayoutFor(model_->spec(), packing_, sharing_));
    at::Tensor logp = ResponseLogprobs(model, mb, options.temperature, chunk_tokens_).cpu();
    GYRE_RETURN_IF_ERROR(EndPass(model));
    auto a = logp.accessor<float, 2>();
    for (int64_t s = 0; s < mb.S; ++s) {
      TrainSample& x = (*batch)[start + s];
      x.old_logprobs.resize(x.response.size());
      for (size_t t = 0; t < x.response.size(); ++t) x.old_logprobs[t] = a[s][t];
    }
  }
  for (int64_t p = local; p < passes; ++p) {
    GYRE_RETURN_IF_ERROR(EmptyPass(nullptr, /*backward=*/false));
  }
  return Status::Ok();
}

StatusOr<std::vector<double>> PolicyTrainer::SequenceKl(const std::vector<TrainSample>& batch,
                                                        kernels::KlKind kind, double temperature,
                                                        int64_t micro_batch_size) {
  return CatchCollectiveFailure<std::vector<double>>(
      PassesMayThrow(), [&] { return SequenceKlOnce(batch, kind, temperature, micro_batch_size); },
      [this] { AfterFailedPass(); });
}

StatusOr<std::vector<double>> PolicyTrainer::SequenceKlOnce(const std::vector<TrainSample>& batch,
                                                            kernels::KlKind kind,
                                                            double temperature,
                                                            int64_t micro_batch_size) {
  if (kind == kernels::KlKind::kNone) return InvalidArgument("SequenceKl needs k1, k2 or k3");
  TrainOptions options;
  options.temperature = temperature;
  GYRE_RETURN_IF_ERROR(Validate(batch, Objective::kSft, options));
  GYRE_RETURN_IF_ERROR(ShardParameters());
  if (reference_ == nullptr) FreezeReference();
  at::NoGradGuard no_grad;
  std::unique_ptr<model::Transformer> cast;
  const model::Transformer& model = InDtype(*model_, compute_dtype_, &cast);
  const model::Transformer& reference = ComputeReference();
  std::vector<double> out;
  out.reserve(batch.size());
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, micro_batch_size));
  const int64_t local = static_cast<int64_t>((batch.size() + step - 1) / step);
  GYRE_ASSIGN_OR_RETURN(const int64_t passes, PassesOnEveryRank(local));
  for (int64_t p = local; p < passes; ++p) {
    // As the ranks with more micro-batches do: the policy's forward, then the reference's.
    GYRE_RETURN_IF_ERROR(EmptyPass(&reference, /*backward=*/false));
  }
  for (size_t start = 0; start < batch.size(); start += step) {
    const size_t end = std::min(batch.size(), start + step);
    MicroBatch mb = BuildMicroBatch(batch, start, end, model_->device(),
                                    LayoutFor(model_->spec(), packing_, sharing_));
    const at::Tensor logp = ResponseLogprobs(model, mb, temperature, chunk_tokens_).to(at::kDouble);
    GYRE_RETURN_IF_ERROR(EndPass(model));
    const at::Tensor ref =
        ResponseLogprobs(reference, mb, temperature, chunk_tokens_).to(at::kDouble);
    GYRE_RETURN_IF_ERROR(EndPass(reference));
    // The loss kernel's estimators (kernels/reference/policy_loss_ref.h), per token.
    const at::Tensor d = (logp - ref).masked_fill(mb.mask == 0, 0.0);
    at::Tensor k;
    switch (kind) {
      case kernels::KlKind::kK1:
        k = d;
        break;
      case kernels::KlKind::kK2:
        k = 0.5 * d * d;
        break;
      case kernels::KlKind::kK3:
      case kernels::KlKind::kNone:
        k = (at::exp(-d) + d - 1.0).clamp(-10.0, 10.0);
        break;
    }
    const at::Tensor sums = (k * mb.mask.to(at::kDouble)).sum(1).cpu();
    auto a = sums.accessor<double, 1>();
    for (int64_t s = 0; s < mb.S; ++s) out.push_back(a[s]);
  }
  return out;
}

Status PolicyTrainer::SetDataParallel(comm::Communicator* comm,
                                      const DataParallelOptions& options) {
  const int rank = comm != nullptr ? comm->rank() : 0;
  const int ranks = comm != nullptr ? comm->size() : 1;
  if (shards_ != nullptr) {
    // The slices are this rank's of this many: only a group formed again with the same layout.
    GYRE_RETURN_IF_ERROR(queue_->Rebind(comm).WithContext(
        "the parameters are split; save a checkpoint and load it into the new group"));
    dp_ = comm;
    dp_options_ = options;
    dp_timeout_s_ = options.timeout_s;
    shards_->set_reduce_staging_bytes(options.bucket_bytes);
    shards_->set_reshard_after_forward(options.reshard_after_forward);
    return Status::Ok();
  }
  if (sharded_ && (sharded_->layout().rank != rank || sharded_->layout().ranks != ranks)) {
    if (sharded_->has_state()) {
      return FailedPrecondition(
          "this trainer holds rank " + std::to_string(sharded_->layout().rank) + " of " +
          std::to_string(sharded_->layout().ranks) +
          "'s slice of the optimizer state, which cannot move to rank " + std::to_string(rank) +
          " of " + std::to_string(ranks) +
          ": save a checkpoint and load it into the new group (loading reshards it)");
    }
    sharded_ =
        std::make_unique<ShardedAdamW>(optimizer_->params, sharded_->mode(), hyper_, rank, ranks);
  }
  reducer_.reset();  // removes its hooks before a new reducer installs its own
  dp_ = comm;
  dp_options_ = options;
  dp_timeout_s_ = options.timeout_s;
  // ZeRO-2 and ZeRO-3 reduce-scatter the gradients themselves (sharded_adamw.h,
  // parameter_shards.h).
  if (dp_ == nullptr || dp_->size() == 1 || sharding() == Shard::kGradients ||
      sharding() == Shard::kParameters) {
    return Status::Ok();
  }
  std::vector<std::string> names;
  for (const auto& [name, t] : model_->NamedParameters()) names.push_back(name);
  reducer_ = std::make_unique<GradReducer>(optimizer_->params, std::move(names), dp_,
                                           std::max<int64_t>(options.bucket_bytes, 1024),
                                           options.timeout_s, options.overlap_grad_reduce);
  return Status::Ok();
}

Status PolicyTrainer::AllReduce(double* values, size_t count) {
  if (dp_ == nullptr || dp_->size() == 1) return Status::Ok();
  return dp_->AllReduceSum(values, count, comm::DataType::kFloat64,
                           comm::DeadlineAfter(dp_timeout_s_));
}

Status PolicyTrainer::CheckAllRanksTookPart(double ranks_counted) const {
  const int ranks = dp_ != nullptr ? dp_->size() : 1;
  if (ranks == 1 || ranks_counted == static_cast<double>(ranks)) return Status::Ok();
  return DataLoss("only " + std::to_string(static_cast<int>(ranks_counted)) + " of " +
                  std::to_string(ranks) +
                  " data-parallel ranks took part in the step's all-reduces (a rank left); "
                  "the update was not applied");
}

void PolicyTrainer::AfterFailedPass() {
  if (shards_ == nullptr) {
    if (tp_group_ != nullptr) DropGradients();
    return;
  }
  DropGradients();
  (void)shards_->EndPass();
  if (ref_shards_ != nullptr) (void)ref_shards_->EndPass();
}

StatusOr<std::map<std::string, double>> PolicyTrainer::Step(const std::vector<TrainSample>& batch,
                                                            Objective objective, double lr,
                                                            const TrainOptions& options) {
  return CatchCollectiveFailure<std::map<std::string, double>>(
      PassesMayThrow(), [&] { return StepOnce(batch, objective, lr, options); },
      [this] { AfterFailedPass(); });
}

StatusOr<std::map<std::string, double>> PolicyTrainer::StepOnce(
    const std::vector<TrainSample>& batch, Objective objective, double lr,
    const TrainOptions& options) {
  Status valid = Validate(batch, objective, options);
  if (dp_ != nullptr && dp_->size() > 1) {
    // Every rank must agree to go on, or the others would wait in a collective.
    double bad = valid.ok() ? 0.0 : 1.0;
    GYRE_RETURN_IF_ERROR(AllReduce(&bad, 1).WithContext("data-parallel step"));
    if (valid.ok() && bad > 0) {
      return InvalidArgument("another data-parallel rank rejected its shard of this batch");
    }
  }
  GYRE_RETURN_IF_ERROR(valid);
  GYRE_RETURN_IF_ERROR(ShardParameters());
  // The KL term's reference is the policy the first such step starts from (kept if the step
  // fails: the weights are then unchanged).
  if (objective == Objective::kPolicyGradient && options.loss.kl != kernels::KlKind::kNone &&
      reference_ == nullptr) {
    FreezeReference();
  }
  std::vector<size_t> bounds = {0};  // mini-batch m is [bounds[m], bounds[m + 1])
  if (!options.mini_batch_sizes.empty()) {
    for (int64_t size : options.mini_batch_sizes) {
      if (size < 0) return InvalidArgument("negative mini-batch size");
      bounds.push_back(bounds.back() + static_cast<size_t>(size));
    }
    if (bounds.back() != batch.size()) {
      return InvalidArgument("mini_batch_sizes sum to " + std::to_string(bounds.back()) +
                             " but the batch holds " + std::to_string(batch.size()) + " samples");
    }
  } else {
    const int64_t minis = objective == Objective::kPolicyGradient
                              ? std::min<int64_t>(std::max<int64_t>(1, options.mini_batches),
                                                  static_cast<int64_t>(batch.size()))
                              : 1;
    for (int64_t m = 1; m <= minis; ++m) {
      bounds.push_back(batch.size() * static_cast<size_t>(m) / static_cast<size_t>(minis));
    }
  }
  const int64_t minis = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t proximal_version = version_;
  const bool pg = objective == Objective::kPolicyGradient;
  const bool m2po = pg && options.loss.correction == kernels::Correction::kM2po;
  // One optimizer step is atomic as it is: OptimizerStep makes every check before its one AdamW
  // update and ++version_, so it needs no snapshot.
  if (minis == 1 && !options.reset_optimizer_state && !m2po) {
    return OptimizerStep(batch, objective, lr, options, proximal_version);
  }
  // Several: mini-batch m's update is applied before mini-batch m + 1 can fail, so snapshot
  // first and roll back on every way out but success, an exception from libtorch included. The
  // ranks fail in the same mini-batch (class comment), so they all roll back.
  TakeSnapshot();
  struct RollBackUnlessCommitted {
    PolicyTrainer* trainer;
    bool committed = false;
    ~RollBackUnlessCommitted() {
      if (!committed) trainer->RestoreSnapshot();
    }
  } rollback{this};
  if (options.reset_optimizer_state) {
    if (sharded_) {
      sharded_->Reset();
    } else {
      optimizer_->adamw->state().clear();
    }
  }
  if (minis == 1 && !m2po) {
    auto metrics = OptimizerStep(batch, objective, lr, options, proximal_version);
    rollback.committed = metrics.ok();
    return metrics;
  }
  // PPO-style: every mini-batch is judged against the policy before the step (recomputed unless
  // approximated log-linearly or taken from the rollout). M2PO needs it for the whole batch to
  // pick its threshold.
  std::vector<TrainSample> all = batch;
  TrainOptions step_options = options;
  if (pg && options.proximal == Proximal::kRecompute) {
    GYRE_RETURN_IF_ERROR(ComputeOldLogprobs(&all, options));
  }
  if (m2po) {
    GYRE_ASSIGN_OR_RETURN(step_options.loss.m2po_threshold, M2poThresholdOf(all, options.m2po_tau));
  }
  std::map<std::string, double> sum;
  for (int64_t m = 0; m < minis; ++m) {
    std::vector<TrainSample> part(all.begin() + static_cast<int64_t>(bounds[m]),
                                  all.begin() + static_cast<int64_t>(bounds[m + 1]));
    auto metrics = OptimizerStep(part, objective, lr, step_options, proximal_version);
    if (!metrics.ok()) {
      if (metrics.status().message().find("no unmasked response tokens") != std::string::npos) {
        continue;  // a mini-batch of fully masked samples carries no gradient
      }
      return metrics.status().WithContext(
          "mini-batch " + std::to_string(m + 1) + " of " + std::to_string(minis) +
          (m > 0 ? " (the step's earlier mini-batches were rolled back)" : ""));
    }
    for (const auto& [k, v] : *metrics) {
      sum[k] += (k == "tokens" || k == "computed_tokens" || k == "pad_tokens") ? v : v / minis;
    }
  }
  rollback.committed = true;
  sum["mini_batches"] = static_cast<double>(minis);
  return sum;
}

StatusOr<double> PolicyTrainer::M2poThresholdOf(const std::vector<TrainSample>& batch, double tau) {
  std::vector<double> local;
  for (const TrainSample& s : batch) {
    for (size_t t = 0; t < s.response.size(); ++t) {
      if (!s.loss_mask.empty() && s.loss_mask[t] == 0.0f) continue;
      const double d = static_cast<double>(s.old_logprobs[t]) - s.rollout_logprobs[t];
      local.push_back(d * d);
    }
  }
  if (dp_ == nullptr || dp_->size() == 1) {
    return kernels::M2poThreshold(local.data(), local.size(), tau);
  }
  // Gather every rank's values with two sums: the counts (one slot per rank), then the values at
  // each rank's offset. The threshold does not depend on the order of the values.
  std::vector<double> counts(static_cast<size_t>(dp_->size()), 0.0);
  counts[static_cast<size_t>(dp_->rank())] = static_cast<double>(local.size());
  GYRE_RETURN_IF_ERROR(AllReduce(counts.data(), counts.size()).WithContext("m2po token counts"));
  size_t offset = 0, total = 0;
  for (int r = 0; r < dp_->size(); ++r) {
    if (r < dp_->rank()) offset += static_cast<size_t>(counts[static_cast<size_t>(r)]);
    total += static_cast<size_t>(counts[static_cast<size_t>(r)]);
  }
  std::vector<double> all(total, 0.0);
  std::copy(local.begin(), local.end(), all.begin() + static_cast<int64_t>(offset));
  if (total > 0) {
    GYRE_RETURN_IF_ERROR(AllReduce(all.data(), all.size()).WithContext("m2po log weights"));
  }
  return kernels::M2poThreshold(all.data(), all.size(), tau);
}

// What a step's micro-batches add up, then the ranks sum (OptimizerStep's stages).
struct StepSums {
  double loss = 0, clip = 0, kl = 0, entropy = 0, correct = 0;
  double weight = 0, corr_masked = 0;  // the behaviour weight's, over masked tokens
  double ref_kl = 0;  // the KL term, aggregated like the loss (global denominators)
  // Rollout-vs-trainer mismatch of the same tokens (policy gradient): d = logp_old -
  // logp_rollout per token, w = exp(d). Sums of tokens, |d|, [w outside 0.9..1.1], w - 1 - d, w,
  // w^2.
  double mismatch[6] = {0, 0, 0, 0, 0, 0};
  double shard_sq = 0;           // sharded: this rank's part of the squared gradient norm
  double computed = 0, pad = 0;  // positions run through the model, padding among them
};

// The step's loss settings: the batch-wide denominators every micro-batch divides by (global
// over the data-parallel ranks) and the registered loss, if the job names one.
struct StepPlan {
  double total_tokens = 0, total_seqs = 0;
  kernels::PolicyLossParams loss;
  const TokenLossFn* user_loss = nullptr;
};

namespace {

// The proximal policy's log-probs of a policy-gradient micro-batch (TrainOptions::proximal), from
// the trainer's own before the update (`trainer_lp`). Recomputed: with one optimizer step per
// batch it is the current one.
at::Tensor ProximalLogprobs(const MicroBatch& mb, const at::Tensor& trainer_lp,
                            const TrainOptions& options, bool loglinear) {
  if (options.proximal == Proximal::kBehaviour) return mb.rollout_lp;
  if (loglinear && !mb.has_old) {
    at::NoGradGuard ng;
    return mb.rollout_lp + mb.alpha * (trainer_lp - mb.rollout_lp);
  }
  return trainer_lp;
}

// The mismatch telemetry of one micro-batch (StepSums::mismatch), on the model's device: the
// trainer's own log-probs (before this update) against the rollout's.
at::Tensor MismatchSums(const MicroBatch& mb, const at::Tensor& trainer_lp) {
  at::NoGradGuard ng;
  const at::Tensor& m = mb.rollout_mask;
  at::Tensor d = (trainer_lp - mb.rollout_lp).masked_fill(m == 0, 0.0);
  at::Tensor w = d.exp();
  return at::stack({m.sum(), (d.abs() * m).sum(),
                    (((w < 0.9) | (w > 1.1)).to(at::kFloat) * m).sum(), ((w - 1.0 - d) * m).sum(),
                    (w * m).sum(), (w * w * m).sum()})
      .to(at::kDouble);
}

// A registered loss's term of one micro-batch, aggregated with the loss's weights (a scalar with
// its graph); InvalidArgument when the function returns the wrong shape.
StatusOr<at::Tensor> UserLossTerm(const TokenLossFn& fn, const std::string& name,
                                  const MicroBatch& mb, const at::Tensor& logp,
                                  const at::Tensor& old, const TrainOptions& options,
                                  const kernels::PolicyLossParams& loss) {
  TokenLossInputs in;
  in.logp = logp;
  in.logp_old = old.detach();
  in.logp_rollout = mb.rollout_lp;
  in.advantages = mb.adv;
  in.mask = mb.mask;
  in.clip_eps_low = options.loss.clip_eps_low;
  in.clip_eps_high = options.loss.clip_eps_high;
  at::Tensor per_token = fn(in);
  if (!per_token.defined() || per_token.sizes() != logp.sizes()) {
    return InvalidArgument("algorithm.policy_loss '" + name + "' returned a tensor of shape " +
                           (per_token.defined() ? c10::str(per_token.sizes()) : "undefined") +
                           ", expected one loss per token " + c10::str(logp.sizes()));
  }
  // Masked-out tokens may hold anything: select, do not multiply (0 * inf is NaN).
  return (at::where(mb.mask != 0, per_token, at::zeros_like(per_token)) * mb.mask *
          AggregationScale(mb.mask, loss))
      .sum();
}

}  // namespace

StatusOr<StepPlan> PolicyTrainer::PlanStep(const std::vector<TrainSample>& batch,
                                           Objective objective, const TrainOptions& options) {
  StepPlan plan;
  for (const auto& s : batch) {
    double m = 0;
    for (size_t t = 0; t < s.response.size(); ++t) m += s.loss_mask.empty() ? 1.0 : s.loss_mask[t];
    plan.total_tokens += m;
    if (m > 0) plan.total_seqs += 1;
  }
  // Data parallel: the denominators are those of the global batch. totals[2] counts the ranks:
  // without a missing rank's tokens the denominators are wrong, and a rank whose part of this
  // mini-batch is fully masked would skip it below and never reach the metrics' count.
  double totals[3] = {plan.total_tokens, plan.total_seqs, 1.0};
  GYRE_RETURN_IF_ERROR(AllReduce(totals, 3).WithContext("data-parallel denominators"));
  GYRE_RETURN_IF_ERROR(CheckAllRanksTookPart(totals[2]));
  plan.total_tokens = totals[0];
  plan.total_seqs = totals[1];
  if (plan.total_tokens <= 0) {
    return InvalidArgument("training batch has no unmasked response tokens");
  }
  plan.loss = options.loss;
  plan.loss.global_tokens = plan.total_tokens;
  plan.loss.global_seqs = plan.total_seqs;
  if (objective == Objective::kPolicyGradient && !options.user_loss.empty()) {
    plan.user_loss = FindUserPolicyLoss(options.user_loss);
    if (plan.user_loss == nullptr) {
      return FailedPrecondition(
          "algorithm.policy_loss '" + options.user_loss +
          "' is not registered in this trainer process: the program the workers run must call "
          "gyre::RegisterPolicyLoss before gyre::MaybeRunWorker");
    }
  }
  return plan;
}

Status PolicyTrainer::RunMicroBatches(const std::vector<TrainSample>& batch, Objective objective,
                                      const TrainOptions& options, const StepPlan& plan,
                                      int64_t proximal_version, StepSums* sums) {
  const bool loglinear = objective == Objective::kPolicyGradient &&
                         options.proximal == Proximal::kLogLinear && version_ > proximal_version;
  // The mismatch sums stay on the model's device and are read once after the loop (one host
  // sync, not six per micro-batch).
  at::Tensor mismatch;
  int64_t computed = 0, pad = 0;
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, options.micro_batch_size));
  const int64_t local = static_cast<int64_t>((batch.size() + step - 1) / step);
  GYRE_ASSIGN_OR_RETURN(const int64_t passes, PassesOnEveryRank(local));
  const bool uses_reference =
      objective == Objective::kPolicyGradient && options.loss.kl != kernels::KlKind::kNone;
  for (int64_t p = local; p < passes; ++p) {
    if (uses_reference && reference_ == nullptr) {
      return FailedPrecondition("the KL term has no reference policy");
    }
    GYRE_RETURN_IF_ERROR(EmptyPass(uses_reference ? &ComputeReference() : nullptr, true));
  }
  for (size_t start = 0; start < batch.size(); start += step) {
    const size_t end = std::min(batch.size(), start + step);
    MicroBatch mb = BuildMicroBatch(
        batch, start, end, model_->device(), LayoutFor(model_->spec(), packing_, sharing_),
        loglinear ? LogLinear{proximal_version, version_} : LogLinear{});
    computed += mb.computed;
    pad += mb.pad;
    // A cast copy per micro-batch: its graph goes with the micro-batch's backward.
    std::unique_ptr<model::Transformer> cast;
    const double temp = objective == Objective::kSft ? 1.0 : options.temperature;
    // The entropy bonus needs the entropy with its graph; otherwise it is telemetry only.
    const bool bonus = objective == Objective::kPolicyGradient && options.entropy_coef > 0;
    const ResponseStats stats =
        ResponseTokenStats(InDtype(*model_, compute_dtype_, &cast), mb, temp, chunk_tokens_, bonus);
    at::Tensor logp = stats.logp;  // [S, R]
    {
      at::NoGradGuard ng;
      sums->entropy += (stats.entropy.detach() * mb.mask).sum().item<double>();
      sums->correct += (stats.argmax_ok * mb.mask).sum().item<double>();
    }
    // The last micro-batch's backward all-reduces gradient buckets as they complete.
    const bool last = end == batch.size();
    if (objective == Objective::kSft) {
      at::Tensor loss = -(logp * mb.mask).sum() / plan.total_tokens;
      if (last && reducer_ != nullptr) reducer_->Arm();
      loss.backward();
      GYRE_RETURN_IF_ERROR(EndPass(*model_));
      sums->loss += loss.item<double>();
      continue;
    }
    const at::Tensor trainer_lp = mb.has_old ? mb.old_lp : logp.detach();
    const at::Tensor old = ProximalLogprobs(mb, trainer_lp, options, loglinear);
    const at::Tensor part = MismatchSums(mb, trainer_lp);
    mismatch = mismatch.defined() ? mismatch + part : part;
    at::Tensor ref_lp;
    if (options.loss.kl != kernels::KlKind::kNone) {
      if (reference_ == nullptr) return FailedPrecondition("the KL term has no reference policy");
      at::NoGradGuard ng;
      ref_lp = ResponseLogprobs(ComputeReference(), mb, temp, chunk_tokens_);
      GYRE_RETURN_IF_ERROR(EndPass(ComputeReference()));
    }
    // A registered loss replaces the kernel's policy term: the kernel then runs with zero
    // advantages, which leaves it the KL term and the behaviour-weight statistics.
    GYRE_ASSIGN_OR_RETURN(
        ops::PolicyLossResult r,
        ops::PolicyLoss(
            logp, old,
            options.loss.correction != kernels::Correction::kNone ? mb.rollout_lp : at::Tensor(),
            ref_lp, plan.user_loss != nullptr ? at::zeros_like(mb.adv) : mb.adv, mb.mask,
            plan.loss));
    at::Tensor user_term;
    if (plan.user_loss != nullptr) {
      GYRE_ASSIGN_OR_RETURN(user_term, UserLossTerm(*plan.user_loss, options.user_loss, mb, logp,
                                                    old, options, plan.loss));
    }
    sums->ref_kl += r.stats.kl;
    if (last && reducer_ != nullptr) reducer_->Arm();
    if (bonus || user_term.defined()) {
      // One backward for every term: d/d logp of sum(logp * g) is the kernel's gradient g.
      at::Tensor surrogate = (logp * r.grad_logp).sum();
      if (user_term.defined()) {
        surrogate = surrogate + user_term;
        sums->loss += user_term.item<double>();
      }
      if (bonus) {
        at::Tensor agg = (stats.entropy * mb.mask * AggregationScale(mb.mask, plan.loss)).sum();
        surrogate = surrogate - options.entropy_coef * agg;
        sums->loss -= options.entropy_coef * agg.item<double>();
      }
      surrogate.backward();
    } else {
      logp.backward(r.grad_logp);
    }
    GYRE_RETURN_IF_ERROR(EndPass(*model_));
    sums->loss += r.stats.loss;
    sums->clip += r.stats.clip_frac * r.stats.tokens;
    sums->kl += r.stats.approx_kl * r.stats.tokens;
    sums->weight += r.stats.tis_mean * r.stats.tokens;
    sums->corr_masked += r.stats.corr_masked_frac * r.stats.tokens;
  }
  if (mismatch.defined()) {
    at::Tensor host = mismatch.cpu();
    for (int i = 0; i < 6; ++i) sums->mismatch[i] = host[i].item<double>();
  }
  sums->computed = static_cast<double>(computed);
  sums->pad = static_cast<double>(pad);
  return Status::Ok();
}

Status PolicyTrainer::SumAcrossRanks(StepSums* sums) {
  if (reducer_ != nullptr) {
    // Every rank gets here, also one with an empty shard (no backward at all): its gradients are
    // zeros, and it joins every bucket's collective.
    GYRE_RETURN_IF_ERROR(reducer_->Finish().WithContext(
        reducer_->overlap() ? "data-parallel gradient all-reduce (overlapped with backward)"
                            : "data-parallel gradient all-reduce"));
  }
  // Sharded: this rank's slice of the summed gradient, and its part of the squared norm.
  if (sharded_) {
    // (Split parameters: the backward passes already summed every unit's gradient into the
    // optimizer's gradient slice.)
    Status reduced = shards_ ? Status::Ok() : sharded_->ReduceGradients(dp_, dp_timeout_s_);
    if (!reduced.ok()) {
      DropGradients();
      return reduced.WithContext("data-parallel gradient reduce-scatter");
    }
    if (shards_ != nullptr && tp_group_ != nullptr) {
      // Split parameters of tensor-parallel slices: the optimizer's parameters are the units'
      // flat slices, so each parameter's part is weighted by name.
      const double replicated = 1.0 / tp_size();
      sums->shard_sq =
          shards_->WeightedSquaredNorm(sharded_->gradient_slice(), [&](const std::string& name) {
            return model::TensorParallelDim(name) >= 0 ? 1.0 : replicated;
          });
    } else {
      sums->shard_sq = sharded_->LocalSquaredNorm(shards_ ? std::vector<double>() : NormWeights());
    }
  }
  // values[5] counts the ranks that took part. Gloo can complete a collective without a peer
  // that closed its connections (docs/weight-sync.md); a short count means the summed gradients
  // above lack that rank's part, so the update must not be applied.
  double* scalars[] = {&sums->loss,        &sums->clip,        &sums->kl,
                       &sums->entropy,     &sums->correct,     nullptr,
                       &sums->mismatch[0], &sums->mismatch[1], &sums->mismatch[2],
                       &sums->mismatch[3], &sums->mismatch[4], &sums->mismatch[5],
                       &sums->weight,      &sums->corr_masked, &sums->ref_kl,
                       &sums->shard_sq,    &sums->computed,    &sums->pad};
  constexpr size_t kCount = sizeof(scalars) / sizeof(scalars[0]);
  double values[kCount];
  for (size_t i = 0; i < kCount; ++i) values[i] = scalars[i] != nullptr ? *scalars[i] : 1.0;
  if (Status s = AllReduce(values, kCount); !s.ok()) {
    DropGradients();
    return s.WithContext("data-parallel metrics");
  }
  if (Status all = CheckAllRanksTookPart(values[5]); !all.ok()) {
    DropGradients();
    return all;
  }
  for (size_t i = 0; i < kCount; ++i) {
    if (scalars[i] != nullptr) *scalars[i] = values[i];
  }
  return Status::Ok();
}

StatusOr<double> PolicyTrainer::ApplyUpdate(double lr, double grad_clip, double shard_sq) {
  // Global gradient-norm clipping, then AdamW.
  // Tensor parallel: the slices' squares summed over the ranks, each whole (replicated)
  // parameter's once (its 1/T share on each rank; T is a power of two in practice, exact). Sharded,
  // shard_sq is already this slice's (its data-parallel ranks' parts, summed).
  double sq = shard_sq;
  if (!sharded_) {
    const std::vector<double> weights = NormWeights();
    for (size_t i = 0; i < optimizer_->params.size(); ++i) {
      const at::Tensor& g = optimizer_->params[i].grad();
      if (!g.defined()) continue;
      sq += (weights.empty() ? 1.0 : weights[i]) * g.pow(2).sum().item<double>();
    }
  }
  if (tp_group_ != nullptr) {
    at::Tensor total = at::full({1}, sq, at::TensorOptions().dtype(at::kDouble));
    try {
      tp_group_->AllReduceSum(total);
    } catch (const std::exception& e) {
      DropGradients();
      return Unavailable(std::string("the gradient norm over the tensor-parallel ranks: ") +
                         e.what());
    }
    sq = total.item<double>();
  }
  const double grad_norm = std::sqrt(sq);
  if (!std::isfinite(grad_norm)) {
    DropGradients();
    return Internal("non-finite gradient norm; the step was skipped");
  }
  const bool clip = grad_clip > 0 && grad_norm > grad_clip;
  const double scale = clip ? grad_clip / (grad_norm + 1e-6) : 1.0;
  if (sharded_) {
    if (clip) sharded_->ScaleGradients(scale);
    sharded_->Update(lr);
    // Every rank updated its slice; the exchange must reach every rank, or the weights would
    // differ between ranks. A failure here leaves this rank's slice updated and the rest old,
    // so the step is not all or nothing: the group is aborted (communicator.h) and the job
    // resumes from its last checkpoint.
    // (Split parameters need no exchange: the next forward gathers the updated slices.)
    GYRE_RETURN_IF_ERROR(sharded_->GatherWeights(shards_ ? nullptr : dp_, dp_timeout_s_)
                             .WithContext("sharded optimizer: the updated weights could not be "
                                          "exchanged, so this trainer's weights are partly "
                                          "updated; resume from the last checkpoint"));
  } else {
    if (clip) {
      at::NoGradGuard ng;
      for (auto& p : optimizer_->params) {
        if (p.grad().defined()) p.grad().mul_(scale);
      }
    }
    for (auto& group : optimizer_->adamw->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer_->adamw->step();
  }
  return grad_norm;
}

std::map<std::string, double> PolicyTrainer::StepMetrics(const StepSums& sums, const StepPlan& plan,
                                                         Objective objective,
                                                         const TrainOptions& options, double lr,
                                                         double grad_norm) const {
  const double total_tokens = plan.total_tokens;
  std::map<std::string, double> m;
  m["loss"] = sums.loss;
  m["grad_norm"] = grad_norm;
  m["lr"] = lr;  // what this AdamW step applied (the controller's schedule reaches here)
  m["tokens"] = total_tokens;
  m["computed_tokens"] = sums.computed;
  m["pad_tokens"] = sums.pad;
  {
    // What this rank holds between steps (sharded_adamw.h): moments, and gradients.
    int64_t opt_bytes = 0, grad_bytes = 0;
    if (sharded_) {
      opt_bytes = sharded_->optimizer_state_bytes();
      grad_bytes = sharded_->gradient_bytes();
    } else {
      for (const auto& p : optimizer_->params) {
        if (p.grad().defined()) grad_bytes += p.grad().nbytes();
      }
      for (const auto& [key, st] : optimizer_->adamw->state()) {
        const auto& a = static_cast<const torch::optim::AdamWParamState&>(*st);
        opt_bytes += a.exp_avg().nbytes() + a.exp_avg_sq().nbytes();
      }
    }
    m["optimizer_state_mib"] = static_cast<double>(opt_bytes) / (1 << 20);
    m["gradient_mib"] = static_cast<double>(grad_bytes) / (1 << 20);
    // The float32 weights this rank holds between steps (its slices when split).
    int64_t weight_bytes = 0;
    for (const auto& p : optimizer_->params) weight_bytes += p.nbytes();
    m["weights_mib"] = static_cast<double>(weight_bytes) / (1 << 20);
  }
  m["entropy"] = sums.entropy / total_tokens;
  m["token_accuracy"] = sums.correct / total_tokens;
  if (objective == Objective::kPolicyGradient) {
    m["clip_frac"] = sums.clip / total_tokens;
    m["approx_kl"] = sums.kl / total_tokens;
    if (options.loss.kl != kernels::KlKind::kNone) {
      // docs/algorithms.md, "KL to the reference policy": the estimator, aggregated as the loss.
      m["kl_ref"] = sums.ref_kl;
    }
    if (options.loss.correction != kernels::Correction::kNone) {
      // docs/algorithms.md, "Off-policy corrections".
      m["behaviour_weight_mean"] = sums.weight / total_tokens;
      m["correction_masked_frac"] = sums.corr_masked / total_tokens;
    }
    const double* mm = sums.mismatch;
    if (mm[0] > 0) {
      // docs/algorithms.md, "Telemetry": the trainer's log-probs of the tokens the rollout engine
      // sampled, before the update, against the engine's own.
      m["mismatch_abs_logprob"] = mm[1] / mm[0];
      m["mismatch_ratio_outside"] = mm[2] / mm[0];
      m["mismatch_kl_k3"] = mm[3] / mm[0];
      m["mismatch_ess"] = mm[5] > 0 ? mm[4] * mm[4] / (mm[5] * mm[0]) : 0.0;
    }
  }
  return m;
}

// One AdamW step, in stages: the step's denominators and loss (PlanStep), forward and backward of
// every micro-batch (RunMicroBatches), the gradients and metrics summed over the ranks
// (SumAcrossRanks), the clipped update (ApplyUpdate), the metrics (StepMetrics).
StatusOr<std::map<std::string, double>> PolicyTrainer::OptimizerStep(
    const std::vector<TrainSample>& batch, Objective objective, double lr,
    const TrainOptions& options, int64_t proximal_version) {
  GYRE_ASSIGN_OR_RETURN(const StepPlan plan, PlanStep(batch, objective, options));
  BeginGradients();
  {
    // If backward throws after the reducer was armed, wait for its communication thread before
    // the exception leaves the step (it must not touch the communicator or gradients after
    // that).
    struct CancelOnExit {
      GradReducer* reducer;
      ~CancelOnExit() {
        if (reducer != nullptr) reducer->Cancel();
      }
    } cancel_on_exit{reducer_.get()};
    StepSums sums;
    if (Status ran = RunMicroBatches(batch, objective, options, plan, proximal_version, &sums);
        !ran.ok()) {
      AfterFailedPass();
      return ran;
    }
    GYRE_RETURN_IF_ERROR(SumAcrossRanks(&sums));
    GYRE_ASSIGN_OR_RETURN(const double grad_norm,
                          ApplyUpdate(lr, options.grad_clip, sums.shard_sq));
    if (shards_ != nullptr) shards_->ReleaseGradients();  // views of the optimizer's slice
    ++version_;
    return StepMetrics(sums, plan, objective, options, lr, grad_norm);
  }
}

}  // namespace gyre::trainer
