#pragma once
// GGUF -> Hugging Face directory: `gyre convert gguf` (docs/models.md). A llama-architecture GGUF
// file (llama.cpp's naming: token_embd, blk.N.attn_q, ...) becomes config.json,
// model.safetensors (float32: every tensor dequantised) and, from the file's tokenizer metadata,
// tokenizer.json and tokenizer_config.json (with the chat template), which Gyre's loaders and
// transformers read like any checkpoint. llama.cpp stores q_proj and k_proj with their rows
// permuted for its RoPE layout; the conversion permutes them back.

#include <cstdint>
#include <string>

#include "gyre/status.h"
#include "model/model_spec.h"

namespace gyre::model {

struct GgufConversion {
  ModelSpec spec;
  int64_t parameters = 0;
  std::string tensor_types;  // "Q4_1 x210, F32 x61, Q8_0 x1"
  int64_t vocab = 0;         // tokenizer tokens
};

// Writes `out_dir` (created if needed) from `gguf_path`. Errors name the file and what is missing
// or unsupported (another architecture, RoPE scaling, a tensor type, a tokenizer model); nothing
// is left in `out_dir` that a loader would take for a model when it fails.
StatusOr<GgufConversion> ConvertGgufToHf(const std::string& gguf_path, const std::string& out_dir);

}  // namespace gyre::model
