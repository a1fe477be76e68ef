#include "model/hf_model.h"

#include <exception>
#include <vector>

#include "common/logging.h"
#include "common/strings.h"
#include "model/safetensors.h"

namespace gyre::model {

StatusOr<std::unique_ptr<Transformer>> LoadHfModel(const std::string& dir, int64_t max_seq_len) {
  GYRE_ASSIGN_OR_RETURN(ModelSpec spec, LoadHfConfig(dir));
  GYRE_ASSIGN_OR_RETURN(spec.max_seq_len,
                        EffectiveMaxSeqLen(spec, max_seq_len, dir + "/config.json"));
  GYRE_RETURN_IF_ERROR(CheckModelSize(spec, dir + "/config.json"));
  GYRE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(dir));
  std::unique_ptr<Transformer> model;
  try {
    model = Transformer::Create(spec, 0, /*init_std=*/-1.0);  // weights come from disk
  } catch (const std::exception& e) {  // c10::Error or bad_alloc: still too big for what is free
    return InvalidArgument(dir + "/config.json: cannot allocate the model (" +
                           HumanBytes(EstimateParameterCount(spec) * 4.0) +
                           " of float32 parameters): " + FirstLine(e.what()));
  }
  std::vector<std::string> ignorable;
  if (spec.tie_embeddings) ignorable.push_back("lm_head.weight");
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    ignorable.push_back("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
  }
  GYRE_RETURN_IF_ERROR(LoadParameters(*ckpt, model->NamedParameters(), ignorable).WithContext(dir));
  return model;
}

}  // namespace gyre::model
