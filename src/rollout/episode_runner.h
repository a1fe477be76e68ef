#pragma once
// EpisodeRunner: multi-turn rollouts against an environment server (docs/agents.md).
//
// An episode starts with the environment's Reset: its opening messages (and tool definitions)
// are rendered with the model's chat template into the prompt. The model then answers turn by
// turn. A turn ends on a stop token; its text is parsed for tool calls and sent to the
// environment's Step, and the observation that comes back is appended to the trajectory as
// tokens with loss mask 0, after which the model continues. Token in, token out: the model's own
// ids are never decoded and re-encoded into the trajectory; only the environment's part is
// rendered (the text the chat template puts between the end of the model's turn and the start of
// its next one) and encoded. The KV of a finished turn stays parked in the engine and the next
// turn computes only the new tokens (RolloutEngine's park_on_finish).
//
// Environment calls run on threads of their own: while one episode waits for its environment the
// engine keeps decoding the others. An episode ends when the environment says terminated or
// truncated, or at a limit (turns, tokens, wall time), or when its environment fails (an error,
// a deadline, a server that died and lost the session): then it ends truncated with the reason in
// `status`, and the other episodes go on.
//
// Thread contract: Run() drives the engine from the calling thread (the engine is not
// thread-safe); the environment client is called from the runner's threads.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "agent/env_client.h"
#include "gyre/status.h"
#include "rollout/rollout_engine.h"
#include "text/episode_chat.h"
#include "text/tool_calls.h"

namespace gyre::rollout {

struct EpisodeOptions {
  // Per turn: temperature, truncation, and the stop tokens that end a turn. max_new_tokens
  // bounds the whole trajectory after the prompt (the model's tokens and the environment's).
  SamplingOptions sampling;
  int max_turns = 8;               // model turns per episode
  double episode_timeout_s = 300;  // wall time per episode, from its Reset
  int env_concurrency = 16;        // environment calls in flight
  text::ToolCallFormat tool_format = text::ToolCallFormat::kHermes;
  // The text the chat template writes where the model's stop token ends a turn (e.g.
  // "<|im_end|>" for ChatML), so that what the template adds after it is inserted and what the
  // model generated is not. Empty when the stop token has no text in the template (EOS).
  std::string end_of_turn_text;
  int32_t bos_id = -1;  // prepended to every prompt when >= 0 (the tokenizer's BOS)
};

// messages (JSON array), tools (JSON array or ""), add_generation_prompt -> the template's text.
using RenderFn = text::ChatRenderFn;
using EncodeFn = std::function<StatusOr<std::vector<int32_t>>(const std::string& text)>;
using DecodeFn = std::function<std::string(const std::vector<int32_t>& ids)>;

// One turn of an episode: the model's tokens are response[begin, end), the environment's that
// follow are response[end, observation_end).
struct TurnRecord {
  int64_t begin = 0, end = 0, observation_end = 0;
  double reward = 0;
};

struct Episode {
  // Set by the caller.
  uint64_t id = 0;     // unique within the job: names the environment session
  uint64_t group = 0;  // GRPO group
  uint64_t seed = 0;   // sampling stream (and the environment's seed)
  std::string task_json;
  // Filled by Run().
  std::vector<int32_t> prompt;
  Response response;             // every token after the prompt, the model's and the env's
  std::vector<float> loss_mask;  // per response token: 1 = the model's, 0 = inserted
  std::vector<TurnRecord> turns;
  double reward = 0;        // sum of the environment's step rewards
  bool terminated = false;  // the environment ended the task
  bool truncated = false;   // anything else ended it (see status)
  std::string status;       // why it was truncated ("" when terminated)
  bool failed = false;      // no usable trajectory (the Reset failed)
  // The episode ended because its environment failed (an error, a deadline, a dead server) or
  // its messages could not be rendered, rather than by the task or a limit: its reward is not
  // the task's.
  bool env_error = false;
};

class EpisodeRunner {
 public:
  EpisodeRunner(RolloutEngine* engine, agent::EnvClient* env, RenderFn render, EncodeFn encode,
                DecodeFn decode, EpisodeOptions options)
      : engine_(engine),
        env_(env),
        render_(std::move(render)),
        encode_(std::move(encode)),
        decode_(std::move(decode)),
        options_(std::move(options)) {}

  // Runs every episode to its end on an idle engine; returns them in the given order. An error
  // only when the engine fails (then nothing is returned); environment failures end their
  // episodes instead. Parked KV is cleared at the end.
  StatusOr<std::vector<Episode>> Run(std::vector<Episode> episodes);

 private:
  RolloutEngine* engine_;
  agent::EnvClient* env_;
  RenderFn render_;
  EncodeFn encode_;
  DecodeFn decode_;
  const EpisodeOptions options_;
};

}  // namespace gyre::rollout
