#include "trainer/sharded_adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/check.h"

namespace gyre::trainer {

const char* ShardName(Shard s) {
  switch (s) {
    case Shard::kNone:
      return "none";
    case Shard::kOptimizer:
      return "optimizer";
    case Shard::kGradients:
      return "gradients";
    case Shard::kParameters:
      return "parameters";
  }
  return "?";
}

StatusOr<Shard> ParseShard(const std::string& name) {
  for (Shard s : {Shard::kNone, Shard::kOptimizer, Shard::kGradients, Shard::kParameters}) {
    if (name == ShardName(s)) return s;
  }
  return InvalidArgument("trainer.shard '" + name +
                         "' is not one of none, optimizer, gradients, parameters");
}

ShardLayout PlanShards(const std::vector<int64_t>& numels, int rank, int ranks) {
  GYRE_CHECK(ranks >= 1 && rank >= 0 && rank < ranks) << "rank " << rank << " of " << ranks;
  ShardLayout l;
  l.rank = rank;
  l.ranks = ranks;
  for (int64_t n : numels) l.total += n;
  l.chunk = (l.total + ranks - 1) / ranks;
  l.begin = std::min(l.total, l.chunk * rank);
  l.end = std::min(l.total, l.chunk * (rank + 1));
  return l;
}

ShardedAdamW::ShardedAdamW(std::vector<at::Tensor> params, Shard mode, Hyper hyper, int rank,
                           int ranks)
    : params_(std::move(params)), mode_(mode), hyper_(hyper) {
  GYRE_CHECK(mode_ == Shard::kOptimizer || mode_ == Shard::kGradients);
  GYRE_CHECK(!params_.empty());
  std::vector<int64_t> numels;
  int64_t offset = 0;
  for (const at::Tensor& p : params_) {
    GYRE_CHECK(p.scalar_type() == at::kFloat && p.is_contiguous() &&
               p.device() == params_.front().device())
        << "sharded AdamW needs contiguous float32 parameters on one device";
    numels.push_back(p.numel());
    offsets_.push_back(offset);
    offset += p.numel();
  }
  layout_ = PlanShards(numels, rank, ranks);
  steps_.assign(params_.size(), 0);
  const auto opts = params_.front().options().requires_grad(false);
  exp_avg_ = at::zeros({layout_.size()}, opts);
  exp_avg_sq_ = at::zeros({layout_.size()}, opts);
  grad_ = at::zeros({layout_.chunk}, opts);
}

ShardedAdamW::~ShardedAdamW() { ReleaseGradients(); }

bool ShardedAdamW::has_state() const {
  return std::any_of(steps_.begin(), steps_.end(), [](int64_t s) { return s > 0; });
}

template <typename Fn>
void ShardedAdamW::ForEachSegment(Fn fn) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t lo = std::max(layout_.begin, offsets_[i]);
    const int64_t hi = std::min(layout_.end, offsets_[i] + params_[i].numel());
    if (lo < hi) fn(i, lo - offsets_[i], lo - layout_.begin, hi - lo);
  }
}

at::Tensor ShardedAdamW::CommBuffer(int64_t n, comm::Communicator* comm) const {
  // NCCL works on device memory; Gloo on host memory.
  const bool device = comm != nullptr && comm->backend() == "nccl";
  auto opts = at::TensorOptions().dtype(at::kFloat);
  if (device) opts = opts.device(params_.front().device());
  return at::empty({n}, opts);
}

void ShardedAdamW::BeginStep() {
  at::NoGradGuard no_grad;
  ReleaseGradients();
  if (mode_ != Shard::kGradients) return;
  flat_grad_ = at::zeros({layout_.chunk * layout_.ranks}, params_.front().options());
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    // Autograd accumulates into a defined gradient in place, so the backward passes write the
    // flat buffer directly.
    p.mutable_grad() = flat_grad_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
  }
}

Status ShardedAdamW::ReduceGradients(comm::Communicator* comm, double timeout_s) {
  at::NoGradGuard no_grad;
  // A group of one still runs its collectives: a single GPU trainer exercises the NCCL path.
  const bool group = comm != nullptr;
  if (mode_ == Shard::kOptimizer) {
    grad_.zero_();
    ForEachSegment([&](size_t i, int64_t poff, int64_t soff, int64_t len) {
      const at::Tensor& g = params_[i].grad();
      if (g.defined()) grad_.narrow(0, soff, len).copy_(g.reshape({-1}).narrow(0, poff, len));
    });
    return Status::Ok();
  }
  GYRE_CHECK(flat_grad_.defined()) << "ReduceGradients without BeginStep";
  // The parameters' gradients are views of flat_grad_: drop them first, so that the buffer goes
  // as soon as the collective has read it.
  for (const at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
  at::Tensor flat = std::move(flat_grad_);
  flat_grad_ = at::Tensor();
  if (!group) {
    grad_.copy_(flat.narrow(0, 0, layout_.chunk));
    return Status::Ok();
  }
  at::Tensor out = CommBuffer(layout_.chunk, comm);
  const std::string what = "reduce-scatter of " + std::to_string(layout_.total) + " gradients";
  at::Tensor in = flat.device() == out.device() ? flat : flat.to(out.device());
  flat = at::Tensor();
  GYRE_RETURN_IF_ERROR(comm->ReduceScatterSum(in.data_ptr<float>(), out.data_ptr<float>(),
                                              static_cast<size_t>(layout_.chunk),
                                              comm::DataType::kFloat32,
                                              comm::DeadlineAfter(timeout_s))
                           .WithContext(what));
  grad_.copy_(out);
  return Status::Ok();
}

double SquaredSum(const at::Tensor& v) {
  constexpr int64_t kPiece = 1 << 20;
  const at::Tensor flat = v.reshape({-1});
  at::Tensor sum = at::zeros({}, v.options().dtype(at::kDouble));
  for (int64_t at = 0; at < flat.numel(); at += kPiece) {
    const int64_t n = std::min(kPiece, flat.numel() - at);
    sum += flat.narrow(0, at, n).to(at::kDouble).pow_(2).sum();
  }
  return sum.item<double>();
}

double ShardedAdamW::LocalSquaredNorm(const std::vector<double>& weights) const {
  if (weights.empty()) return SquaredSum(grad_.narrow(0, 0, layout_.size()));
  GYRE_CHECK(weights.size() == params_.size())
      << weights.size() << " norm weights for " << params_.size() << " parameters";
  double total = 0;
  ForEachSegment([&](size_t i, int64_t /*poff*/, int64_t soff, int64_t len) {
    total += weights[i] * SquaredSum(grad_.narrow(0, soff, len));
  });
  return total;
}

void ShardedAdamW::ScaleGradients(double scale) {
  at::NoGradGuard no_grad;
  grad_.mul_(scale);
}

void ShardedAdamW::Update(double lr) {
  at::NoGradGuard no_grad;
  for (int64_t& s : steps_) ++s;
  // torch::optim::AdamW's arithmetic, operation for operation, on slices.
  const double b1 = hyper_.beta1, b2 = hyper_.beta2;
  ForEachSegment([&](size_t i, int64_t poff, int64_t soff, int64_t len) {
    at::Tensor p = params_[i].detach().view({-1}).narrow(0, poff, len);
    at::Tensor g = grad_.narrow(0, soff, len);
    at::Tensor m = exp_avg_.narrow(0, soff, len);
    at::Tensor v = exp_avg_sq_.narrow(0, soff, len);
    const double step = static_cast<double>(steps_[i]);
    p.mul_(1 - lr * hyper_.weight_decay);
    const double bias1 = 1 - std::pow(b1, step);
    const double bias2 = 1 - std::pow(b2, step);
    m.mul_(b1).add_(g, 1 - b1);
    v.mul_(b2).addcmul_(g, g, 1 - b2);
    at::Tensor denom = (v.sqrt() / std::sqrt(bias2)).add_(hyper_.eps);
    p.addcdiv_(m, denom, -(lr / bias1));
  });
}

Status ShardedAdamW::GatherWeights(comm::Communicator* comm, double timeout_s) {
  if (comm == nullptr) return Status::Ok();  // one process: updated in place
  at::NoGradGuard no_grad;
  at::Tensor mine = CommBuffer(layout_.chunk, comm).zero_();
  ForEachSegment([&](size_t i, int64_t poff, int64_t soff, int64_t len) {
    mine.narrow(0, soff, len).copy_(params_[i].detach().view({-1}).narrow(0, poff, len));
  });
  at::Tensor all = CommBuffer(layout_.chunk * layout_.ranks, comm);
  GYRE_RETURN_IF_ERROR(
      comm->AllGather(mine.data_ptr<float>(), all.data_ptr<float>(),
                      static_cast<size_t>(layout_.chunk), comm::DataType::kFloat32,
                      comm::DeadlineAfter(timeout_s))
          .WithContext("all-gather of " + std::to_string(layout_.total) + " updated weights"));
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    p.detach().view({-1}).copy_(all.narrow(0, offsets_[i], p.numel()));
  }
  return Status::Ok();
}

void ShardedAdamW::ReleaseGradients() {
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  flat_grad_ = at::Tensor();
}

void ShardedAdamW::Reset() {
  std::fill(steps_.begin(), steps_.end(), 0);
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
}

ShardedAdamW::State ShardedAdamW::Get() const {
  State s;
  s.steps = steps_;
  s.exp_avg = exp_avg_.cpu().clone();
  s.exp_avg_sq = exp_avg_sq_.cpu().clone();
  return s;
}

Status ShardedAdamW::Set(const State& state) {
  if (state.steps.size() != params_.size()) {
    return InvalidArgument("sharded optimizer state has " + std::to_string(state.steps.size()) +
                           " step counts for " + std::to_string(params_.size()) + " parameters");
  }
  for (int64_t s : state.steps) {
    if (s < 0) return InvalidArgument("sharded optimizer state has a negative step count");
  }
  for (const at::Tensor* t : {&state.exp_avg, &state.exp_avg_sq}) {
    if (!t->defined() || t->scalar_type() != at::kFloat || t->dim() != 1 ||
        t->size(0) != layout_.size()) {
      return InvalidArgument("sharded optimizer moments must be float32 vectors of " +
                             std::to_string(layout_.size()) + " elements (rank " +
                             std::to_string(layout_.rank) + " of " + std::to_string(layout_.ranks) +
                             ")");
    }
  }
  at::NoGradGuard no_grad;
  steps_ = state.steps;
  exp_avg_.copy_(state.exp_avg);
  exp_avg_sq_.copy_(state.exp_avg_sq);
  return Status::Ok();
}

Status ShardedAdamW::SetFromWhole(const std::vector<int64_t>& steps,
                                  const std::vector<at::Tensor>& exp_avg,
                                  const std::vector<at::Tensor>& exp_avg_sq) {
  if (exp_avg.size() != params_.size() || exp_avg_sq.size() != params_.size()) {
    return InvalidArgument("optimizer moments for " + std::to_string(exp_avg.size()) + " and " +
                           std::to_string(exp_avg_sq.size()) + " parameters, the model has " +
                           std::to_string(params_.size()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    for (const at::Tensor* t : {&exp_avg[i], &exp_avg_sq[i]}) {
      if (t->defined() &&
          (!at::isFloatingType(t->scalar_type()) || t->sizes() != params_[i].sizes())) {
        return InvalidArgument("optimizer moments of parameter " + std::to_string(i) +
                               " do not match the parameter's shape");
      }
    }
  }
  State state;
  state.steps = steps;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  state.exp_avg = at::zeros({layout_.size()}, opts);
  state.exp_avg_sq = at::zeros({layout_.size()}, opts);
  at::NoGradGuard no_grad;
  ForEachSegment([&](size_t i, int64_t poff, int64_t soff, int64_t len) {
    if (exp_avg[i].defined()) {
      state.exp_avg.narrow(0, soff, len).copy_(exp_avg[i].reshape({-1}).narrow(0, poff, len));
    }
    if (exp_avg_sq[i].defined()) {
      state.exp_avg_sq.narrow(0, soff, len).copy_(exp_avg_sq[i].reshape({-1}).narrow(0, poff, len));
    }
  });
  return Set(state);  // checks the step counts
}

at::Tensor ShardedAdamW::MomentPart(size_t param, bool second) const {
  GYRE_CHECK(param < params_.size()) << "parameter " << param << " of " << params_.size();
  at::NoGradGuard no_grad;
  const at::Tensor& moments = second ? exp_avg_sq_ : exp_avg_;
  at::Tensor out = at::zeros({params_[param].numel()}, moments.options());
  ForEachSegment([&](size_t i, int64_t poff, int64_t soff, int64_t len) {
    if (i == param) out.narrow(0, poff, len).copy_(moments.narrow(0, soff, len));
  });
  return out.view(params_[param].sizes());
}

void ShardedAdamW::SetMomentRange(int64_t offset, const at::Tensor& m, const at::Tensor& v) {
  GYRE_CHECK(m.numel() == v.numel() && offset >= 0 && offset + m.numel() <= exp_avg_.numel())
      << "moment range " << offset << " + " << m.numel() << " of " << exp_avg_.numel();
  at::NoGradGuard no_grad;
  exp_avg_.narrow(0, offset, m.numel()).copy_(m.reshape({-1}));
  exp_avg_sq_.narrow(0, offset, v.numel()).copy_(v.reshape({-1}));
}

void ShardedAdamW::SetSteps(const std::vector<int64_t>& steps) {
  GYRE_CHECK(steps.size() == steps_.size()) << steps.size() << " step counts for " << steps_.size();
  steps_ = steps;
}

int64_t ShardedAdamW::optimizer_state_bytes() const {
  return exp_avg_.nbytes() + exp_avg_sq_.nbytes();
}

int64_t ShardedAdamW::gradient_bytes() const {
  int64_t bytes = grad_.nbytes();
  if (mode_ == Shard::kOptimizer) {
    for (const at::Tensor& p : params_) {
      if (p.grad().defined()) bytes += p.grad().nbytes();
    }
  }
  return bytes;
}

}  // namespace gyre::trainer
