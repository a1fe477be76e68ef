#pragma once
// The problems of a job's data section, for a program that trains with its own loop: the
// built-in tasks (multi-digit addition, copy) or a JSONL dataset, drawn reproducibly from a
// seed, with the held-out set drawn from data.eval_seed and kept out of the training stream; and
// the built-in verifier. A job (RunJob) uses exactly these.
//
//   auto problems = *gyre::ProblemStream::Open(config.data, config.job.seed);
//   gyre::Problem p = problems->Next();   // {"37+5=", "42"}
//   auto verifier = gyre::ExactMatchVerifier();
//
// Thread contract: a ProblemStream is used by one thread at a time; the verifier is stateless.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gyre/config.h"
#include "gyre/reward.h"
#include "gyre/status.h"

namespace gyre {

struct Problem {
  std::string prompt;  // text (a dataset may give a JSON list of chat messages instead)
  std::string answer;
};

class ProblemStream {
 public:
  // Builds the stream for `data` (data.task and its ranges, or data.train_path / eval_path).
  // Errors name the file and line of a bad record.
  static StatusOr<std::unique_ptr<ProblemStream>> Open(const DataSection& data, uint64_t seed);
  ~ProblemStream();
  ProblemStream(const ProblemStream&) = delete;
  ProblemStream& operator=(const ProblemStream&) = delete;

  // The next training problem (endless: a dataset starts over at its end).
  Problem Next();
  // The held-out problems (data.eval_size of them, or data.eval_path's).
  const std::vector<Problem>& held_out() const;

 private:
  class Impl;
  explicit ProblemStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The built-in verifier (reward.type: builtin): 1 when the response, trimmed, equals the
// answer, trimmed, and the response ended with a stop token; else 0.
std::shared_ptr<RewardFn> ExactMatchVerifier();

}  // namespace gyre
