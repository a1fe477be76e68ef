#include "rollout/decode_graphs.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <utility>

#ifdef GYRE_ROLLOUT_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gyre::rollout {
namespace {

int64_t NextPowerOfTwo(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

#ifdef GYRE_ROLLOUT_CUDA_GRAPHS

struct DecodeGraphs::Impl {
  struct Graph {
    at::cuda::CUDAGraph graph;
    model::DecodeBatch in;
    at::Tensor out;
  };
  const model::Transformer* model = nullptr;
  model::PagedKvCache* cache = nullptr;
  int64_t scratch = 0;
  int64_t max_batch = 1;
  int64_t max_blocks = 1;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs;
  // Every capture runs on this one stream: the caching allocator reuses a freed block only on
  // the stream that freed it, so one stream lets the graphs share their pool's memory.
  std::optional<c10::cuda::CUDAStream> stream;
  bool disabled = false;  // a capture failed: every later step runs eagerly
  bool have_pool = false;
  at::cuda::MempoolId_t pool;
  int64_t replays = 0;

  StatusOr<Graph*> Capture(int64_t rows, int64_t width) {
    const at::Device device = cache->k[0].device();
    const int64_t bs = cache->block_size;
    auto g = std::make_unique<Graph>();
    const auto lopts = at::TensorOptions().dtype(at::kLong).device(device);
    g->in.tokens = at::zeros({rows}, lopts);
    g->in.positions = at::zeros({rows}, lopts);
    g->in.slots = at::full({rows}, scratch * bs, lopts);
    g->in.tables = at::full({rows, width}, scratch, lopts);
    g->in.mask = at::zeros({rows, 1, 1, width * bs}, lopts.dtype(at::kBool));
    g->in.mask.narrow(3, 0, 1).fill_(true);
    try {
      c10::cuda::CUDAGuard device_guard(device.index());
      // Capture on a side stream (capture is not allowed on the legacy default stream), after a
      // warm-up there that initialises cuBLAS and the attention kernels. Every row is padding,
      // so neither run touches a real block.
      c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
      if (!stream) stream = c10::cuda::getStreamFromPool(false, device.index());
      c10::cuda::CUDAStream side = *stream;
      current.synchronize();
      {
        c10::cuda::CUDAStreamGuard stream_guard(side);
        model->ForwardDecode(g->in, cache);
        side.synchronize();
        g->graph.capture_begin(have_pool ? pool : at::cuda::MempoolId_t{0, 0},
                               cudaStreamCaptureModeThreadLocal);
        g->out = model->ForwardDecode(g->in, cache);
        g->graph.capture_end();
      }
      side.synchronize();
    } catch (const std::exception& e) {
      // Leave the stream out of capture mode (an exception between capture_begin and
      // capture_end does not), drop the partial graph, and stop using graphs.
      if (stream) {
        cudaGraph_t partial = nullptr;
        if (cudaStreamEndCapture(stream->stream(), &partial) == cudaSuccess && partial) {
          cudaGraphDestroy(partial);
        }
        cudaGetLastError();
      }
      disabled = true;
      const std::string what = e.what();
      return Internal("capturing the decode step (" + std::to_string(rows) + " rows, " +
                      std::to_string(width) +
                      " blocks) as a CUDA graph failed: " + what.substr(0, what.find('\n')));
    }
    if (!have_pool) {
      pool = g->graph.pool();  // later graphs share the first one's memory
      have_pool = true;
    }
    Graph* raw = g.get();
    graphs[{rows, width}] = std::move(g);
    return raw;
  }
};

bool DecodeGraphs::Compiled() { return true; }

StatusOr<std::unique_ptr<DecodeGraphs>> DecodeGraphs::Create(const model::Transformer* model,
                                                             model::PagedKvCache* cache,
                                                             int64_t scratch_block,
                                                             int64_t max_batch,
                                                             int64_t max_blocks) {
  if (cache->k.empty() || !cache->k[0].is_cuda()) {
    return FailedPrecondition("CUDA graphs need the KV cache on a CUDA device");
  }
  if (scratch_block < 0 || scratch_block >= cache->num_blocks || max_batch < 1 || max_blocks < 1) {
    return InvalidArgument("decode graphs: bad scratch block or limits");
  }
  auto impl = std::make_unique<Impl>();
  impl->model = model;
  impl->cache = cache;
  impl->scratch = scratch_block;
  impl->max_batch = NextPowerOfTwo(max_batch);
  impl->max_blocks = NextPowerOfTwo(max_blocks);
  return std::unique_ptr<DecodeGraphs>(new DecodeGraphs(std::move(impl)));
}

bool DecodeGraphs::Fits(int64_t rows, int64_t blocks) const {
  return !impl_->disabled && rows >= 1 && rows <= impl_->max_batch && blocks >= 1 &&
         blocks <= impl_->max_blocks;
}

StatusOr<at::Tensor> DecodeGraphs::Run(const std::vector<int64_t>& tokens,
                                       const std::vector<int64_t>& positions,
                                       const std::vector<int64_t>& slots,
                                       const std::vector<int64_t>& tables, int64_t width,
                                       const std::vector<int64_t>& context_lens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (positions.size() != tokens.size() || slots.size() != tokens.size() ||
      context_lens.size() != tokens.size() || static_cast<int64_t>(tables.size()) != n * width) {
    return InvalidArgument("decode graphs: inputs of different lengths");
  }
  if (!Fits(n, width)) return InvalidArgument("decode graphs: shape outside the captured range");
  const int64_t rows = NextPowerOfTwo(n), w = NextPowerOfTwo(width);
  const int64_t bs = impl_->cache->block_size;
  Impl::Graph* g = nullptr;
  auto it = impl_->graphs.find({rows, w});
  if (it != impl_->graphs.end()) {
    g = it->second.get();
  } else {
    GYRE_ASSIGN_OR_RETURN(g, impl_->Capture(rows, w));
  }
  // Padded host copies, then one copy each into the graph's inputs.
  std::vector<int64_t> tok(rows, 0), pos(rows, 0), slot(rows, impl_->scratch * bs);
  std::vector<int64_t> table(rows * w, impl_->scratch);
  std::vector<uint8_t> mask(rows * w * bs, 0);
  for (int64_t i = 0; i < rows; ++i) {
    if (i >= n) {
      mask[i * w * bs] = 1;
      continue;
    }
    tok[i] = tokens[i];
    pos[i] = positions[i];
    slot[i] = slots[i];
    std::copy(tables.begin() + i * width, tables.begin() + (i + 1) * width, table.begin() + i * w);
    for (int64_t p = 0; p < context_lens[i] && p < w * bs; ++p) mask[i * w * bs + p] = 1;
  }
  auto host = [](void* data, at::IntArrayRef sizes, at::ScalarType type) {
    return at::from_blob(data, sizes, at::TensorOptions().dtype(type));
  };
  g->in.tokens.copy_(host(tok.data(), {rows}, at::kLong));
  g->in.positions.copy_(host(pos.data(), {rows}, at::kLong));
  g->in.slots.copy_(host(slot.data(), {rows}, at::kLong));
  g->in.tables.copy_(host(table.data(), {rows, w}, at::kLong));
  g->in.mask.copy_(host(mask.data(), {rows, 1, 1, w * bs}, at::kBool));
  try {
    g->graph.replay();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return Internal("replaying a decode graph failed: " + what.substr(0, what.find('\n')));
  }
  ++impl_->replays;
  return g->out.narrow(0, 0, n);
}

int64_t DecodeGraphs::captured() const { return static_cast<int64_t>(impl_->graphs.size()); }
int64_t DecodeGraphs::replays() const { return impl_->replays; }

#else  // no CUDA-enabled libtorch

struct DecodeGraphs::Impl {};

bool DecodeGraphs::Compiled() { return false; }

StatusOr<std::unique_ptr<DecodeGraphs>> DecodeGraphs::Create(const model::Transformer*,
                                                             model::PagedKvCache*, int64_t, int64_t,
                                                             int64_t) {
  return FailedPrecondition("CUDA graphs need a build against a CUDA-enabled libtorch");
}

bool DecodeGraphs::Fits(int64_t, int64_t) const { return false; }

StatusOr<at::Tensor> DecodeGraphs::Run(const std::vector<int64_t>&, const std::vector<int64_t>&,
                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                       int64_t, const std::vector<int64_t>&) {
  return FailedPrecondition("CUDA graphs need a build against a CUDA-enabled libtorch");
}

int64_t DecodeGraphs::captured() const { return 0; }
int64_t DecodeGraphs::replays() const { return 0; }

#endif

DecodeGraphs::DecodeGraphs(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DecodeGraphs::~DecodeGraphs() = default;

}  // namespace gyre::rollout
