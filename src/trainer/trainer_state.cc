#include "trainer/trainer_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/hf_config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "text/tokenizer.h"
#include "text/tokenizer_json.h"

namespace gyre::trainer {

namespace {

constexpr char kFormat[] = "gyre.trainer_state";
// 1: optimizer.safetensors holds every parameter's moments. 2: the moments are sharded, one file
// per rank of the group that wrote them (trainer.shard).
constexpr int kFormatVersion = 1;
constexpr int kShardedFormatVersion = 2;
constexpr char kStateFile[] = "trainer_state.json";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kReferenceFile[] = "reference.safetensors";

std::string ToHex(const uint8_t* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

bool FromHex(const std::string& hex, std::vector<uint8_t>* out) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out->resize(hex.size() / 2);
  for (size_t i = 0; i < out->size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

// The default CPU generator's state, as bytes (at::Generator::get_state's byte tensor).
std::vector<uint8_t> CpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor state = gen.get_state();
  const uint8_t* p = state.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + state.numel());
}

void SetCpuRngState(const std::vector<uint8_t>& bytes) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), t.data_ptr<uint8_t>());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Tensor `name` of `file`, which must be float32 of `shape`, as a view of the mapped file
// (valid while `file` lives).
StatusOr<at::Tensor> ViewTensor(const model::SafetensorsFile& file, const std::string& name,
                                const std::vector<int64_t>& shape) {
  auto it = file.entries().find(name);
  if (it == file.entries().end()) {
    return InvalidArgument(file.path() + ": missing tensor '" + name + "'");
  }
  if (it->second.dtype != "F32") {
    return InvalidArgument(file.path() + ": tensor '" + name + "' has dtype " + it->second.dtype +
                           ", expected F32");
  }
  if (it->second.shape != shape) {
    return InvalidArgument(file.path() + ": tensor '" + name + "' has shape " +
                           ShapeText(it->second.shape) + ", the model expects " + ShapeText(shape));
  }
  return file.View(name);
}

// A float32 copy of tensor `name` of `file`, which must have `shape`.
StatusOr<at::Tensor> ReadTensor(const model::SafetensorsFile& file, const std::string& name,
                                const std::vector<int64_t>& shape) {
  GYRE_ASSIGN_OR_RETURN(at::Tensor view, ViewTensor(file, name, shape));
  return view.clone();
}

// "optimizer-rank-00001-of-00004.safetensors": rank r's slice of the flat moment vectors.
std::string ShardFileName(int rank, int ranks) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "optimizer-rank-%05d-of-%05d.safetensors", rank, ranks);
  return buf;
}

// The moments of the flat parameter elements [begin, end) (sharded_adamw.h's flat order), from
// either format: `shards` > 0 ranks' slice files of a sharded state, or (shards == 0) the
// per-parameter optimizer.safetensors. A parameter whose step is 0 has zero moments.
StatusOr<std::pair<at::Tensor, at::Tensor>> ReadMomentRange(const std::string& dir,
                                                            const model::NamedTensors& params,
                                                            const std::vector<int64_t>& steps,
                                                            int shards, int64_t begin,
                                                            int64_t end) {
  at::Tensor m = at::zeros({end - begin}, at::kFloat);
  at::Tensor v = at::zeros({end - begin}, at::kFloat);
  int64_t total = 0;
  for (const auto& [name, p] : params) total += p.numel();
  if (shards > 0) {
    const int64_t chunk = (total + shards - 1) / shards;
    for (int r = 0; r < shards; ++r) {
      const int64_t lo = std::min(total, chunk * r), hi = std::min(total, chunk * (r + 1));
      const int64_t a = std::max(lo, begin), b = std::min(hi, end);
      if (a >= b) continue;
      const std::string path = dir + "/" + ShardFileName(r, shards);
      GYRE_ASSIGN_OR_RETURN(auto file, model::SafetensorsFile::Open(path));
      if (file->entries().size() != 2) {
        return InvalidArgument(path + ": has " + std::to_string(file->entries().size()) +
                               " tensors, expected exp_avg and exp_avg_sq");
      }
      GYRE_ASSIGN_OR_RETURN(at::Tensor fm, ReadTensor(*file, "exp_avg", {hi - lo}));
      GYRE_ASSIGN_OR_RETURN(at::Tensor fv, ReadTensor(*file, "exp_avg_sq", {hi - lo}));
      m.narrow(0, a - begin, b - a).copy_(fm.narrow(0, a - lo, b - a));
      v.narrow(0, a - begin, b - a).copy_(fv.narrow(0, a - lo, b - a));
    }
    return std::make_pair(m, v);
  }
  const std::string path = dir + "/" + kOptimizerFile;
  GYRE_ASSIGN_OR_RETURN(auto file, model::SafetensorsFile::Open(path));
  size_t expected = 0;
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const int64_t lo = offset, hi = offset + p.numel();
    offset = hi;
    if (steps[i] == 0) continue;
    expected += 2;
    // Every listed tensor is checked, also outside the range, so that a damaged file fails on
    // every rank alike.
    GYRE_ASSIGN_OR_RETURN(at::Tensor fm, ReadTensor(*file, "exp_avg/" + name, p.sizes().vec()));
    GYRE_ASSIGN_OR_RETURN(at::Tensor fv, ReadTensor(*file, "exp_avg_sq/" + name, p.sizes().vec()));
    const int64_t a = std::max(lo, begin), b = std::min(hi, end);
    if (a >= b) continue;
    m.narrow(0, a - begin, b - a).copy_(fm.reshape({-1}).narrow(0, a - lo, b - a));
    v.narrow(0, a - begin, b - a).copy_(fv.reshape({-1}).narrow(0, a - lo, b - a));
  }
  if (file->entries().size() != expected) {
    return InvalidArgument(path + ": has " + std::to_string(file->entries().size()) +
                           " tensors, expected " + std::to_string(expected) +
                           " (two per parameter with a non-zero step in " + kStateFile + ")");
  }
  return std::make_pair(m, v);
}

}  // namespace

Status WriteModelDirectory(const std::string& dir, const model::Transformer& model,
                           const std::string& model_path) {
  GYRE_RETURN_IF_ERROR(model::SaveCheckpointWeights(dir, model.NamedParameters()));
  return WriteModelFiles(dir, model.spec(), model_path);
}

Status WriteModelFiles(const std::string& dir, const model::ModelSpec& spec,
                       const std::string& model_path) {
  if (model_path.empty()) {
    // The built-in model: a complete Hugging Face directory all the same, with the character
    // tokenizer as tokenizer.json (same ids) and its special tokens in config.json, so that
    // `gyre generate`, transformers and TRL can use it as it is.
    const std::string extra = "{\"bos_token_id\": " + std::to_string(text::CharTokenizer::kBos) +
                              ", \"eos_token_id\": " + std::to_string(text::CharTokenizer::kEos) +
                              ", \"pad_token_id\": " + std::to_string(text::CharTokenizer::kPad) +
                              "}";
    GYRE_RETURN_IF_ERROR(model::WriteHfConfig(dir, spec, extra));
    GYRE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/tokenizer.json", text::CharTokenizerJson()));
    return WriteFileAtomic(dir + "/tokenizer_config.json", text::CharTokenizerConfigJson());
  }
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "special_tokens_map.json"}) {
    if (PathExists(model_path + "/" + f)) {
      GYRE_RETURN_IF_ERROR(CopyFile(model_path + "/" + f, dir + "/" + f));
    }
  }
  return Status::Ok();
}

Status WriteModelDirectoryFromSlices(const std::string& dir, PolicyTrainer& trainer,
                                     const std::string& model_path) {
  const bool writer = trainer.writes_gathered();
  const std::vector<model::ParameterUnit> units = model::ParameterUnits(trainer.model().spec());
  std::vector<model::SafetensorsWriter::Entry> entries;
  for (const model::ParameterUnit& u : units) {
    for (size_t i = 0; i < u.names.size(); ++i) entries.push_back({u.names[i], u.shapes[i]});
  }
  // Rank 0 writes; the others only take part in the gathers, also after rank 0 failed.
  std::unique_ptr<model::SafetensorsWriter> out;
  Status opened;
  if (writer) {
    auto w = model::SafetensorsWriter::Create(dir + "/model.safetensors", entries);
    if (w.ok()) out = std::move(*w);
    opened = w.status();
  }
  GYRE_RETURN_IF_ERROR(trainer.GatherUnits(false, [&](const PolicyTrainer::GatheredUnit& g) {
    if (!writer) return Status::Ok();
    GYRE_RETURN_IF_ERROR(opened);
    for (size_t i = 0; i < g.weights.size(); ++i) {
      GYRE_RETURN_IF_ERROR(out->Append(g.def->names[i], g.weights[i]));
    }
    return Status::Ok();
  }));
  if (!writer) return Status::Ok();
  GYRE_RETURN_IF_ERROR(opened);
  GYRE_RETURN_IF_ERROR(out->Finish());
  return WriteModelFiles(dir, trainer.model().spec(), model_path);
}

namespace {

// SaveTrainerState for a trainer whose parameters are split (trainer.shard: parameters): every
// rank gathers the model, its AdamW moments and the reference unit by unit; rank 0 streams them
// into the files of format 1 (layout-free: any layout loads them), one unit at a time.
Status SaveSplitTrainerState(const std::string& dir, PolicyTrainer& trainer,
                             const std::string& model_path) {
  const bool writer = trainer.writes_gathered();
  // A failure of rank 0 is returned after the gathers: the other ranks are gathering with it.
  Status opened = writer ? MakeDirs(dir) : Status::Ok();
  const std::vector<model::ParameterUnit> units = model::ParameterUnits(trainer.model().spec());
  const std::vector<int64_t> steps = trainer.UnitSteps();
  const bool has_reference = trainer.reference() != nullptr;
  std::vector<model::SafetensorsWriter::Entry> weights, moments;
  nlohmann::json entries = nlohmann::json::array();
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t i = 0; i < units[u].names.size(); ++i) {
      weights.push_back({units[u].names[i], units[u].shapes[i]});
      entries.push_back(
          {{"name", units[u].names[i]}, {"shape", units[u].shapes[i]}, {"step", steps[u]}});
    }
    if (steps[u] == 0) continue;
    for (const char* kind : {"exp_avg/", "exp_avg_sq/"}) {
      for (size_t i = 0; i < units[u].names.size(); ++i) {
        moments.push_back({kind + units[u].names[i], units[u].shapes[i]});
      }
    }
  }
  std::unique_ptr<model::SafetensorsWriter> w_out, m_out, r_out;
  if (writer) {
    auto open = [&](const char* file, const std::vector<model::SafetensorsWriter::Entry>& list,
                    std::unique_ptr<model::SafetensorsWriter>* out) {
      if (!opened.ok()) return;
      auto w = model::SafetensorsWriter::Create(dir + "/" + file, list);
      if (w.ok()) *out = std::move(*w);
      opened = w.status();
    };
    open("model.safetensors", weights, &w_out);
    open(kOptimizerFile, moments, &m_out);
    if (has_reference) open(kReferenceFile, weights, &r_out);
  }
  GYRE_RETURN_IF_ERROR(trainer.GatherUnits(true, [&](const PolicyTrainer::GatheredUnit& g) {
    if (!writer) return Status::Ok();
    GYRE_RETURN_IF_ERROR(opened);
    const std::vector<std::string>& names = g.def->names;
    for (size_t i = 0; i < names.size(); ++i) {
      GYRE_RETURN_IF_ERROR(w_out->Append(names[i], g.weights[i]));
      if (r_out) GYRE_RETURN_IF_ERROR(r_out->Append(names[i], g.reference[i]));
    }
    for (size_t i = 0; i < g.exp_avg.size(); ++i) {
      GYRE_RETURN_IF_ERROR(m_out->Append("exp_avg/" + names[i], g.exp_avg[i]));
    }
    for (size_t i = 0; i < g.exp_avg_sq.size(); ++i) {
      GYRE_RETURN_IF_ERROR(m_out->Append("exp_avg_sq/" + names[i], g.exp_avg_sq[i]));
    }
    return Status::Ok();
  }));
  if (!writer) return Status::Ok();
  GYRE_RETURN_IF_ERROR(opened);
  GYRE_RETURN_IF_ERROR(w_out->Finish());
  GYRE_RETURN_IF_ERROR(m_out->Finish());
  const std::string ref_path = dir + "/" + kReferenceFile;
  if (r_out) {
    GYRE_RETURN_IF_ERROR(r_out->Finish());
  } else if (PathExists(ref_path)) {
    GYRE_RETURN_IF_ERROR(RemoveTree(ref_path));
  }
  GYRE_RETURN_IF_ERROR(WriteModelFiles(dir, trainer.model().spec(), model_path));
  const std::vector<uint8_t> rng = CpuRngState();
  const nlohmann::json state = {{"format", kFormat},
                                {"format_version", kFormatVersion},
                                {"policy_version", trainer.version()},
                                {"params", entries},
                                {"reference", has_reference},
                                {"rng", {{"torch_cpu", ToHex(rng.data(), rng.size())}}}};
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kStateFile, state.dump(1) + "\n"));
  return SyncDirectory(dir);
}

}  // namespace

Status SaveTrainerState(const std::string& dir, PolicyTrainer& trainer,
                        const std::string& model_path) {
  if (trainer.holds_slices()) return SaveSplitTrainerState(dir, trainer, model_path);
  const ShardedAdamW* sharded = trainer.sharded();
  // Without sharding rank 0 holds everything; with it, every rank writes its slice and rank 0
  // the rest.
  if (trainer.dp_rank() != 0 && sharded == nullptr) return Status::Ok();
  GYRE_RETURN_IF_ERROR(MakeDirs(dir));
  const model::NamedTensors params = trainer.model().NamedParameters();
  nlohmann::json entries = nlohmann::json::array();
  if (sharded != nullptr) {
    const ShardedAdamW::State st = sharded->Get();
    const ShardLayout& l = sharded->layout();
    GYRE_RETURN_IF_ERROR(
        model::SaveSafetensors(dir + "/" + ShardFileName(l.rank, l.ranks),
                               {{"exp_avg", st.exp_avg}, {"exp_avg_sq", st.exp_avg_sq}}));
    if (l.rank != 0) {
      // Only this rank's file: rank 0 writes (and syncs) the rest of the directory.
      GYRE_RETURN_IF_ERROR(SyncPath(dir + "/" + ShardFileName(l.rank, l.ranks)));
      return SyncPath(dir);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [name, p] = params[i];
      entries.push_back({{"name", name}, {"shape", p.sizes().vec()}, {"step", st.steps[i]}});
    }
    const std::string stale = dir + "/" + kOptimizerFile;
    if (PathExists(stale)) GYRE_RETURN_IF_ERROR(RemoveTree(stale));
  } else {
    const std::vector<PolicyTrainer::ParamState> opt = trainer.OptimizerState();
    model::NamedTensors moments;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [name, p] = params[i];
      entries.push_back({{"name", name}, {"shape", p.sizes().vec()}, {"step", opt[i].step}});
      if (opt[i].step > 0) {
        moments.emplace_back("exp_avg/" + name, opt[i].exp_avg);
        moments.emplace_back("exp_avg_sq/" + name, opt[i].exp_avg_sq);
      }
    }
    GYRE_RETURN_IF_ERROR(model::SaveSafetensors(dir + "/" + kOptimizerFile, moments));
  }
  GYRE_RETURN_IF_ERROR(WriteModelDirectory(dir, trainer.model(), model_path));
  // The KL term's frozen reference policy, once there is one; a stale file of an earlier save
  // into this directory must not come back with a state that has none.
  const std::string ref_path = dir + "/" + kReferenceFile;
  const bool has_reference = trainer.reference() != nullptr;
  if (has_reference) {
    GYRE_RETURN_IF_ERROR(model::SaveSafetensors(ref_path, trainer.reference()->NamedParameters()));
  } else if (PathExists(ref_path)) {
    GYRE_RETURN_IF_ERROR(RemoveTree(ref_path));
  }
  const std::vector<uint8_t> rng = CpuRngState();
  nlohmann::json state = {
      {"format", kFormat},
      {"format_version", sharded != nullptr ? kShardedFormatVersion : kFormatVersion},
      {"policy_version", trainer.version()},
      {"params", entries},
      {"reference", has_reference},
      {"rng", {{"torch_cpu", ToHex(rng.data(), rng.size())}}}};
  if (sharded != nullptr) {
    state["optimizer_shards"] = {{"ranks", sharded->layout().ranks},
                                 {"elements", sharded->layout().total}};
  }
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kStateFile, state.dump(1) + "\n"));
  return SyncDirectory(dir);
}

Status LoadTrainerState(const std::string& dir, PolicyTrainer* trainer) {
  if (!IsDirectory(dir)) return NotFound("trainer state directory " + dir + " does not exist");
  // trainer_state.json: format, version, per-parameter shapes and steps, RNG.
  const std::string state_path = dir + "/" + kStateFile;
  GYRE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(state_path));
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(state_path + ": not valid JSON: " + e.what());
  }
  auto bad = [&](const std::string& why) { return InvalidArgument(state_path + ": " + why); };
  // Not value("format", ""), which throws when "format" is there but is no string.
  if (!state.is_object() || !state.contains("format") || state["format"] != kFormat) {
    return bad(std::string("not a trainer state (expected \"format\": \"") + kFormat + "\")");
  }
  if (!state["format_version"].is_number_integer() ||
      (state["format_version"].get<int>() != kFormatVersion &&
       state["format_version"].get<int>() != kShardedFormatVersion)) {
    return bad("unsupported format_version " + state["format_version"].dump() +
               " (this build reads " + std::to_string(kFormatVersion) + " and " +
               std::to_string(kShardedFormatVersion) + ")");
  }
  // trainer.shard: parameters reads only this rank's slices (mapped files, no whole copy); the
  // model may already be split, so its parameters' names and shapes come from its spec.
  const bool split = trainer->sharding() == Shard::kParameters || trainer->tp_size() > 1;
  model::NamedTensors params;
  if (split) {
    for (const model::ParameterUnit& u : model::ParameterUnits(trainer->model().spec())) {
      for (size_t i = 0; i < u.names.size(); ++i) {
        params.emplace_back(
            u.names[i],
            at::empty(u.shapes[i], at::TensorOptions().dtype(at::kFloat).device(at::kMeta)));
      }
    }
  } else {
    params = trainer->model().NamedParameters();
  }
  // Format 2: the moments are in one file per rank of the group that saved them.
  int shards = 0;
  if (state["format_version"].get<int>() == kShardedFormatVersion) {
    const auto& o = state["optimizer_shards"];
    if (!o.is_object() || !o["ranks"].is_number_integer() || o["ranks"].get<int64_t>() < 1 ||
        o["ranks"].get<int64_t>() > 65536 || !o["elements"].is_number_integer()) {
      return bad(
          "format_version 2 needs \"optimizer_shards\": {\"ranks\": N >= 1, "
          "\"elements\": E}");
    }
    shards = o["ranks"].get<int>();
    int64_t total = 0;
    for (const auto& [name, p] : params) total += p.numel();
    if (o["elements"].get<int64_t>() != total) {
      return bad("optimizer_shards.elements is " + o["elements"].dump() + ", the model has " +
                 std::to_string(total) + " parameter elements");
    }
  }
  if (!state["policy_version"].is_number_integer() || state["policy_version"].get<int64_t>() < 0) {
    return bad("policy_version must be a non-negative integer");
  }
  const int64_t version = state["policy_version"].get<int64_t>();
  if (!state["params"].is_array()) return bad("\"params\" must be an array");
  struct Entry {
    std::vector<int64_t> shape;
    int64_t step = 0;
  };
  std::map<std::string, Entry> entries;
  for (const auto& e : state["params"]) {
    if (!e.is_object() || !e.contains("name") || !e.contains("shape") || !e.contains("step") ||
        !e["name"].is_string() || !e["shape"].is_array() || !e["step"].is_number_integer() ||
        e["step"].get<int64_t>() < 0) {
      return bad("each of \"params\" needs a name, a shape and a non-negative step: " + e.dump());
    }
    Entry entry;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer()) return bad("bad shape " + e["shape"].dump());
      entry.shape.push_back(d.get<int64_t>());
    }
    entry.step = e["step"].get<int64_t>();
    if (!entries.emplace(e["name"].get<std::string>(), entry).second) {
      return bad("parameter '" + e["name"].get<std::string>() + "' is listed twice");
    }
  }
  for (const auto& [name, p] : params) {
    auto it = entries.find(name);
    if (it == entries.end()) return bad("the model's parameter '" + name + "' is missing");
    if (it->second.shape != p.sizes().vec()) {
      return bad("parameter '" + name + "' has shape " + ShapeText(it->second.shape) +
                 ", the model expects " + ShapeText(p.sizes().vec()));
    }
  }
  if (entries.size() != params.size()) {
    std::map<std::string, int> known;
    for (const auto& p : params) known[p.first] = 1;
    for (const auto& [name, e] : entries) {
      if (!known.count(name)) return bad("parameter '" + name + "' is not in the model");
    }
  }
  if (!state["rng"].is_object() || !state["rng"]["torch_cpu"].is_string()) {
    return bad("missing rng.torch_cpu");
  }
  std::vector<uint8_t> rng;
  if (!FromHex(state["rng"]["torch_cpu"].get<std::string>(), &rng) ||
      rng.size() != CpuRngState().size()) {
    return bad("rng.torch_cpu is not a CPU generator state of " +
               std::to_string(CpuRngState().size()) + " bytes in hex");
  }

  // The weights: exactly the model's parameters, float32, same shapes (one file or shards).
  const std::string weights_path = dir + "/model.safetensors";
  GYRE_ASSIGN_OR_RETURN(auto weights_file, model::Checkpoint::Open(dir));
  std::vector<at::Tensor> weights;
  for (const auto& [name, p] : params) {
    if (!weights_file->Has(name)) {
      return InvalidArgument(weights_path + ": missing tensor '" + name + "'");
    }
    GYRE_ASSIGN_OR_RETURN(at::Tensor w, weights_file->View(name));
    if (w.scalar_type() != at::kFloat || w.sizes() != p.sizes()) {
      return InvalidArgument(weights_path + ": tensor '" + name + "' is " +
                             std::string(c10::toString(w.scalar_type())) + " " +
                             ShapeText(w.sizes().vec()) + ", the model expects Float " +
                             ShapeText(p.sizes().vec()));
    }
    weights.push_back(split ? w : w.clone());
  }
  if (weights_file->Names().size() != params.size()) {
    return InvalidArgument(weights_path + ": has " + std::to_string(weights_file->Names().size()) +
                           " tensors, the model has " + std::to_string(params.size()));
  }

  // The AdamW moments, in whichever layout they were saved, for this trainer's layout: its
  // rank's slice when sharded (possibly over another number of ranks than the saving group's),
  // every parameter's otherwise.
  std::vector<int64_t> steps;
  for (const auto& [name, p] : params) steps.push_back(entries[name].step);
  const ShardedAdamW* sharded = split ? nullptr : trainer->sharded();
  std::vector<PolicyTrainer::ParamState> opt;
  ShardedAdamW::State sharded_state;
  std::unique_ptr<model::SafetensorsFile> moment_file;  // split, format 1: the views' file
  if (split) {
    // Whole moment tensors per parameter, read only where this rank's slices lie: views of
    // optimizer.safetensors (format 1), or each parameter's range of the slice files (format 2).
    if (shards == 0) {
      GYRE_ASSIGN_OR_RETURN(moment_file, model::SafetensorsFile::Open(dir + "/" + kOptimizerFile));
    }
    size_t expected = 0;
    int64_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [name, p] = params[i];
      PolicyTrainer::ParamState ps;
      ps.step = steps[i];
      if (ps.step > 0 && shards == 0) {
        expected += 2;
        GYRE_ASSIGN_OR_RETURN(ps.exp_avg,
                              ViewTensor(*moment_file, "exp_avg/" + name, p.sizes().vec()));
        GYRE_ASSIGN_OR_RETURN(ps.exp_avg_sq,
                              ViewTensor(*moment_file, "exp_avg_sq/" + name, p.sizes().vec()));
      } else if (ps.step > 0) {
        GYRE_ASSIGN_OR_RETURN(
            auto range, ReadMomentRange(dir, params, steps, shards, offset, offset + p.numel()));
        ps.exp_avg = range.first.view(p.sizes());
        ps.exp_avg_sq = range.second.view(p.sizes());
      }
      offset += p.numel();
      opt.push_back(std::move(ps));
    }
    if (moment_file != nullptr && moment_file->entries().size() != expected) {
      return InvalidArgument(moment_file->path() + ": has " +
                             std::to_string(moment_file->entries().size()) + " tensors, expected " +
                             std::to_string(expected) +
                             " (two per parameter with a non-zero step in " + kStateFile + ")");
    }
  } else if (sharded != nullptr) {
    GYRE_ASSIGN_OR_RETURN(auto range,
                          ReadMomentRange(dir, params, steps, shards, sharded->layout().begin,
                                          sharded->layout().end));
    sharded_state.steps = steps;
    sharded_state.exp_avg = std::move(range.first);
    sharded_state.exp_avg_sq = std::move(range.second);
  } else {
    int64_t total = 0;
    for (const auto& [name, p] : params) total += p.numel();
    GYRE_ASSIGN_OR_RETURN(auto all, ReadMomentRange(dir, params, steps, shards, 0, total));
    int64_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i].second;
      PolicyTrainer::ParamState ps;
      ps.step = steps[i];
      if (ps.step > 0) {
        ps.exp_avg = all.first.narrow(0, offset, p.numel()).view(p.sizes()).clone();
        ps.exp_avg_sq = all.second.narrow(0, offset, p.numel()).view(p.sizes()).clone();
      }
      offset += p.numel();
      opt.push_back(std::move(ps));
    }
  }

  // The reference policy: state files before it existed have no "reference" key (none).
  if (state.contains("reference") && !state["reference"].is_boolean()) {
    return bad("\"reference\" must be true or false");
  }
  const bool has_reference = state.value("reference", false);
  std::vector<at::Tensor> reference;
  std::unique_ptr<model::SafetensorsFile> ref_file;
  if (has_reference) {
    const std::string ref_path = dir + "/" + kReferenceFile;
    GYRE_ASSIGN_OR_RETURN(ref_file, model::SafetensorsFile::Open(ref_path));
    for (const auto& [name, p] : params) {
      GYRE_ASSIGN_OR_RETURN(at::Tensor w, ViewTensor(*ref_file, name, p.sizes().vec()));
      reference.push_back(split ? w : w.clone());
    }
    if (ref_file->entries().size() != params.size()) {
      return InvalidArgument(ref_path + ": has " + std::to_string(ref_file->entries().size()) +
                             " tensors, the model has " + std::to_string(params.size()));
    }
  }

  // All checked: commit.
  if (split) {
    GYRE_RETURN_IF_ERROR(trainer->RestoreSplitState(weights, opt, version).WithContext(dir));
  } else if (sharded != nullptr) {
    GYRE_RETURN_IF_ERROR(
        trainer->RestoreShardedState(weights, sharded_state, version).WithContext(dir));
  } else {
    GYRE_RETURN_IF_ERROR(trainer->RestoreState(weights, opt, version).WithContext(dir));
  }
  if (has_reference) {
    GYRE_RETURN_IF_ERROR(trainer->RestoreReference(reference).WithContext(dir));
  } else {
    trainer->DropReference();
  }
  SetCpuRngState(rng);
  return Status::Ok();
}

}  // namespace gyre::trainer
