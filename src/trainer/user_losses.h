#pragma once
// The policy losses an embedding program registered (include_torch/gyre/torch.h), by name.
//
// Thread contract: registration at start-up; lookups from any thread afterwards.

#include <string>

#include "gyre/torch.h"

namespace gyre::trainer {

// The registered loss `name`, or null.
const TokenLossFn* FindUserPolicyLoss(const std::string& name);

}  // namespace gyre::trainer
