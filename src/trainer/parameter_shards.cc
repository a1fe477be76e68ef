#include "trainer/parameter_shards.h"

#include <ATen/ATen.h>
#include <malloc.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "comm/device_weights.h"
#include "common/check.h"

namespace gyre::trainer {

// ---------------------------------------------------------------------------------------------
CollectiveQueue::CollectiveQueue(comm::Communicator* comm, double timeout_s)
    : comm_(comm),
      rank_(comm != nullptr ? comm->rank() : 0),
      ranks_(comm != nullptr ? comm->size() : 1),
      timeout_s_(timeout_s),
      thread_([this] { Loop(); }) {}

Status CollectiveQueue::Rebind(comm::Communicator* comm) {
  const int rank = comm != nullptr ? comm->rank() : 0, ranks = comm != nullptr ? comm->size() : 1;
  if (rank != rank_ || ranks != ranks_) {
    return FailedPrecondition("sharded parameters are laid out for rank " + std::to_string(rank_) +
                              " of " + std::to_string(ranks_) + ", not rank " +
                              std::to_string(rank) + " of " + std::to_string(ranks));
  }
  (void)Drain();
  std::lock_guard<std::mutex> lock(mu_);
  comm_ = comm;
  first_error_ = Status::Ok();
  return Status::Ok();
}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t CollectiveQueue::Post(std::string what, Task task) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.emplace_back(std::move(what), std::move(task));
  cv_.notify_all();
  return ++posted_;
}

Status CollectiveQueue::Wait(int64_t ticket) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return first_error_;
}

Status CollectiveQueue::Drain() {
  int64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = posted_;
  }
  return Wait(last);
}

double CollectiveQueue::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

double CollectiveQueue::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_s_;
}

void CollectiveQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    auto [what, task] = std::move(queue_.front());
    queue_.pop_front();
    if (first_error_.ok()) {
      comm::Communicator* comm = comm_;
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      Status s;
      try {
        s = task(comm, comm::DeadlineAfter(timeout_s_));
      } catch (const std::exception& e) {
        s = Internal(e.what());
      }
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      busy_s_ += took;
      if (!s.ok()) first_error_ = s.WithContext(what);
    }
    ++done_;
    cv_.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------
namespace {

// The storage of a gathered unit is returned while the unit is not needed and allocated again
// before it is gathered. Autograd keeps views of it (weights a backward reads); they see the
// new contents because the gather writes the bytes without an ATen operation on those views
// (which would bump their version counter and make autograd refuse them).
void FreeStorage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

void AllocateStorage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == bytes && s->data() != nullptr) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

bool HasStorage(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl()->nbytes() > 0; }

StatusOr<comm::DataType> CommType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return comm::DataType::kFloat32;
    case at::kBFloat16:
      return comm::DataType::kBFloat16;
    case at::kHalf:
      return comm::DataType::kFloat16;
    default:
      return InvalidArgument(std::string("sharded parameters cannot compute in ") +
                             c10::toString(t));
  }
}

[[noreturn]] void ThrowStatus(const Status& s) { throw std::runtime_error(s.ToString()); }

// Elements [begin, begin + out.numel()) of a unit's flat gradient (its parameters' gradients
// `grads` of `numels` elements, in order, then padding) into `out` (float32): zero where a
// parameter has no gradient and in the padding.
void StageGradients(const std::vector<at::Tensor>& grads, const std::vector<int64_t>& numels,
                    int64_t begin, const at::Tensor& out) {
  const int64_t end = begin + out.numel();
  int64_t offset = 0, filled = begin;  // [begin, filled) of out is written
  for (size_t i = 0; i < numels.size() && offset < end; offset += numels[i], ++i) {
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + numels[i]);
    if (lo >= hi || !grads[i].defined()) continue;
    if (lo > filled) out.narrow(0, filled - begin, lo - filled).zero_();
    out.narrow(0, lo - begin, hi - lo)
        .copy_(grads[i].reshape({-1}).narrow(0, lo - offset, hi - lo));
    filled = hi;
  }
  if (end > filled) out.narrow(0, filled - begin, end - filled).zero_();
}

// On a GPU the collectives run on the communicator's own stream, which does not wait for the
// streams that produced their inputs (the compute stream's backward, the cast just made on this
// thread): wait for the device first. (Correct before fast: an event per input would let later
// kernels run meanwhile.)
Status InputsReady(const at::Tensor& t, comm::Deadline deadline) {
  if (!t.is_cuda()) return Status::Ok();
  return comm::SynchronizeDevice(t.device().index(), deadline);
}

}  // namespace

// The differentiable gather of one unit: its input is the rank's master slice (so that autograd
// calls the backward), its outputs the unit's parameters, views of the gathered buffer; the
// backward hands their gradients to the shards, which reduce-scatter them into the gradient
// slice, and gives the master none (the slice's gradient lives in ParameterShards::gradients()).
// The outputs are separate (not views cut from one flat output by autograd), so their gradients
// reach the backward as they are, never packed into one copy of the unit; a parameter without a
// gradient comes as an undefined tensor, not a tensor of zeros.
class GatherUnitFunction : public torch::autograd::Function<GatherUnitFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& master, int64_t owner,
                                                int64_t unit) {
    ctx->saved_data["owner"] = owner;
    ctx->saved_data["unit"] = unit;
    ctx->set_materialize_grads(false);
    return reinterpret_cast<ParameterShards*>(owner)->Pieces(static_cast<int>(unit));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<ParameterShards*>(ctx->saved_data["owner"].toInt());
    self->OnGradient(static_cast<int>(ctx->saved_data["unit"].toInt()), std::move(grads));
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

ParameterShards::ParameterShards(const model::ModelSpec& spec, CollectiveQueue* queue,
                                 at::ScalarType compute, const at::Device& device, bool trainable)
    : spec_(spec), queue_(queue), compute_(compute), device_(device), trainable_(trainable) {}

ParameterShards::~ParameterShards() {
  // Collectives in flight may still write a buffer or read a master: let them finish.
  (void)queue_->Drain();
}

StatusOr<std::unique_ptr<ParameterShards>> ParameterShards::Create(
    const model::ModelSpec& spec, const model::NamedTensors& weights, CollectiveQueue* queue,
    at::ScalarType compute, const at::Device& device, bool trainable,
    std::vector<model::ParameterUnit> units) {
  GYRE_RETURN_IF_ERROR(CommType(compute).status());
  // Units are allocated and freed at every pass. glibc raises its mmap threshold to the size of
  // a block once one is freed, after which unit-sized blocks come from the heap and a freed
  // unit's memory stays with the process; a fixed threshold keeps blocks of 1 MiB and more
  // mapped and returned on free (measured with gyre bench memory --layouts: the step peak of a
  // split trainer fell by about a fifth).
  if (device.is_cpu()) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  std::unique_ptr<ParameterShards> s(new ParameterShards(spec, queue, compute, device, trainable));
  const int rank = queue->rank(), ranks = queue->ranks();
  if (units.empty()) units = model::ParameterUnits(spec);
  for (model::ParameterUnit& def : units) {
    Unit u;
    u.def = std::move(def);
    for (const auto& shape : u.def.shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      u.numels.push_back(n);
    }
    u.layout = PlanShards({u.def.numel()}, rank, ranks);
    u.full = at::empty({u.layout.chunk * ranks}, at::TensorOptions().dtype(compute).device(device));
    FreeStorage(u.full);
    s->masters_.push_back(
        at::zeros({u.layout.chunk}, at::TensorOptions().dtype(at::kFloat).device(device)));
    s->units_.push_back(std::move(u));
  }
  GYRE_RETURN_IF_ERROR(s->SetWeights(weights));
  for (at::Tensor& m : s->masters_) m.requires_grad_(trainable);
  return s;
}

Status ParameterShards::SetWeights(const model::NamedTensors& weights) {
  size_t expected = 0;
  for (const Unit& u : units_) expected += u.def.names.size();
  if (weights.size() != expected) {
    return InvalidArgument("sharded parameters: expected " + std::to_string(expected) +
                           " tensors, got " + std::to_string(weights.size()));
  }
  size_t k = 0;
  for (const Unit& u : units_) {
    for (size_t i = 0; i < u.def.names.size(); ++i, ++k) {
      const auto& [name, t] = weights[k];
      if (name != u.def.names[i] || !t.defined() || !at::isFloatingType(t.scalar_type()) ||
          t.sizes() != at::IntArrayRef(u.def.shapes[i])) {
        return InvalidArgument("sharded parameters: tensor " + std::to_string(k) + " ('" + name +
                               "') is not " + u.def.names[i] + " of the model's shape");
      }
    }
  }
  // Checked: each unit's slice (SliceOf cannot fail now) into its master.
  at::NoGradGuard no_grad;
  k = 0;
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    std::vector<at::Tensor> whole;
    for (size_t i = 0; i < units_[ui].def.names.size(); ++i, ++k)
      whole.push_back(weights[k].second);
    GYRE_ASSIGN_OR_RETURN(const at::Tensor slice, SliceOf(static_cast<int>(ui), whole));
    masters_[ui].detach().copy_(slice);
  }
  return Status::Ok();
}

StatusOr<at::Tensor> ParameterShards::SliceOf(int u, const std::vector<at::Tensor>& whole) const {
  GYRE_CHECK(u >= 0 && u < num_units()) << "unit " << u;
  const Unit& unit = units_[u];
  if (whole.size() != unit.def.names.size()) {
    return InvalidArgument("sharded parameters: " + unit.def.names.front() + "'s unit has " +
                           std::to_string(unit.def.names.size()) + " tensors, got " +
                           std::to_string(whole.size()));
  }
  at::NoGradGuard no_grad;
  at::Tensor slice =
      at::zeros({unit.layout.chunk}, at::TensorOptions().dtype(at::kFloat).device(device_));
  int64_t offset = 0;  // of the tensor in the unit's flat vector
  for (size_t i = 0; i < whole.size(); ++i) {
    const at::Tensor& t = whole[i];
    if (!t.defined()) {  // zero
      offset += unit.numels[i];
      continue;
    }
    if (!at::isFloatingType(t.scalar_type()) || t.sizes() != at::IntArrayRef(unit.def.shapes[i])) {
      return InvalidArgument("sharded parameters: tensor " + std::to_string(i) + " of " +
                             unit.def.names.front() + "'s unit is not " + unit.def.names[i] +
                             " of the model's shape");
    }
    const int64_t lo = std::max(unit.layout.begin, offset);
    const int64_t hi = std::min(unit.layout.end, offset + unit.numels[i]);
    if (lo < hi) {
      slice.narrow(0, lo - unit.layout.begin, hi - lo)
          .copy_(t.detach().reshape({-1}).narrow(0, lo - offset, hi - lo));
    }
    offset += unit.numels[i];
  }
  return slice;
}

double ParameterShards::WeightedSquaredNorm(
    const at::Tensor& flat, const std::function<double(const std::string&)>& weight) const {
  at::NoGradGuard no_grad;
  double total = 0;
  int64_t base = 0;  // of the unit's slice in `flat`
  for (const Unit& unit : units_) {
    int64_t offset = 0;  // of the tensor in the unit's flat vector
    for (size_t i = 0; i < unit.numels.size(); ++i) {
      const int64_t lo = std::max(unit.layout.begin, offset);
      const int64_t hi = std::min(unit.layout.end, offset + unit.numels[i]);
      if (lo < hi) {
        const at::Tensor part = flat.narrow(0, base + lo - unit.layout.begin, hi - lo);
        total += weight(unit.def.names[i]) * SquaredSum(part);
      }
      offset += unit.numels[i];
    }
    base += unit.layout.chunk;
  }
  return total;
}

std::unique_ptr<ParameterShards> ParameterShards::FrozenCopy() const {
  std::unique_ptr<ParameterShards> s(new ParameterShards(spec_, queue_, compute_, device_, false));
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit u;
    u.def = units_[i].def;
    u.numels = units_[i].numels;
    u.layout = units_[i].layout;
    u.full = at::empty({u.layout.chunk * u.layout.ranks},
                       at::TensorOptions().dtype(compute_).device(device_));
    FreeStorage(u.full);
    s->units_.push_back(std::move(u));
    s->masters_.push_back(masters_[i].detach().clone());
  }
  return s;
}

at::Tensor ParameterShards::FlatView(int u) const {
  // A tensor of its own over the buffer's storage: autograd's views of it share the storage, not
  // the buffer's version counter.
  const at::Tensor& full = units_[u].full;
  return at::empty({0}, full.options()).set_(full.storage(), 0, {full.numel()}, {1});
}

void ParameterShards::StartGather(int u) {
  Unit& unit = units_[u];
  if (unit.ticket >= 0) return;
  ++gathers_;
  const size_t bytes = static_cast<size_t>(unit.full.numel()) * unit.full.element_size();
  AllocateStorage(unit.full, bytes);
  const comm::DataType type = *CommType(compute_);
  const at::Tensor master = masters_[u].detach();
  void* out = unit.full.storage().unsafeGetStorageImpl()->mutable_data();
  const int64_t chunk = unit.layout.chunk;
  const at::TensorOptions opts = unit.full.options();
  unit.ticket = queue_->Post(
      "all-gather of " + unit.def.names.front() + " and the rest of its unit (" +
          std::to_string(unit.layout.total) + " elements)",
      [master, out, chunk, type, opts](comm::Communicator* comm, comm::Deadline deadline) {
        at::NoGradGuard no_grad;
        const at::Tensor mine = master.to(opts.dtype().toScalarType()).contiguous();
        if (comm == nullptr) {
          at::from_blob(out, {chunk}, opts).copy_(mine);
          return InputsReady(mine, deadline);  // the forward reads `out` on another stream
        }
        GYRE_RETURN_IF_ERROR(InputsReady(mine, deadline));
        return comm->AllGather(mine.data_ptr(), out, static_cast<size_t>(chunk), type, deadline);
      });
}

void ParameterShards::FinishGather(int u) {
  StartGather(u);
  const Status s = queue_->Wait(units_[u].ticket);
  if (!s.ok()) ThrowStatus(s.WithContext("sharded parameters"));
}

void ParameterShards::Free(int u) {
  Unit& unit = units_[u];
  if (unit.ticket >= 0) (void)queue_->Wait(unit.ticket);  // never free under a gather
  unit.ticket = -1;
  FreeStorage(unit.full);
}

std::vector<at::Tensor> ParameterShards::Acquire(int u) {
  GYRE_CHECK(u >= 0 && u < num_units()) << "unit " << u;
  FinishGather(u);
  units_[u].acquired = true;
  // Prefetch: the next unit of the forward, unless this pass already had it (with tied
  // embeddings the LM head asks for unit 0 again after the last unit).
  if (u + 1 < num_units() && !units_[u + 1].acquired) StartGather(u + 1);
  if (trainable_ && at::GradMode::is_enabled()) {
    return GatherUnitFunction::apply(masters_[u], reinterpret_cast<int64_t>(this),
                                     static_cast<int64_t>(u));
  }
  return Pieces(u);
}

std::vector<at::Tensor> ParameterShards::Pieces(int u) const {
  const Unit& unit = units_[u];
  const at::Tensor flat = FlatView(u);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (size_t i = 0; i < unit.numels.size(); ++i) {
    out.push_back(flat.narrow(0, offset, unit.numels[i]).view(unit.def.shapes[i]));
    offset += unit.numels[i];
  }
  return out;
}

void ParameterShards::Release(int u, const at::Tensor& output) {
  const bool backward = output.defined() && output.requires_grad() && trainable_;
  // Kept for the backward (reshard_after_forward false): freed once its gradients are out.
  if (backward && !reshard_after_forward_) return;
  Free(u);
  if (!backward) return;
  units_[u].regather = true;
  output.register_hook([this, u](const at::TensorBase&) { BeforeBackward(u); });
}

void ParameterShards::BeforeBackward(int u) {
  FinishGather(u);
  units_[u].regather = false;
  // Prefetch the unit whose backward comes next.
  for (int v = u - 1; v >= 0; --v) {
    if (units_[v].regather) {
      StartGather(v);
      break;
    }
  }
}

void ParameterShards::OnGradient(int u, std::vector<at::Tensor> grads) {
  GYRE_CHECK(grads_.size() == units_.size()) << "a sharded backward outside a step";
  Unit& unit = units_[u];
  GYRE_CHECK(grads.size() == unit.numels.size())
      << grads.size() << " gradients for a unit of " << unit.numels.size() << " parameters";
  // Every view of the buffer this unit's backward reads has been read: its memory can go. (With
  // tied embeddings the LM head's use of unit 0 comes back here; the lookup's does not read it.)
  Free(u);
  at::Tensor slice = grads_[u];
  const int64_t chunk = unit.layout.chunk;
  const std::vector<int64_t> numels = unit.numels;
  const int64_t staging = reduce_staging_elements_;
  while (reduces_.size() >= kReducesInFlight) {
    const Status s = queue_->Wait(reduces_.front());
    reduces_.pop_front();
    if (!s.ok()) ThrowStatus(s.WithContext("sharded parameters"));
  }
  reduces_.push_back(queue_->Post(
      "reduce-scatter of the gradient of " + unit.def.names.front() +
          " and the rest of its unit (" + std::to_string(unit.layout.total) + " elements)",
      [grads = std::move(grads), numels, slice, chunk, staging](comm::Communicator* comm,
                                                                comm::Deadline deadline) {
        at::NoGradGuard no_grad;
        // Summed in float32 whatever the compute dtype.
        const int ranks = comm == nullptr ? 1 : comm->size();
        const int64_t segment = std::max<int64_t>(1, std::min(chunk, staging / ranks));
        at::Tensor in = at::empty({segment * ranks}, slice.options());
        at::Tensor mine = at::empty({segment}, slice.options());
        for (int64_t s = 0; s < chunk; s += segment) {
          const int64_t n = std::min(segment, chunk - s);
          for (int r = 0; r < ranks; ++r) {
            StageGradients(grads, numels, r * chunk + s, in.narrow(0, r * n, n));
          }
          if (comm == nullptr) {
            slice.narrow(0, s, n).add_(in.narrow(0, 0, n));
            continue;
          }
          GYRE_RETURN_IF_ERROR(InputsReady(in, deadline));
          GYRE_RETURN_IF_ERROR(comm->ReduceScatterSum(in.data_ptr(), mine.data_ptr(),
                                                      static_cast<size_t>(n),
                                                      comm::DataType::kFloat32, deadline));
          slice.narrow(0, s, n).add_(mine.narrow(0, 0, n));
        }
        return InputsReady(slice, deadline);  // the optimizer reads it on another stream
      }));
}

Status ParameterShards::EndPass() {
  const Status s = queue_->Drain();
  reduces_.clear();
  for (int u = 0; u < num_units(); ++u) {
    Free(u);
    units_[u].acquired = false;
    units_[u].regather = false;
  }
  return s;
}

void ParameterShards::BeginStep(const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  grads_.clear();
  if (!flat.defined()) {
    for (const at::Tensor& m : masters_) grads_.push_back(at::zeros_like(m.detach()));
    return;
  }
  int64_t total = 0;
  for (const at::Tensor& m : masters_) total += m.numel();
  GYRE_CHECK(flat.scalar_type() == at::kFloat && flat.dim() == 1 && flat.numel() == total &&
             flat.device() == device_)
      << "a gradient buffer of " << flat.numel() << " elements for " << total;
  flat.zero_();
  int64_t offset = 0;
  for (const at::Tensor& m : masters_) {
    grads_.push_back(flat.narrow(0, offset, m.numel()));
    offset += m.numel();
  }
}

void ParameterShards::ReleaseGradients() { grads_.clear(); }

StatusOr<std::vector<at::Tensor>> ParameterShards::GatherUnit(int u) {
  GYRE_CHECK(u >= 0 && u < num_units()) << "unit " << u;
  return GatherUnitSlices(u, masters_[u]);
}

Status ParameterShards::GatherRange(int u, int64_t begin, const at::Tensor& out) {
  GYRE_CHECK(u >= 0 && u < num_units()) << "unit " << u;
  const Unit& unit = units_[u];
  const int64_t count = out.defined() ? out.numel() : 0;
  if (!out.defined() || out.dim() != 1 || !out.is_contiguous() || out.device() != device_ ||
      !at::isFloatingType(out.scalar_type())) {
    return InvalidArgument("a range of " + unit.def.names.front() +
                           "'s unit is gathered into a contiguous 1-D float tensor on the "
                           "shards' device");
  }
  if (begin < 0 || begin > unit.layout.total - count) {
    return InvalidArgument("elements [" + std::to_string(begin) + ", " +
                           std::to_string(begin + count) + ") are not inside " +
                           unit.def.names.front() + "'s unit of " +
                           std::to_string(unit.layout.total) + " elements");
  }
  if (count == 0) return Status::Ok();
  const at::Tensor master = masters_[u];
  const int64_t chunk = unit.layout.chunk;
  const int rank = queue_->rank();
  const int64_t ticket = queue_->Post(
      "gather of elements " + std::to_string(begin) + "+" + std::to_string(count) + " of " +
          unit.def.names.front() + "'s unit",
      [master, out, begin, count, chunk, rank](comm::Communicator* comm,
                                               comm::Deadline deadline) -> Status {
        at::NoGradGuard no_grad;
        // Rank r owns [r * chunk, (r + 1) * chunk): the range meets one rank, or a few when it
        // crosses their boundaries.
        for (int64_t r = begin / chunk; r * chunk < begin + count; ++r) {
          const int64_t lo = std::max(begin, r * chunk);
          const int64_t hi = std::min(begin + count, (r + 1) * chunk);
          at::Tensor part = out.narrow(0, lo - begin, hi - lo);
          if (r == rank || comm == nullptr) {
            part.copy_(master.narrow(0, lo - r * chunk, hi - lo));
            GYRE_RETURN_IF_ERROR(InputsReady(part, deadline));
          }
          if (comm == nullptr) continue;
          GYRE_RETURN_IF_ERROR(comm->Broadcast(part.data_ptr(), static_cast<size_t>(part.nbytes()),
                                               static_cast<int>(r), deadline));
        }
        return Status::Ok();
      });
  return queue_->Wait(ticket);
}

StatusOr<std::vector<at::Tensor>> ParameterShards::GatherUnitSlices(int u,
                                                                    const at::Tensor& slice) {
  GYRE_CHECK(u >= 0 && u < num_units()) << "unit " << u;
  const Unit& unit = units_[u];
  if (slice.scalar_type() != at::kFloat || slice.dim() != 1 || slice.numel() != unit.layout.chunk) {
    return InvalidArgument("a slice of " + unit.def.names.front() + "'s unit must be float32 [" +
                           std::to_string(unit.layout.chunk) + "]");
  }
  at::Tensor all = at::empty({unit.layout.chunk * unit.layout.ranks},
                             at::TensorOptions().dtype(at::kFloat).device(device_));
  const at::Tensor master = slice.detach().to(device_);
  const int64_t chunk = unit.layout.chunk;
  const int64_t ticket = queue_->Post(
      "all-gather of float32 slices of " + unit.def.names.front() + "'s unit",
      [master, all, chunk](comm::Communicator* comm, comm::Deadline deadline) {
        at::NoGradGuard no_grad;
        const at::Tensor mine = master.contiguous();
        if (comm == nullptr) {
          all.copy_(mine);
          return InputsReady(all, deadline);
        }
        GYRE_RETURN_IF_ERROR(InputsReady(mine, deadline));
        return comm->AllGather(mine.data_ptr(), all.data_ptr(), static_cast<size_t>(chunk),
                               comm::DataType::kFloat32, deadline);
      });
  GYRE_RETURN_IF_ERROR(queue_->Wait(ticket));
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (size_t i = 0; i < unit.numels.size(); ++i) {
    // Views of the one gathered buffer, which lives as long as any of them.
    out.push_back(all.narrow(0, offset, unit.numels[i]).view(unit.def.shapes[i]));
    offset += unit.numels[i];
  }
  return out;
}

int64_t ParameterShards::master_bytes() const {
  int64_t n = 0;
  for (const at::Tensor& m : masters_) n += m.nbytes();
  return n;
}

int64_t ParameterShards::gathered_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) {
    if (HasStorage(u.full)) n += static_cast<int64_t>(u.full.storage().nbytes());
  }
  return n;
}

}  // namespace gyre::trainer
