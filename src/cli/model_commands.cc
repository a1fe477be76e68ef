#include "cli/model_commands.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/hf_config.h"

namespace gyre::cli {

namespace {

constexpr char kLogprobsUsage[] =
    "usage: gyre logprobs --model DIR [--ids \"ID ID ...\"] [--full]\n"
    "\n"
    "Loads a Hugging Face model directory (config.json + safetensors) in float32 and prints,\n"
    "for each token sequence, one JSON line {\"ids\": [...], \"logprobs\": [...]} where\n"
    "logprobs[t] = log p(ids[t+1] | ids[0..t]). Sequences come from --ids or, without it, one\n"
    "JSON array of ids per line on stdin. --full adds \"full\": the log-softmax over the whole\n"
    "vocabulary at every position (for parity checks against another implementation).\n";

StatusOr<std::vector<int64_t>> ParseIds(const std::string& text, bool json_array) {
  std::vector<int64_t> ids;
  if (json_array) {
    try {
      auto j = nlohmann::json::parse(text);
      if (!j.is_array()) return InvalidArgument("expected a JSON array of token ids");
      for (const auto& v : j) {
        if (!v.is_number_integer()) return InvalidArgument("token ids must be integers");
        ids.push_back(v.get<int64_t>());
      }
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(std::string("not valid JSON: ") + e.what());
    }
    return ids;
  }
  std::string cleaned = text;
  for (char& c : cleaned) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(cleaned);
  std::string tok;
  while (in >> tok) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(tok, &used));
      if (used != tok.size()) throw std::invalid_argument(tok);
    } catch (const std::exception&) {
      return InvalidArgument("'" + tok + "' is not a token id");
    }
  }
  return ids;
}

}  // namespace

int RunLogprobs(const std::vector<std::string>& args) {
  std::string model_dir, ids_text;
  bool full = false, have_ids = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kLogprobsUsage, stdout);
      return 0;
    } else if (args[i] == "--model" && i + 1 < args.size()) {
      model_dir = args[++i];
    } else if (args[i] == "--ids" && i + 1 < args.size()) {
      ids_text = args[++i];
      have_ids = true;
    } else if (args[i] == "--full") {
      full = true;
    } else {
      std::fprintf(stderr, "gyre logprobs: unexpected argument '%s' (see gyre logprobs --help)\n",
                   args[i].c_str());
      return 2;
    }
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "gyre logprobs: --model DIR is required\n");
    return 2;
  }
  auto model = model::LoadHfModel(model_dir);
  if (!model.ok()) {
    std::fprintf(stderr, "gyre: %s\n", model.status().message().c_str());
    return 1;
  }
  const int64_t vocab = (*model)->spec().vocab_size;
  c10::InferenceMode guard;
  auto run = [&](const std::string& text, bool json_array) -> bool {
    auto ids = ParseIds(text, json_array);
    Status s = ids.status();
    if (s.ok() && ids->empty()) s = InvalidArgument("empty token sequence");
    if (s.ok()) {
      for (int64_t id : *ids) {
        if (id < 0 || id >= vocab) {
          s = InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary of " +
                              std::to_string(vocab));
          break;
        }
      }
    }
    if (s.ok() && static_cast<int64_t>(ids->size()) > (*model)->spec().max_seq_len) {
      s = InvalidArgument(std::to_string(ids->size()) + " tokens exceed max_position_embeddings " +
                          std::to_string((*model)->spec().max_seq_len));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "gyre logprobs: %s\n", s.message().c_str());
      return false;
    }
    at::Tensor tokens = at::tensor(*ids).unsqueeze(0);
    at::Tensor lsm = at::log_softmax((*model)->Forward(tokens)[0].to(at::kFloat), -1);  // [T, V]
    nlohmann::json out;
    out["ids"] = *ids;
    std::vector<double> lp;
    for (size_t t = 0; t + 1 < ids->size(); ++t) {
      lp.push_back(lsm[static_cast<int64_t>(t)][(*ids)[t + 1]].item<double>());
    }
    out["logprobs"] = lp;
    if (full) {
      std::vector<std::vector<float>> rows(ids->size());
      auto a = lsm.contiguous();
      for (size_t t = 0; t < ids->size(); ++t) {
        const float* row = a.data_ptr<float>() + t * vocab;
        rows[t].assign(row, row + vocab);
      }
      out["full"] = rows;
    }
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
    return true;
  };
  if (have_ids) return run(ids_text, false) ? 0 : 1;
  std::string line;
  bool ok = true;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ok = run(line, true) && ok;
  }
  return ok ? 0 : 1;
}

}  // namespace gyre::cli
