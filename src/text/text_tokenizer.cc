#include "text/text_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "text/bpe_tokenizer.h"
#include "text/tokenizer.h"

namespace gyre::text {

namespace {

class CharText final : public TextTokenizer {
 public:
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    return tok_.Encode(text);
  }
  std::string Decode(const std::vector<int32_t>& ids) const override { return tok_.Decode(ids); }
  std::optional<int32_t> bos_id() const override { return tok_.bos_id(); }
  const std::vector<int32_t>& stop_ids() const override { return stops_; }

 private:
  CharTokenizer tok_;
  std::vector<int32_t> stops_ = {CharTokenizer::kEos};
};

class BpeText final : public TextTokenizer {
 public:
  BpeText(std::unique_ptr<BpeTokenizer> tok, std::vector<int32_t> stops)
      : tok_(std::move(tok)), stops_(std::move(stops)) {}
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    return tok_->Encode(text);
  }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    return tok_->Decode(ids, /*skip_special=*/true);
  }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  const std::vector<int32_t>& stop_ids() const override { return stops_; }

 private:
  std::unique_ptr<BpeTokenizer> tok_;
  std::vector<int32_t> stops_;
};

}  // namespace

StatusOr<std::unique_ptr<TextTokenizer>> MakeTextTokenizer(const ModelSection& model) {
  if (model.path.empty()) return std::unique_ptr<TextTokenizer>(new CharText());
  GYRE_ASSIGN_OR_RETURN(auto bpe, BpeTokenizer::FromFile(model.path + "/tokenizer.json"));
  const std::string config_path = model.path + "/config.json";
  std::ifstream in(config_path);
  if (!in) return NotFound("cannot open " + config_path);
  std::vector<int32_t> stops;
  try {
    auto j = nlohmann::json::parse(in);
    if (j.contains("eos_token_id")) {
      const auto& e = j["eos_token_id"];
      if (e.is_number_integer()) stops.push_back(e.get<int32_t>());
      if (e.is_array()) {
        for (const auto& v : e) {
          if (v.is_number_integer()) stops.push_back(v.get<int32_t>());
        }
      }
    }
  } catch (const std::exception& e) {
    return InvalidArgument(config_path + ": not valid JSON: " + e.what());
  }
  if (stops.empty()) {
    return InvalidArgument(config_path + ": no eos_token_id; Gyre needs it to end responses");
  }
  return std::unique_ptr<TextTokenizer>(new BpeText(std::move(bpe), std::move(stops)));
}

}  // namespace gyre::text
