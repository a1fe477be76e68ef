#include "controller/batch_source.h"

#include "controller/async_batch_source.h"
#include "controller/sync_batch_source.h"

namespace gyre::controller {

std::unique_ptr<BatchSource> MakeBatchSource(JobState* job) {
  if (job->cfg.rollout.async) return std::make_unique<AsyncBatchSource>(job);
  return std::make_unique<SyncBatchSource>(job);
}

}  // namespace gyre::controller
