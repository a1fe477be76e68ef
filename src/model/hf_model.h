#pragma once
// A Hugging Face model directory -> a loaded float32 Transformer (libtorch).

#include <cstdint>
#include <memory>
#include <string>

#include "gyre/status.h"
#include "model/hf_config.h"
#include "model/transformer.h"

namespace gyre::model {

// config.json + model.safetensors (or a sharded index) in `dir` -> a float32 Transformer.
// A model too large for this machine's memory is refused first (CheckModelSize). `max_seq_len` > 0
// limits prompt + response length below the model's max_position_embeddings (a job's
// model.max_seq_len); a limit above it is an error.
StatusOr<std::unique_ptr<Transformer>> LoadHfModel(const std::string& dir, int64_t max_seq_len = 0);

}  // namespace gyre::model
