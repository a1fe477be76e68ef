#include "rollout/rollout_engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "ops/ops.h"
#include "rollout/vocab_parallel_sampling.h"

namespace gyre::rollout {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// One sequence in the engine. A "fork parent" (fork_n > 1) is the prompt of a group whose
// samples share its prefill: when its prefill completes it becomes fork_n samples.
struct RolloutEngine::Seq {
  std::shared_ptr<const Request> req;
  int32_t index = 0;  // sample index within the request (a fork parent: its first sample's)
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // prompt + response: the context
  int64_t prompt_len = 0;
  Response response;
  int64_t max_new = 0;
  int64_t fork_n = 1;
  std::vector<int32_t> fork_max_new;  // fork parent: each sample's response limit
  int64_t computed = 0;               // leading context positions whose K/V are in the cache
  std::vector<int32_t> blocks;        // block table: position p is in blocks[p / block_size]
  uint64_t order = 0;                 // admission order (preemption takes the newest)
  int64_t kv_version = 0;             // version of the oldest K/V in the cache
  Finish finish = Finish::kLength;

  int64_t len() const { return static_cast<int64_t>(tokens.size()); }
  int64_t pending() const { return len() - computed; }
};

// The host-side inputs of one step: the flattened batch, the sampling rows and, under tensor
// parallelism, the copy-on-write block copies the followers apply before the forward.
struct RolloutEngine::StepInputs {
  std::vector<int64_t> toks, pos, slots, qlens, clens, tables, logit_rows;
  int64_t max_blocks = 1;
  std::vector<kernels::SamplingRowParams> params;
  std::vector<int64_t> row_of;  // sampling row -> logits row
  std::vector<int64_t> copies;  // (from, to) block pairs
};

StatusOr<int64_t> BlocksForBudget(const model::Transformer& model, int64_t bytes,
                                  int64_t block_size) {
  if (block_size < 1) return InvalidArgument("KV block size must be >= 1");
  const int64_t per_block = model.KvBytesPerToken() * block_size;
  const int64_t blocks = bytes / per_block;
  if (blocks < 1) {
    return InvalidArgument("a KV cache budget of " + std::to_string(bytes) +
                           " bytes does not hold one block of " + std::to_string(block_size) +
                           " positions (" + std::to_string(per_block) + " bytes for this model)");
  }
  return blocks;
}

namespace {

constexpr char kFollowerError[] =
    "this rank of a tensor-parallel engine follows rank 0 (RolloutEngine::Follow): requests go to "
    "rank 0";

// (Tensor-parallel slices step eagerly: their forwards exchange activations between ranks.)
bool UseDecodeGraphs(const model::Transformer* model, const EngineConfig& config) {
  return model->tensor_parallel() == nullptr && config.cuda_graphs && model->device().is_cuda() &&
         DecodeGraphs::Compiled();
}

}  // namespace

RolloutEngine::RolloutEngine(const model::Transformer* model, const EngineConfig& config)
    : model_(model),
      tp_(model->tensor_parallel()),
      config_(config),
      cache_(model->NewPagedCache(config.num_blocks + (UseDecodeGraphs(model, config) ? 1 : 0),
                                  config.block_size)),
      allocator_(config.num_blocks) {
  if (UseDecodeGraphs(model, config)) {
    const int64_t max_blocks =
        (model->spec().max_seq_len + config.block_size - 1) / config.block_size;
    auto graphs = DecodeGraphs::Create(model, &cache_, config.num_blocks,
                                       std::min(config.cuda_graph_max_batch, config.max_running),
                                       std::max<int64_t>(1, max_blocks));
    if (graphs.ok()) graphs_ = std::move(*graphs);
  }
}

RolloutEngine::~RolloutEngine() = default;

StatusOr<std::unique_ptr<RolloutEngine>> RolloutEngine::Create(const model::Transformer* model,
                                                               const EngineConfig& config) {
  if (model == nullptr) return InvalidArgument("engine needs a model");
  if (config.block_size < 1 || config.block_size > 4096) {
    return InvalidArgument("block_size must be in [1, 4096], got " +
                           std::to_string(config.block_size));
  }
  if (config.num_blocks < 1) {
    return InvalidArgument("num_blocks must be >= 1, got " + std::to_string(config.num_blocks));
  }
  if (config.max_running < 1) {
    return InvalidArgument("max_running must be >= 1, got " + std::to_string(config.max_running));
  }
  if (config.max_step_tokens < 1) {
    return InvalidArgument("max_step_tokens must be >= 1, got " +
                           std::to_string(config.max_step_tokens));
  }
  return std::unique_ptr<RolloutEngine>(new RolloutEngine(model, config));
}

Status RolloutEngine::Validate(const Request& r, size_t i) const {
  const auto& spec = model_->spec();
  const std::string where = "request " + std::to_string(i) + ": ";
  if (r.prompt.empty()) return InvalidArgument(where + "empty prompt");
  auto check_ids = [&](const std::vector<int32_t>& ids, const char* what) -> Status {
    for (int32_t id : ids) {
      if (id < 0 || id >= spec.vocab_size) {
        return InvalidArgument(where + what + " token id " + std::to_string(id) +
                               " outside the vocabulary of " + std::to_string(spec.vocab_size));
      }
    }
    return Status::Ok();
  };
  GYRE_RETURN_IF_ERROR(check_ids(r.prompt, "prompt"));
  if (r.n < 1 || r.n > 65536) {
    return InvalidArgument(where + "n must be in [1, 65536], got " + std::to_string(r.n));
  }
  const auto& sp = r.sampling;
  if (sp.max_new_tokens < 1) return InvalidArgument(where + "max_new_tokens must be >= 1");
  if (!(sp.temperature >= 0) || !std::isfinite(sp.temperature)) {
    return InvalidArgument(where + "temperature must be a finite number >= 0");
  }
  if (!(sp.top_p > 0 && sp.top_p <= 1)) return InvalidArgument(where + "top_p must be in (0, 1]");
  if (!(sp.min_p >= 0 && sp.min_p <= 1)) return InvalidArgument(where + "min_p must be in [0, 1]");
  if (sp.top_k < 0) return InvalidArgument(where + "top_k must be >= 0");
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (prompt + sp.max_new_tokens > spec.max_seq_len) {
    return InvalidArgument(where + "prompt of " + std::to_string(prompt) +
                           " tokens + max_new_tokens " + std::to_string(sp.max_new_tokens) +
                           " exceeds max_seq_len " + std::to_string(spec.max_seq_len));
  }
  const int64_t blocks = CeilDiv(prompt + sp.max_new_tokens, config_.block_size);
  if (blocks > config_.num_blocks) {
    return InvalidArgument(where + "a sample of up to " +
                           std::to_string(prompt + sp.max_new_tokens) + " tokens needs " +
                           std::to_string(blocks) + " KV blocks; the cache holds " +
                           std::to_string(config_.num_blocks) + " (raise the KV cache budget)");
  }
  if (!r.sample_max_new_tokens.empty()) {
    if (static_cast<int64_t>(r.sample_max_new_tokens.size()) != r.n) {
      return InvalidArgument(where + "sample_max_new_tokens has " +
                             std::to_string(r.sample_max_new_tokens.size()) +
                             " entries for n = " + std::to_string(r.n));
    }
    for (int32_t m : r.sample_max_new_tokens) {
      if (m < 1 || m > sp.max_new_tokens) {
        return InvalidArgument(where + "sample_max_new_tokens entries must be in [1, " +
                               std::to_string(sp.max_new_tokens) + "], got " + std::to_string(m));
      }
    }
  }
  const Response& res = r.resume;
  if (!res.tokens.empty() || !res.logprobs.empty() || !res.kept_mass.empty() ||
      !res.versions.empty()) {
    if (r.n != 1) return InvalidArgument(where + "a resumed response needs n == 1");
    const size_t t = res.tokens.size();
    if (res.logprobs.size() != t || res.kept_mass.size() != t || res.versions.size() != t) {
      return InvalidArgument(where + "resumed response has " + std::to_string(t) + " tokens but " +
                             std::to_string(res.logprobs.size()) + " log-probs, " +
                             std::to_string(res.kept_mass.size()) + " kept masses and " +
                             std::to_string(res.versions.size()) + " versions");
    }
    GYRE_RETURN_IF_ERROR(check_ids(res.tokens, "resumed"));
    const int64_t limit =
        r.sample_max_new_tokens.empty() ? sp.max_new_tokens : r.sample_max_new_tokens[0];
    if (static_cast<int64_t>(t) >= limit) {
      return InvalidArgument(where + "resumed response already has " + std::to_string(t) +
                             " tokens, the limit is " + std::to_string(limit));
    }
  }
  if (r.stop_scan_from < 0 || static_cast<size_t>(r.stop_scan_from) > res.tokens.size()) {
    return InvalidArgument(where + "stop_scan_from " + std::to_string(r.stop_scan_from) +
                           " is outside the resumed response's " +
                           std::to_string(res.tokens.size()) + " tokens");
  }
  if (!sp.stop_strings.empty()) {
    if (!decoder_) {
      return InvalidArgument(where + "stop strings need a tokenizer decoder, and none is set");
    }
    for (const auto& s : sp.stop_strings) {
      if (s.empty()) return InvalidArgument(where + "empty stop string");
    }
  }
  return Status::Ok();
}

Status RolloutEngine::Add(const std::vector<Request>& requests) {
  if (!leads()) return FailedPrecondition(kFollowerError);
  for (size_t i = 0; i < requests.size(); ++i) GYRE_RETURN_IF_ERROR(Validate(requests[i], i));
  for (const Request& r : requests) {
    auto req = std::make_shared<Request>(r);
    req->resume = Response{};  // sequences carry their own copy of the response
    const int64_t prompt = static_cast<int64_t>(r.prompt.size());
    auto limit = [&](int32_t i) {
      return r.sample_max_new_tokens.empty() ? r.sampling.max_new_tokens
                                             : r.sample_max_new_tokens[i];
    };
    group_pending_[r.group] += r.n;
    // Share the prompt when the whole group can be admitted at once (slots and blocks).
    const bool share = config_.prefix_sharing && r.n > 1 && r.n <= config_.max_running &&
                       CeilDiv(prompt, config_.block_size) + r.n <= config_.num_blocks;
    const int32_t count = share ? 1 : r.n;
    for (int32_t i = 0; i < count; ++i) {
      auto s = std::make_unique<Seq>();
      s->req = req;
      s->index = i;
      s->seed = r.seed + static_cast<uint64_t>(i);
      s->tokens = r.prompt;
      s->prompt_len = prompt;
      s->max_new = limit(i);
      if (share) {
        s->fork_n = r.n;
        for (int32_t k = 0; k < r.n; ++k) s->fork_max_new.push_back(limit(k));
      } else if (!r.resume.tokens.empty()) {
        s->response = r.resume;
        s->tokens.insert(s->tokens.end(), r.resume.tokens.begin(), r.resume.tokens.end());
      }
      waiting_.push_back(std::move(s));
    }
  }
  return Status::Ok();
}

int64_t RolloutEngine::running_slots() const {
  int64_t n = 0;
  for (const auto& s : running_) n += s->fork_n;
  return n;
}

void RolloutEngine::ResetStats() {
  stats_ = EngineStats{};
  allocator_.ResetPeak();
}

void RolloutEngine::ReleaseBlocks(Seq* s) {
  for (int32_t b : s->blocks) allocator_.Release(b);
  s->blocks.clear();
  s->computed = 0;
}

bool RolloutEngine::EvictParked() {
  if (parked_.empty()) return false;
  for (int32_t b : parked_.front().blocks) allocator_.Release(b);
  parked_.pop_front();
  return true;
}

void RolloutEngine::ClearParked() {
  while (EvictParked()) {
  }
}

void RolloutEngine::CopyBlock(int32_t from, int32_t to) {
  CopyCache(from, to);
  if (tp_ != nullptr) pending_copies_.insert(pending_copies_.end(), {from, to});
}

void RolloutEngine::CopyCache(int32_t from, int32_t to) {
  for (size_t l = 0; l < cache_.k.size(); ++l) {
    cache_.k[l][to].copy_(cache_.k[l][from]);
    cache_.v[l][to].copy_(cache_.v[l][from]);
  }
}

int64_t RolloutEngine::BlocksNeeded(const Seq& s, int64_t first, int64_t count) const {
  int64_t need = 0;
  const int64_t bs = config_.block_size;
  for (int64_t b = first / bs; b <= (first + count - 1) / bs; ++b) {
    if (b >= static_cast<int64_t>(s.blocks.size()) || allocator_.RefCount(s.blocks[b]) > 1) ++need;
  }
  return need;
}

// Makes positions [first, first + count) of `s` writable: appends missing blocks and copies a
// block still shared with other samples (copy-on-write). False when the pool is exhausted.
bool RolloutEngine::EnsureWritable(Seq* s, int64_t first, int64_t count) {
  const int64_t bs = config_.block_size;
  while (allocator_.free_blocks() < BlocksNeeded(*s, first, count)) {
    if (!EvictParked()) return false;
  }
  for (int64_t b = first / bs; b <= (first + count - 1) / bs; ++b) {
    if (b >= static_cast<int64_t>(s->blocks.size())) {
      s->blocks.push_back(*allocator_.Allocate());
    } else if (allocator_.RefCount(s->blocks[b]) > 1) {
      const int32_t fresh = *allocator_.Allocate();
      CopyBlock(s->blocks[b], fresh);
      allocator_.Release(s->blocks[b]);
      s->blocks[b] = fresh;
      ++stats_.cow_copies;
    }
  }
  return true;
}

// Moves the newest running sequence back to the front of the queue, freeing its blocks. Returns
// false (and does nothing) when that sequence is `keep`.
bool RolloutEngine::PreemptOne(const Seq* keep) {
  if (running_.empty() || running_.back().get() == keep) return false;
  std::unique_ptr<Seq> victim = std::move(running_.back());
  running_.pop_back();
  ReleaseBlocks(victim.get());
  waiting_.push_front(std::move(victim));
  ++stats_.preemptions;
  return true;
}

void RolloutEngine::Park(Seq* s) {
  if (s->computed <= 0) {
    ReleaseBlocks(s);
    return;
  }
  Parked p;
  p.seed = s->seed;
  p.tokens = s->tokens;
  p.computed = s->computed;
  p.kv_version = s->kv_version;
  p.blocks = std::move(s->blocks);
  s->blocks.clear();
  s->computed = 0;
  parked_.push_back(std::move(p));
}

bool RolloutEngine::AdoptParked(Seq* s) {
  for (auto it = parked_.begin(); it != parked_.end(); ++it) {
    if (it->seed != s->seed || it->computed > s->len() ||
        !std::equal(it->tokens.begin(), it->tokens.begin() + it->computed, s->tokens.begin())) {
      continue;
    }
    s->blocks = std::move(it->blocks);
    // At least the last context token is recomputed, to produce the next logits.
    s->computed = std::min(it->computed, s->len() - 1);
    s->kv_version = it->kv_version;
    stats_.parked_reused_tokens += s->computed;
    parked_.erase(it);
    // Blocks past the part still needed go back to the pool.
    const int64_t keep = CeilDiv(s->len(), config_.block_size);
    while (static_cast<int64_t>(s->blocks.size()) > keep) {
      allocator_.Release(s->blocks.back());
      s->blocks.pop_back();
    }
    return true;
  }
  return false;
}

// Admits `s` if its whole context fits in the pool now, with one spare block per sample when
// other sequences are running (so the step after admission rarely has to preempt).
bool RolloutEngine::TryAdmit(Seq* s) {
  if (s->computed == 0 && s->blocks.empty() && !parked_.empty()) AdoptParked(s);
  const int64_t need =
      CeilDiv(s->len(), config_.block_size) - static_cast<int64_t>(s->blocks.size());
  const int64_t reserve = running_.empty() ? 0 : s->fork_n;
  while (allocator_.free_blocks() < need + reserve) {
    if (!EvictParked()) {
      // Not admitted: give adopted blocks back so a waiting sequence never holds cache.
      if (!s->blocks.empty()) {
        stats_.parked_reused_tokens -= s->computed;
        ReleaseBlocks(s);
      }
      return false;
    }
  }
  for (int64_t i = 0; i < need; ++i) s->blocks.push_back(*allocator_.Allocate());
  if (s->computed == 0) s->kv_version = version_;
  s->order = next_order_++;
  return true;
}

bool RolloutEngine::CheckStop(Seq* s) {
  const int32_t tok = s->response.tokens.back();
  const auto& sp = s->req->sampling;
  if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) !=
      sp.stop_token_ids.end()) {
    s->finish = Finish::kStop;
    return true;
  }
  if (!sp.stop_strings.empty()) {
    // A stop string first appears when its last token arrives; decoding a window of the last
    // (longest stop string + 8) tokens covers it (every non-special token is >= 1 byte).
    size_t longest = 0;
    for (const auto& str : sp.stop_strings) longest = std::max(longest, str.size());
    const size_t n = s->response.tokens.size();
    // Tokens before stop_scan_from were inserted (an environment's observation): never scanned.
    const size_t from = std::min(n, static_cast<size_t>(std::max(0, s->req->stop_scan_from)));
    const size_t w = std::min(n - from, longest + 8);
    const std::string text =
        decoder_(std::vector<int32_t>(s->response.tokens.end() - w, s->response.tokens.end()));
    for (const auto& str : sp.stop_strings) {
      if (text.find(str) != std::string::npos) {
        s->finish = Finish::kStop;
        return true;
      }
    }
  }
  if (static_cast<int64_t>(s->response.tokens.size()) >= s->max_new ||
      s->len() >= model_->spec().max_seq_len) {
    s->finish = Finish::kLength;
    return true;
  }
  return false;
}

SampleResult RolloutEngine::MakeResult(Seq* s, bool finished) {
  SampleResult r;
  r.id = s->req->id;
  r.group = s->req->group;
  r.index = s->index;
  r.seed = s->seed;
  r.response = std::move(s->response);
  r.finished = finished;
  r.finish = finished ? s->finish : Finish::kAbort;
  r.kv_version = s->computed > 0 ? s->kv_version : version_;
  return r;
}

void RolloutEngine::AppendForkResults(const Seq& parent, std::vector<SampleResult>* out) {
  for (int64_t k = 0; k < parent.fork_n; ++k) {
    Seq sample;
    sample.req = parent.req;
    sample.index = parent.index + static_cast<int32_t>(k);
    sample.seed = parent.seed + static_cast<uint64_t>(k);
    out->push_back(MakeResult(&sample, false));
  }
}

void RolloutEngine::CountGroupDone(const Seq& s) {
  auto it = group_pending_.find(s.req->group);
  GYRE_CHECK(it != group_pending_.end() && it->second > 0) << "group count out of step";
  if (--it->second == 0) {
    group_pending_.erase(it);
    ++groups_finished_;
  }
}

// One engine step, in stages: schedule the step's work (ScheduleStep), one forward over it
// (ForwardStep), one token per sample (SampleStep), then append, fork and retire (AdvanceStep).
StatusOr<std::vector<SampleResult>> RolloutEngine::Step() {
  if (idle()) return std::vector<SampleResult>{};
  if (!leads()) return FailedPrecondition(kFollowerError);
  c10::InferenceMode guard;
  const std::vector<StepWork> work = ScheduleStep();
  if (work.empty()) {
    return Internal("rollout engine made no progress: " + std::to_string(waiting_.size()) +
                    " waiting, " + std::to_string(running_.size()) + " running, " +
                    std::to_string(allocator_.free_blocks()) + " free blocks");
  }
  std::vector<Seq*> sampled;
  const StepInputs in = BuildStep(work, &sampled);
  StatusOr<ops::SampleOutput> drawn = ops::SampleOutput{};
  try {
    if (tp_ != nullptr) SendStep(in);
    const at::Tensor logits = ForwardStep(in);
    drawn = SampleStep(logits, in);
  } catch (const std::exception& e) {  // a tensor-parallel collective failed
    return Unavailable(std::string("tensor-parallel step failed: ") + e.what());
  }
  GYRE_RETURN_IF_ERROR(drawn.status());
  for (const StepWork& w : work) w.seq->computed = w.first + w.count;
  std::vector<SampleResult> done = AdvanceStep(sampled, *drawn);
  ++stats_.steps;
  stats_.block_steps += static_cast<double>(allocator_.used_blocks());
  return done;
}

std::vector<RolloutEngine::StepWork> RolloutEngine::ScheduleStep() {
  std::vector<StepWork> work;
  int64_t budget = config_.max_step_tokens;

  // 1. Decodes: every running sequence with one pending token, oldest first. A sequence that
  // cannot get a block preempts the newest one (possibly itself).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Seq* s = running_[i].get();
    if (s->pending() != 1) continue;
    bool ok = true;
    while (!EnsureWritable(s, s->computed, 1)) {
      if (!PreemptOne(s)) {
        ok = false;
        break;
      }
    }
    if (!ok) {  // s is the newest: it waits (its blocks free) rather than anyone else
      PreemptOne(nullptr);
      break;
    }
    work.push_back({s, s->computed, 1});
    --budget;
  }
  // 2. Prefill chunks of admitted sequences, oldest first, within the step's token budget.
  for (auto& sp : running_) {
    if (budget <= 0) break;
    Seq* s = sp.get();
    if (s->pending() <= 1) continue;
    const int64_t take = std::min(s->pending(), budget);
    // Blocks of a resumed context may still be shared with its group's other samples.
    if (!EnsureWritable(s, s->computed, take)) continue;
    work.push_back({s, s->computed, take});
    budget -= take;
  }
  // 3. Admissions, in FIFO order: continuous batching admits whenever there is room; static
  // batching only into an empty batch.
  const bool may_admit = config_.scheduling == Scheduling::kContinuous || running_.empty();
  if (may_admit) {
    int64_t slots = running_slots();
    const bool static_fill = config_.scheduling == Scheduling::kStatic;
    while (!waiting_.empty() && (budget > 0 || static_fill)) {
      Seq* s = waiting_.front().get();
      if (slots + s->fork_n > config_.max_running) break;
      if (!TryAdmit(s)) break;
      slots += s->fork_n;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      if (budget > 0) {
        const int64_t take = std::min(s->pending(), budget);
        if (!EnsureWritable(s, s->computed, take)) break;
        work.push_back({s, s->computed, take});
        budget -= take;
      }
    }
  }
  return work;
}

RolloutEngine::StepInputs RolloutEngine::BuildStep(const std::vector<StepWork>& work,
                                                   std::vector<Seq*>* sampled) {
  // 4. The flattened batch.
  StepInputs in;
  const int64_t bs = config_.block_size;
  for (const StepWork& w : work) {
    in.max_blocks = std::max(in.max_blocks, static_cast<int64_t>(w.seq->blocks.size()));
  }
  in.tables.assign(work.size() * static_cast<size_t>(in.max_blocks), 0);
  for (size_t i = 0; i < work.size(); ++i) {
    const StepWork& w = work[i];
    Seq* s = w.seq;
    std::copy(s->blocks.begin(), s->blocks.end(), in.tables.begin() + i * in.max_blocks);
    for (int64_t p = w.first; p < w.first + w.count; ++p) {
      in.toks.push_back(s->tokens[p]);
      in.pos.push_back(p);
      in.slots.push_back(int64_t{s->blocks[p / bs]} * bs + p % bs);
    }
    in.qlens.push_back(w.count);
    in.clens.push_back(w.first + w.count);
    if (w.first + w.count == s->len()) {  // its last context token is in this step: sampled
      in.logit_rows.push_back(static_cast<int64_t>(in.toks.size()) - 1);
      sampled->push_back(s);
    }
    if (w.count == 1 && s->pending() == 1) {
      stats_.decode_tokens += 1;
    } else {
      stats_.prefill_tokens += w.count;
    }
  }
  // 5. Sampling: one row per sample (a fork parent's row serves each of its samples).
  for (size_t r = 0; r < sampled->size(); ++r) {
    Seq* s = (*sampled)[r];
    const auto& sp = s->req->sampling;
    for (int64_t k = 0; k < s->fork_n; ++k) {
      in.params.push_back({sp.temperature, sp.top_k, sp.top_p, sp.min_p,
                           s->seed + static_cast<uint64_t>(k),
                           static_cast<uint64_t>(s->response.tokens.size())});
      in.row_of.push_back(static_cast<int64_t>(r));
    }
  }
  in.copies = std::move(pending_copies_);
  pending_copies_.clear();
  return in;
}

at::Tensor RolloutEngine::ForwardStep(const StepInputs& in) {
  const auto device = cache_.k[0].device();
  auto lopts = at::TensorOptions().dtype(at::kLong);
  const auto t_fwd = Clock::now();
  at::Tensor logits;
  const int64_t seqs = static_cast<int64_t>(in.qlens.size());
  // Decode-only steps (each row one new token, sampled) replay a CUDA graph when one fits.
  const bool decode_only = static_cast<int64_t>(in.logit_rows.size()) == seqs &&
                           static_cast<int64_t>(in.toks.size()) == seqs;
  if (graphs_ && decode_only && graphs_->Fits(seqs, in.max_blocks)) {
    auto replayed = graphs_->Run(in.toks, in.pos, in.slots, in.tables, in.max_blocks, in.clens);
    if (replayed.ok()) {
      logits = *replayed;
      ++stats_.graph_steps;
    } else {
      graph_error_ = replayed.status().ToString();  // graphs are off from now on
    }
  }
  if (!logits.defined()) {
    model::PagedBatch batch;
    batch.tokens = at::tensor(in.toks, lopts).to(device);
    batch.positions = at::tensor(in.pos, lopts).to(device);
    batch.slots = at::tensor(in.slots, lopts).to(device);
    batch.query_lens = in.qlens;
    batch.context_lens = in.clens;
    batch.block_tables = at::tensor(in.tables, lopts).view({seqs, in.max_blocks}).to(device);
    batch.logit_rows = in.logit_rows;
    logits = model_->ForwardPaged(batch, &cache_);
  }
  stats_.forward_seconds += Since(t_fwd);
  return logits;
}

StatusOr<ops::SampleOutput> RolloutEngine::SampleStep(const at::Tensor& logits,
                                                      const StepInputs& in) {
  const auto t_sample = Clock::now();
  bool repeated = in.row_of.size() != static_cast<size_t>(logits.size(0));
  for (size_t r = 0; r < in.row_of.size() && !repeated; ++r) {
    repeated = in.row_of[r] != static_cast<int64_t>(r);
  }
  const at::Tensor rows =
      repeated
          ? logits.index_select(
                0, at::tensor(in.row_of, at::TensorOptions().dtype(at::kLong)).to(logits.device()))
          : logits;
  StatusOr<ops::SampleOutput> drawn = ops::SampleOutput{};
  if (tp_ != nullptr) {
    drawn = VocabParallelSampleRows(rows, model_->vocabulary_range().first,
                                    model_->spec().vocab_size, in.params, tp_);
  } else {
    drawn = ops::SampleRows(rows, in.params);
  }
  stats_.sample_seconds += Since(t_sample);
  return drawn;
}

// Tensor parallelism: what rank 0 tells the others, one message a step (and one per weight
// update, and one to stop). A fixed header, then for a step one int64 payload.
namespace {

enum MessageKind : int64_t { kStopFollowing = 0, kStepMessage = 1, kSwapMessage = 2 };
constexpr int64_t kHeaderSize = 8;  // kind, tokens, sequences, max_blocks, logit rows,
                                    // sampling rows, copies, version

int64_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float BitsFloat(int64_t v) {
  const uint32_t u = static_cast<uint32_t>(v);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

at::Tensor Header(int64_t kind, const std::vector<int64_t>& sizes, int64_t version) {
  at::Tensor h = at::zeros({kHeaderSize}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = h.data_ptr<int64_t>();
  p[0] = kind;
  for (size_t i = 0; i < sizes.size(); ++i) p[1 + i] = sizes[i];
  p[kHeaderSize - 1] = version;
  return h;
}

}  // namespace

void RolloutEngine::SendStep(const StepInputs& in) {
  const int64_t rows = static_cast<int64_t>(in.params.size());
  at::Tensor header =
      Header(kStepMessage,
             {static_cast<int64_t>(in.toks.size()), static_cast<int64_t>(in.qlens.size()),
              in.max_blocks, static_cast<int64_t>(in.logit_rows.size()), rows,
              static_cast<int64_t>(in.copies.size() / 2)},
             version_);
  tp_->Broadcast(header, 0);
  std::vector<int64_t> flat;
  for (const auto* v : {&in.toks, &in.pos, &in.slots, &in.qlens, &in.clens, &in.tables,
                        &in.logit_rows, &in.row_of}) {
    flat.insert(flat.end(), v->begin(), v->end());
  }
  for (const auto& p : in.params) {
    flat.insert(flat.end(),
                {int64_t{p.top_k}, static_cast<int64_t>(p.seed), static_cast<int64_t>(p.position),
                 FloatBits(p.temperature), FloatBits(p.top_p), FloatBits(p.min_p)});
  }
  flat.insert(flat.end(), in.copies.begin(), in.copies.end());
  at::Tensor payload = at::tensor(flat, at::TensorOptions().dtype(at::kLong));
  tp_->Broadcast(payload, 0);
}

RolloutEngine::StepInputs RolloutEngine::ReceiveStep(const at::Tensor& header) {
  const int64_t* h = header.data_ptr<int64_t>();
  const int64_t toks = h[1], seqs = h[2], max_blocks = h[3], logit_rows = h[4], rows = h[5],
                copies = h[6];
  const int64_t size =
      3 * toks + 2 * seqs + seqs * max_blocks + logit_rows + rows + 6 * rows + 2 * copies;
  at::Tensor payload = at::empty({size}, at::TensorOptions().dtype(at::kLong));
  tp_->Broadcast(payload, 0);
  const int64_t* p = payload.data_ptr<int64_t>();
  auto take = [&p](int64_t n) {
    std::vector<int64_t> v(p, p + n);
    p += n;
    return v;
  };
  StepInputs in;
  in.toks = take(toks);
  in.pos = take(toks);
  in.slots = take(toks);
  in.qlens = take(seqs);
  in.clens = take(seqs);
  in.tables = take(seqs * max_blocks);
  in.max_blocks = max_blocks;
  in.logit_rows = take(logit_rows);
  in.row_of = take(rows);
  for (int64_t r = 0; r < rows; ++r, p += 6) {
    in.params.push_back({BitsFloat(p[3]), static_cast<int32_t>(p[0]), BitsFloat(p[4]),
                         BitsFloat(p[5]), static_cast<uint64_t>(p[1]),
                         static_cast<uint64_t>(p[2])});
  }
  in.copies = take(2 * copies);
  return in;
}

// Every rank's swap outcome: an error naming the ranks whose swap failed (every rank returns it).
Status RolloutEngine::AgreeOnSwap(const Status& own) {
  const std::string ranks = model::TensorParallelRanksNotOk(tp_, own.ok());
  if (ranks.empty()) return Status::Ok();
  if (!own.ok()) return own;
  return Unavailable("the weight update failed on tensor-parallel rank(s) " + ranks);
}

Status RolloutEngine::Follow(const std::function<Status(int64_t version)>& swap,
                             double idle_timeout_s) {
  if (tp_ == nullptr || tp_->rank() == 0) {
    return FailedPrecondition("Follow is for the ranks other than 0 of a tensor-parallel engine");
  }
  c10::InferenceMode guard;
  for (;;) {
    try {
      at::Tensor header = at::zeros({kHeaderSize}, at::TensorOptions().dtype(at::kLong));
      tp_->Broadcast(header, 0, idle_timeout_s);
      const int64_t kind = header.data_ptr<int64_t>()[0];
      const int64_t version = header.data_ptr<int64_t>()[kHeaderSize - 1];
      if (kind == kStopFollowing) return Status::Ok();
      if (kind == kSwapMessage) {
        // A failed swap (here or on another rank) fails the leader's UpdateWeights; this rank
        // goes on following, for the leader to send the update again.
        const Status own = swap ? swap(version) : Status::Ok();
        if (AgreeOnSwap(own).ok()) version_ = version;
        continue;
      }
      if (kind != kStepMessage) {
        return Internal("tensor-parallel rank " + std::to_string(tp_->rank()) +
                        " received an unknown message kind " + std::to_string(kind));
      }
      const StepInputs in = ReceiveStep(header);
      for (size_t c = 0; c + 1 < in.copies.size(); c += 2) {
        CopyCache(static_cast<int32_t>(in.copies[c]), static_cast<int32_t>(in.copies[c + 1]));
      }
      const at::Tensor logits = ForwardStep(in);
      GYRE_RETURN_IF_ERROR(SampleStep(logits, in).status());
      ++stats_.steps;
    } catch (const std::exception& e) {
      return Unavailable(std::string("tensor-parallel rank ") + std::to_string(tp_->rank()) +
                         " stopped following: " + e.what());
    }
  }
}

Status RolloutEngine::StopFollowers() {
  if (tp_ == nullptr || tp_->rank() != 0) return Status::Ok();
  try {
    at::Tensor header = Header(kStopFollowing, {}, version_);
    tp_->Broadcast(header, 0);
  } catch (const std::exception& e) {
    return Unavailable(std::string("stopping the tensor-parallel ranks: ") + e.what());
  }
  return Status::Ok();
}

std::vector<SampleResult> RolloutEngine::AdvanceStep(const std::vector<Seq*>& sampled,
                                                     const ops::SampleOutput& drawn) {
  // 6. Append tokens, fork groups, retire finished samples.
  std::vector<Seq*> finished_seqs;
  std::vector<std::unique_ptr<Seq>> children;
  size_t row = 0;
  for (Seq* s : sampled) {
    if (s->fork_n == 1) {
      s->tokens.push_back(drawn.tokens[row]);
      s->response.tokens.push_back(drawn.tokens[row]);
      s->response.logprobs.push_back(drawn.logprobs[row]);
      s->response.kept_mass.push_back(drawn.kept_mass[row]);
      s->response.versions.push_back(version_);
      ++row;
      ++stats_.generated_tokens;
      if (on_token_) on_token_(s->req->id, s->index, s->response.tokens.back());
      if (CheckStop(s)) finished_seqs.push_back(s);
      continue;
    }
    // Fork: sample k takes the parent's block table (one more reference per block).
    for (int64_t k = 0; k < s->fork_n; ++k, ++row) {
      auto c = std::make_unique<Seq>();
      c->req = s->req;
      c->index = s->index + static_cast<int32_t>(k);
      c->seed = s->seed + static_cast<uint64_t>(k);
      c->tokens = s->tokens;
      c->tokens.push_back(drawn.tokens[row]);
      c->prompt_len = s->prompt_len;
      c->response.tokens = {drawn.tokens[row]};
      c->response.logprobs = {drawn.logprobs[row]};
      c->response.kept_mass = {drawn.kept_mass[row]};
      c->response.versions = {version_};
      c->max_new = s->fork_max_new[k];
      c->computed = s->computed;
      c->blocks = s->blocks;
      if (k > 0) {
        for (int32_t b : c->blocks) allocator_.Retain(b);
      }
      c->order = s->order;
      c->kv_version = s->kv_version;
      ++stats_.generated_tokens;
      if (on_token_) on_token_(c->req->id, c->index, c->response.tokens.back());
      if (CheckStop(c.get())) finished_seqs.push_back(c.get());
      children.push_back(std::move(c));
    }
    stats_.prefix_shared_tokens += (s->fork_n - 1) * s->prompt_len;
    s->blocks.clear();  // the samples own the references now
    s->fork_n = 0;      // marks the parent for removal below
  }
  if (!children.empty()) ReplaceForkParents(&children);
  return RetireFinished(finished_seqs);
}

void RolloutEngine::ReplaceForkParents(std::vector<std::unique_ptr<Seq>>* children) {
  // Each fork parent (fork_n == 0) is replaced by its samples, in place (they inherit its
  // admission order).
  std::vector<std::unique_ptr<Seq>> next;
  size_t c = 0;
  for (auto& s : running_) {
    if (s->fork_n != 0) {
      next.push_back(std::move(s));
      continue;
    }
    const size_t n = s->fork_max_new.size();
    for (size_t k = 0; k < n; ++k) next.push_back(std::move((*children)[c++]));
  }
  running_ = std::move(next);
}

std::vector<SampleResult> RolloutEngine::RetireFinished(const std::vector<Seq*>& finished) {
  std::vector<SampleResult> done;
  if (finished.empty()) return done;
  std::vector<std::unique_ptr<Seq>> next;
  for (auto& s : running_) {
    if (std::find(finished.begin(), finished.end(), s.get()) == finished.end()) {
      next.push_back(std::move(s));
      continue;
    }
    CountGroupDone(*s);
    done.push_back(MakeResult(s.get(), true));
    if (s->req->park_on_finish) {
      Park(s.get());  // a continuation (the next turn) adopts it
    } else {
      ReleaseBlocks(s.get());
    }
    ++stats_.finished_samples;
  }
  running_ = std::move(next);
  return done;
}

StatusOr<std::vector<SampleResult>> RolloutEngine::Run(int64_t target_groups) {
  std::vector<SampleResult> out;
  const int64_t start = groups_finished_;
  while (!idle() && (target_groups <= 0 || groups_finished_ - start < target_groups)) {
    auto part = Step();
    if (!part.ok()) {
      DropAll();
      return part.status();
    }
    for (auto& r : *part) out.push_back(std::move(r));
  }
  if (idle()) return out;
  // Target reached: everything left goes back to the caller, unfinished.
  auto retire = [&](std::unique_ptr<Seq>& s) {
    const int64_t samples = std::max<int64_t>(1, s->fork_n);
    for (int64_t k = 0; k < samples; ++k) {
      auto it = group_pending_.find(s->req->group);
      if (it != group_pending_.end() && --it->second == 0) group_pending_.erase(it);
    }
    if (s->fork_n > 1) {  // a group still prefilling: its samples have no tokens yet
      ReleaseBlocks(s.get());
      AppendForkResults(*s, &out);
      return;
    }
    Park(s.get());
    out.push_back(MakeResult(s.get(), false));
  };
  for (auto& s : running_) retire(s);
  for (auto& s : waiting_) retire(s);
  running_.clear();
  waiting_.clear();
  return out;
}

void RolloutEngine::DropAll() {
  for (auto& s : running_) ReleaseBlocks(s.get());
  running_.clear();
  waiting_.clear();
  group_pending_.clear();
}

int64_t RolloutEngine::Drop(const std::function<bool(uint64_t id)>& drop) {
  int64_t freed = 0;
  auto forget = [&](const Seq& s) {
    const int64_t samples = std::max<int64_t>(1, s.fork_n);
    freed += samples;
    auto it = group_pending_.find(s.req->group);
    if (it != group_pending_.end() && (it->second -= samples) <= 0) group_pending_.erase(it);
  };
  auto sweep = [&](auto& seqs) {
    for (auto it = seqs.begin(); it != seqs.end();) {
      if (!drop((*it)->req->id)) {
        ++it;
        continue;
      }
      forget(**it);
      ReleaseBlocks(it->get());
      it = seqs.erase(it);
    }
  };
  sweep(running_);
  sweep(waiting_);
  return freed;
}

std::vector<SampleResult> RolloutEngine::Preempt(
    const std::function<bool(uint64_t id, int32_t index)>& take) {
  std::vector<SampleResult> out;
  auto picked = [&](const Seq& s) {
    const int64_t samples = std::max<int64_t>(1, s.fork_n);
    for (int64_t k = 0; k < samples; ++k) {
      if (!take(s.req->id, s.index + static_cast<int32_t>(k))) return false;
    }
    return true;
  };
  auto sweep = [&](auto& seqs) {
    for (auto it = seqs.begin(); it != seqs.end();) {
      Seq* s = it->get();
      if (!picked(*s)) {
        ++it;
        continue;
      }
      const int64_t samples = std::max<int64_t>(1, s->fork_n);
      auto pending = group_pending_.find(s->req->group);
      if (pending != group_pending_.end() && (pending->second -= samples) <= 0) {
        group_pending_.erase(pending);
      }
      if (s->fork_n > 1) {  // a group still prefilling: its samples have no tokens yet
        AppendForkResults(*s, &out);
      } else {
        out.push_back(MakeResult(s, false));  // before the blocks go: it reads kv_version
      }
      ReleaseBlocks(s);
      it = seqs.erase(it);
    }
  };
  sweep(running_);
  sweep(waiting_);
  std::sort(out.begin(), out.end(), [](const SampleResult& a, const SampleResult& b) {
    return a.id != b.id ? a.id < b.id : a.index < b.index;
  });
  return out;
}

StatusOr<std::vector<SampleResult>> RolloutEngine::Generate(const std::vector<Request>& requests) {
  if (!idle()) return FailedPrecondition("Generate needs an idle engine; use Add and Run");
  std::vector<Request> tagged = requests;
  for (size_t i = 0; i < tagged.size(); ++i) tagged[i].id = i;
  GYRE_RETURN_IF_ERROR(Add(tagged));
  GYRE_ASSIGN_OR_RETURN(auto results, Run(0));
  std::sort(results.begin(), results.end(), [](const SampleResult& a, const SampleResult& b) {
    return a.id != b.id ? a.id < b.id : a.index < b.index;
  });
  for (auto& r : results) r.id = requests[r.id].id;
  return results;
}

Status RolloutEngine::UpdateWeights(int64_t version, const std::function<Status()>& swap) {
  if (!leads()) return FailedPrecondition(kFollowerError);
  if (tp_ != nullptr) {
    // Every rank swaps its slice (its Follow's swap), and all agree on the outcome.
    try {
      at::Tensor header = Header(kSwapMessage, {}, version);
      tp_->Broadcast(header, 0);
      GYRE_RETURN_IF_ERROR(AgreeOnSwap(swap ? swap() : Status::Ok()));
    } catch (const std::exception& e) {
      return Unavailable(std::string("tensor-parallel weight update failed: ") + e.what());
    }
  } else if (swap) {
    GYRE_RETURN_IF_ERROR(swap());
  }
  version_ = version;
  if (config_.weight_update_kv == WeightUpdateKv::kKeep) return Status::Ok();
  ClearParked();
  // Every running sequence goes back to the front of the queue (oldest first) and is
  // recomputed with the new weights when readmitted.
  while (!running_.empty()) {
    std::unique_ptr<Seq> s = std::move(running_.back());
    running_.pop_back();
    ReleaseBlocks(s.get());
    waiting_.push_front(std::move(s));
  }
  return Status::Ok();
}

}  // namespace gyre::rollout
