#pragma once
// TextTokenizer: what the controller needs from a tokenizer, whichever model a job trains.
// The built-in tiny model uses the character tokenizer (a BOS token before every prompt, its
// own EOS); a Hugging Face model directory uses its tokenizer.json (no BOS is added, as Qwen's
// tokenizer does not add one; chat templates carry their own markers) and stops at the
// eos_token_id(s) of its config.json. Implementations are immutable and thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gyre/config.h"
#include "gyre/status.h"

namespace gyre::text {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // Plain text -> ids (no BOS).
  virtual StatusOr<std::vector<int32_t>> Encode(const std::string& text) const = 0;
  // Ids -> text, special tokens dropped.
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // Prepended to every prompt when set.
  virtual std::optional<int32_t> bos_id() const = 0;
  // Generation stops at any of these; the first ends supervised targets.
  virtual const std::vector<int32_t>& stop_ids() const = 0;
};

// The tokenizer for a job's model section: model.path's tokenizer.json and config.json, or the
// character tokenizer of the built-in model when model.path is empty.
StatusOr<std::unique_ptr<TextTokenizer>> MakeTextTokenizer(const ModelSection& model);

}  // namespace gyre::text
