#pragma once
// gyre_torch: for programs that train with libtorch (docs/embedding.md). Link the CMake target
// gyre_torch (it brings libtorch). Two things: Gyre's policy loss as an autograd-ready tensor
// (PolicyLoss below), and policy losses of your own registered by name for Gyre's trainer.
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

#include "gyre/algorithms.h"
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
// for listings. The name must be new (not a built-in policy loss: docs/algorithms.md), lower case
// letters, digits and '_'. Errors name what to fix.
Status RegisterPolicyLoss(const std::string& name, const std::string& formula, TokenLossFn fn);

// Gyre's policy loss on tensors, autograd-ready: `loss` is a scalar whose value is the loss
// and whose gradient with respect to logp is the kernel's exact d loss / d logp (CUDA tensors
// go to the CUDA kernel, CPU tensors to the reference), so loss.backward() trains a libtorch
// model like Gyre's trainer does. All tensors float32 [sequences, tokens]; logp_rollout and
// logp_ref only when the options' correction / kl need them (else undefined).
struct TensorPolicyLoss {
  at::Tensor loss;
  PolicyLossValue value;  // the statistics (clip fraction, KL, ...)
};
StatusOr<TensorPolicyLoss> PolicyLoss(const at::Tensor& logp, const at::Tensor& logp_old,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const PolicyLossOptions& options,
                                      const at::Tensor& logp_rollout = at::Tensor(),
                                      const at::Tensor& logp_ref = at::Tensor());

}  // namespace gyre
