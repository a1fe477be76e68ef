#include "controller/task.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/strings.h"
#include "model/chat_template.h"

namespace gyre::controller {

StatusOr<std::vector<Problem>> LoadJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open dataset " + path);
  std::vector<Problem> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (TrimString(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      return InvalidArgument(where + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) return InvalidArgument(where + ": expected a JSON object");
    if (!j.contains("prompt") || !(j["prompt"].is_string() || j["prompt"].is_array())) {
      return InvalidArgument(where +
                             ": missing string field \"prompt\" (or a list of chat messages)");
    }
    if (j.contains("answer") && !j["answer"].is_string()) {
      return InvalidArgument(where + ": field \"answer\" must be a string");
    }
    if (j["prompt"].is_array()) {
      // Checked here so a bad record is reported with its line, not mid-job.
      auto messages = model::ParseMessagesJson(j["prompt"].dump());
      if (!messages.ok())
        return InvalidArgument(where + ": prompt: " + messages.status().message());
      out.push_back({j["prompt"].dump(), j.value("answer", std::string()), true, where});
    } else {
      out.push_back(
          {j["prompt"].get<std::string>(), j.value("answer", std::string()), false, where});
    }
  }
  if (out.empty()) return InvalidArgument(path + ": dataset has no records");
  return out;
}

Problem ProblemSource::Draw(std::mt19937_64* rng) const {
  if (data_.task == "copy") {
    // Long-tail answer lengths: lognormal with median min_digits (sigma 0.75), clamped to
    // [min_digits, max_digits].
    std::normal_distribution<double> z(0.0, 1.0);
    const double len = std::round(std::exp(std::log(data_.min_digits) + 0.75 * z(*rng)));
    const int d =
        std::clamp(static_cast<int>(std::min(len, 1e6)), data_.min_digits, data_.max_digits);
    std::uniform_int_distribution<int> digit(0, 9);
    std::string s;
    for (int i = 0; i < d; ++i) s += static_cast<char>('0' + digit(*rng));
    return {"c" + s + "=", s};
  }
  auto operand = [&]() {
    std::uniform_int_distribution<int> len(data_.min_digits, data_.max_digits);
    int d = len(*rng);
    int64_t lo = d == 1 ? 0 : 1;
    for (int i = 1; i < d; ++i) lo *= 10;
    int64_t hi = 1;
    for (int i = 0; i < d; ++i) hi *= 10;
    std::uniform_int_distribution<int64_t> v(lo, hi - 1);
    return v(*rng);
  };
  int64_t a = operand(), b = operand();
  return {std::to_string(a) + "+" + std::to_string(b) + "=", std::to_string(a + b)};
}

StatusOr<ProblemSource> ProblemSource::Create(const DataSection& data, uint64_t seed) {
  ProblemSource src;
  src.data_ = data;
  src.rng_.seed(seed);
  if (!data.eval_path.empty()) {
    GYRE_ASSIGN_OR_RETURN(src.eval_, LoadJsonl(data.eval_path));
  } else {
    std::mt19937_64 eval_rng(data.eval_seed);
    for (int i = 0; i < data.eval_size; ++i) src.eval_.push_back(src.Draw(&eval_rng));
  }
  for (const auto& p : src.eval_) src.eval_prompts_.insert(p.prompt);
  if (!data.train_path.empty()) {
    GYRE_ASSIGN_OR_RETURN(src.train_, LoadJsonl(data.train_path));
    std::shuffle(src.train_.begin(), src.train_.end(), src.rng_);
  }
  return src;
}

Problem ProblemSource::Next() {
  if (!train_.empty()) {
    Problem p = train_[cursor_ % train_.size()];
    ++cursor_;
    return p;
  }
  // Held-out problems never appear in training. With tiny operand ranges every problem may be
  // held out; give up rejecting after a bounded number of draws rather than loop forever.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Problem p = Draw(&rng_);
    if (!eval_prompts_.count(p.prompt)) return p;
  }
  return Draw(&rng_);
}

std::string ProblemSource::SaveState() const {
  std::ostringstream out;
  out << "cursor " << cursor_ << " mt19937_64 " << rng_;
  return out.str();
}

Status ProblemSource::RestoreState(const std::string& state) {
  std::istringstream in(state);
  std::string cursor_tag, rng_tag;
  size_t cursor = 0;
  std::mt19937_64 rng;
  in >> cursor_tag >> cursor >> rng_tag >> rng;
  if (in.fail() || cursor_tag != "cursor" || rng_tag != "mt19937_64" || !(in >> std::ws).eof()) {
    return InvalidArgument("not a problem-stream state: '" + state.substr(0, 40) + "...'");
  }
  cursor_ = cursor;
  rng_ = rng;
  return Status::Ok();
}

StatusOr<double> ExactMatchReward::Score(const RewardInput& input) {
  return (input.finished && TrimString(input.response) == TrimString(input.answer)) ? 1.0 : 0.0;
}

StatusOr<std::shared_ptr<RewardFn>> ChooseReward(const RewardSection& reward,
                                                 std::shared_ptr<RewardFn> custom) {
  if (reward.type == "custom") {
    if (!custom) {
      return InvalidArgument(
          "reward.type is custom but no RewardFn was given (custom rewards "
          "need the C++ API, RunOptions::reward)");
    }
    return custom;
  }
  if (custom) {
    return InvalidArgument(
        "reward.type is " + reward.type +
        " but a custom RewardFn was given in RunOptions::reward; set reward.type: custom to "
        "use it, or leave RunOptions::reward empty for the built-in reward");
  }
  return std::shared_ptr<RewardFn>(std::make_shared<ExactMatchReward>());
}

}  // namespace gyre::controller
