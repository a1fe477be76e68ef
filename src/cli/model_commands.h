#pragma once
// `gyre` subcommands that work on a model directory directly (no controller, no workers).

#include <string>
#include <vector>

namespace gyre::cli {

// gyre logprobs --model DIR [--ids "1 2 3"] [--full]
// For each token sequence (from --ids, else one JSON array per stdin line) prints one JSON
// object per line: {"ids": [...], "logprobs": [...]} where logprobs[t] is the log-probability
// of ids[t + 1] given ids[0..t]; with --full also "full": the whole log-softmax per position.
int RunLogprobs(const std::vector<std::string>& args);

}  // namespace gyre::cli
