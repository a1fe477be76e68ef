#pragma once
// gyre_torch: for programs that train with libtorch (docs/embedding.md). Link the CMake target
// gyre_torch (it brings libtorch).
//
// A policy loss of your own, written with torch ops and differentiated by autograd, registered
// by name before the job starts (and, in a program that serves as its own worker binary, before
// gyre::MaybeRunWorker, so the trainer workers have it too):
//
//   gyre::RegisterPolicyLoss("reinforce", "-A logp", [](const gyre::TokenLossInputs& in) {
//     return -in.advantages * in.logp;  // per token; Gyre masks and aggregates it
//   });
//   ... algorithm.policy_loss: reinforce in the job file.
//
// Thread contract: register at start-up, before any job or trainer uses the name; the
// registered functions are then called from the trainer's thread.

#include <ATen/ATen.h>  // the tensor ops a loss is written with

#include <functional>
#include <string>

#include "gyre/status.h"

namespace gyre {

// A micro-batch's per-token terms: [sequences, tokens] float32 tensors on the model's device.
struct TokenLossInputs {
  at::Tensor logp;          // the policy being trained (requires grad)
  at::Tensor logp_old;      // the proximal policy the ratio is taken against (no grad)
  at::Tensor logp_rollout;  // the behaviour policy (the rollout engine's; no grad)
  at::Tensor advantages;
  at::Tensor mask;  // 1 = a token the model generated, 0 = padding or environment
  float clip_eps_low = 0.2f;
  float clip_eps_high = 0.28f;
};

// Returns the loss of every token, shaped like logp. Gyre multiplies it by the mask, aggregates
// it with algorithm.loss_agg's weights over the whole batch (all micro-batches and ranks), adds
// the KL term and the entropy bonus when configured, and backpropagates through autograd. It
// must not depend on masked-out tokens (they may hold any value).
using TokenLossFn = std::function<at::Tensor(const TokenLossInputs&)>;

// Registers `fn` as the policy loss `name` (algorithm.policy_loss), with a one-line `formula`
// for listings. The name must be new (not a built-in: ppo, gspo, cispo, sao), lower case
// letters, digits and '_'. Errors name what to fix.
Status RegisterPolicyLoss(const std::string& name, const std::string& formula, TokenLossFn fn);

}  // namespace gyre
