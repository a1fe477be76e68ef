#include "controller/task.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "agent/service_reward.h"
#include "common/strings.h"
#include "text/chat_template.h"

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
      auto messages = text::ParseMessagesJson(j["prompt"].dump());
      if (!messages.ok())
        return InvalidArgument(where + ": prompt: " + messages.status().message());
      out.push_back({j["prompt"].dump(), j.value("answer", std::string()), true, where, j.dump()});
    } else {
      out.push_back({j["prompt"].get<std::string>(), j.value("answer", std::string()), false, where,
                     j.dump()});
    }
  }
  if (out.empty()) return InvalidArgument(path + ": dataset has no records");
  return out;
}

std::string TaskJson(const Problem& problem) {
  if (!problem.record.empty()) return problem.record;
  return nlohmann::json{{"prompt", problem.prompt}, {"answer", problem.answer}}.dump();
}

namespace {

struct WordTemplate {
  const char* text;  // {n} a name, {p} its pronoun, {x} a thing, {a} {b} the operands
  char op;           // '+', '-' (a >= b) or '*' (b is one digit, 2-9)
};

const std::vector<WordTemplate>& WordTemplates() {
  static const std::vector<WordTemplate>* t = new std::vector<WordTemplate>{
      {"{n} has {a} {x}. {P} buys {b} more. How many {x} does {n} have now?", '+'},
      {"{n} had {a} {x} and gave {b} of them to a friend. How many {x} does {n} have left?", '-'},
      {"A box holds {a} {x}. How many {x} are there in {b} such boxes?", '*'},
      {"{n} counted {a} {x} in the morning and {b} in the afternoon. How many {x} did {n} count "
       "in all?",
       '+'},
      {"There were {a} {x} on a shelf. {n} took {b} away. How many {x} are on the shelf now?", '-'},
      {"{n} packs {b} bags with {a} {x} each. How many {x} does {n} pack?", '*'},
  };
  return *t;
}

const std::vector<std::pair<const char*, const char*>>& WordNames() {
  static const auto* n = new std::vector<std::pair<const char*, const char*>>{
      {"Mia", "She"}, {"Noah", "He"}, {"Ava", "She"},
      {"Liam", "He"}, {"Zoe", "She"}, {"Omar", "He"}};
  return *n;
}

const std::vector<const char*>& WordThings() {
  static const auto* t =
      new std::vector<const char*>{"apples", "marbles", "stickers", "books", "pencils", "shells"};
  return *t;
}

std::string Fill(const WordTemplate& t, const std::string& name, const std::string& pronoun,
                 const std::string& thing, int64_t a, int64_t b) {
  std::string out;
  for (const char* c = t.text; *c != '\0'; ++c) {
    if (c[0] == '{' && c[1] != '\0' && c[2] == '}') {
      switch (c[1]) {
        case 'n':
          out += name;
          break;
        case 'P':
          out += pronoun;
          break;
        case 'x':
          out += thing;
          break;
        case 'a':
          out += std::to_string(a);
          break;
        case 'b':
          out += std::to_string(b);
          break;
      }
      c += 2;
      continue;
    }
    out += *c;
  }
  return out;
}

int64_t Apply(char op, int64_t a, int64_t b) {
  return op == '+' ? a + b : op == '-' ? a - b : a * b;
}

}  // namespace

std::vector<Problem> ProblemSource::LongestPrompts() const {
  std::vector<Problem> out;
  if (!train_.empty() || data_.task != "word_problems") return out;
  int64_t big = 0;
  for (int i = 0; i < data_.max_digits; ++i) big = big * 10 + 9;
  size_t name = 0, thing = 0;
  for (size_t i = 0; i < WordNames().size(); ++i) {
    if (std::string(WordNames()[i].first).size() > std::string(WordNames()[name].first).size())
      name = i;
  }
  for (size_t i = 0; i < WordThings().size(); ++i) {
    if (std::string(WordThings()[i]).size() > std::string(WordThings()[thing]).size()) thing = i;
  }
  for (const WordTemplate& t : WordTemplates()) {
    const int64_t b = t.op == '*' ? 9 : big;
    out.push_back(
        {Fill(t, WordNames()[name].first, WordNames()[name].second, WordThings()[thing], big, b),
         std::to_string(Apply(t.op, big, b)), false, "", ""});
  }
  return out;
}

Problem ProblemSource::Draw(std::mt19937_64* rng) const {
  if (data_.task == "word_problems") {
    const auto& templates = WordTemplates();
    const WordTemplate& t =
        templates[std::uniform_int_distribution<size_t>(0, templates.size() - 1)(*rng)];
    const auto& who =
        WordNames()[std::uniform_int_distribution<size_t>(0, WordNames().size() - 1)(*rng)];
    const char* thing =
        WordThings()[std::uniform_int_distribution<size_t>(0, WordThings().size() - 1)(*rng)];
    std::uniform_int_distribution<int> len(data_.min_digits, data_.max_digits);
    auto operand = [&](int d) {
      int64_t lo = 1, hi = 1;
      for (int i = 1; i < d; ++i) lo *= 10;
      for (int i = 0; i < d; ++i) hi *= 10;
      return std::uniform_int_distribution<int64_t>(d == 1 ? 2 : lo, hi - 1)(*rng);
    };
    int64_t a = operand(len(*rng));
    int64_t b =
        t.op == '*' ? std::uniform_int_distribution<int64_t>(2, 9)(*rng) : operand(len(*rng));
    if (t.op == '-' && b > a) std::swap(a, b);
    return {Fill(t, who.first, who.second, thing, a, b), std::to_string(Apply(t.op, a, b)), false,
            "", ""};
  }
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
    return {"c" + s + "=", s, false, "", ""};
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
  return {std::to_string(a) + "+" + std::to_string(b) + "=", std::to_string(a + b), false, "", ""};
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

std::string NormaliseNumber(const std::string& text) {
  std::string t = TrimString(text);
  if (!t.empty() && t.back() == '.') t.pop_back();  // "42." at the end of a sentence
  std::string digits;
  bool negative = false, point = false, any = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (i == 0 && (c == '-' || c == '+')) {
      negative = c == '-';
    } else if (c >= '0' && c <= '9') {
      digits += c;
      any = true;
    } else if (c == ',' && any && !point) {
      continue;  // thousands separator
    } else if (c == '.' && !point && any) {
      point = true;
      digits += c;
    } else {
      return "";
    }
  }
  if (!any) return "";
  if (point) {
    while (digits.back() == '0') digits.pop_back();
    if (digits.back() == '.') digits.pop_back();
  }
  const size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return "0";
  digits = digits[first] == '.' ? "0" + digits.substr(first) : digits.substr(first);
  return (negative ? "-" : "") + digits;
}

std::string FinalNumber(const std::string& response) {
  const size_t boxed = response.rfind("\\boxed{");
  if (boxed != std::string::npos) {
    const size_t open = boxed + 7, close = response.find('}', open);
    if (close != std::string::npos) return NormaliseNumber(response.substr(open, close - open));
  }
  // The last run of [-]digits[,digits][.digits].
  std::string last;
  for (size_t i = 0; i < response.size();) {
    const char c = response[i];
    if (c < '0' || c > '9') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < response.size() &&
           ((response[j] >= '0' && response[j] <= '9') ||
            ((response[j] == ',' || response[j] == '.') && j + 1 < response.size() &&
             response[j + 1] >= '0' && response[j + 1] <= '9'))) {
      ++j;
    }
    const bool minus = i > 0 && response[i - 1] == '-' &&
                       (i == 1 || response[i - 2] == ' ' || response[i - 2] == '(' ||
                        response[i - 2] == '=' || response[i - 2] == '$');
    last = (minus ? "-" : "") + response.substr(i, j - i);
    i = j;
  }
  return last.empty() ? "" : NormaliseNumber(last);
}

StatusOr<double> MathReward::Score(const RewardInput& input) {
  const std::string want = NormaliseNumber(input.answer);
  if (want.empty()) {
    return InvalidArgument("reward.type math needs a numeric answer, not '" + input.answer + "'");
  }
  if (!input.finished) return 0.0;
  return FinalNumber(input.response) == want ? 1.0 : 0.0;
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
  if (reward.type == "service") return std::shared_ptr<RewardFn>();  // StartRewardService
  if (reward.type == "env") {
    // The scorer takes each episode's reward from its sample (StepScorer::SetEpisodes); this
    // RewardFn only answers correct_threshold.
    class EnvironmentReward final : public RewardFn {
     public:
      StatusOr<double> Score(const RewardInput&) override {
        return FailedPrecondition("reward.type env: rewards come from the environment's episodes");
      }
    };
    return std::shared_ptr<RewardFn>(std::make_shared<EnvironmentReward>());
  }
  if (reward.type == "math") return std::shared_ptr<RewardFn>(std::make_shared<MathReward>());
  return std::shared_ptr<RewardFn>(std::make_shared<ExactMatchReward>());
}

namespace {

// A supervised server of a job section (reward or env): the same settings in both.
template <typename Section>
StatusOr<std::unique_ptr<agent::ServiceSupervisor>> StartService(agent::ServiceKind kind,
                                                                 const std::string& what,
                                                                 const Section& section,
                                                                 const std::string& log_path) {
  agent::ServiceOptions o;
  o.kind = kind;
  o.what = what;
  o.address = section.address;
  o.command = section.command;
  o.log_path = log_path;
  o.ready_timeout_s = section.ready_timeout_s;
  o.max_restarts = section.max_restarts;
  return agent::ServiceSupervisor::Start(o);
}

}  // namespace

StatusOr<std::unique_ptr<agent::ServiceSupervisor>> StartEnvService(const EnvSection& env,
                                                                    const std::string& log_path) {
  return StartService(agent::ServiceKind::kEnv, "environment", env, log_path);
}

StatusOr<std::shared_ptr<RewardFn>> StartRewardService(const RewardSection& reward,
                                                       const std::string& log_path) {
  GYRE_ASSIGN_OR_RETURN(auto service,
                        StartService(agent::ServiceKind::kReward, "reward", reward, log_path));
  agent::RewardServiceOptions r;
  r.timeout_s = reward.timeout_s;
  r.item_timeout_s = reward.item_timeout_s;
  r.batch_size = reward.batch_size;
  r.concurrency = reward.concurrency;
  return std::shared_ptr<RewardFn>(std::make_shared<agent::ServiceReward>(std::move(service), r));
}

}  // namespace gyre::controller
