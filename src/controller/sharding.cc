#include "controller/sharding.h"

#include <algorithm>
#include <numeric>

namespace gyre::controller {

DpShards ShardBatch(const std::vector<int64_t>& tokens, int ranks, int minis) {
  const size_t n = tokens.size();
  const size_t R = static_cast<size_t>(std::max(ranks, 1));
  const size_t M = static_cast<size_t>(std::max(minis, 1));
  DpShards out;
  out.samples.resize(R);
  out.mini_batch_sizes.assign(R, std::vector<int32_t>(M, 0));
  for (size_t m = 0; m < M; ++m) {
    const size_t begin = n * m / M, end = n * (m + 1) / M;
    std::vector<size_t> order(end - begin);
    std::iota(order.begin(), order.end(), begin);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tokens[a] > tokens[b]; });
    std::vector<int64_t> load(R, 0);
    std::vector<std::vector<size_t>> picked(R);
    for (size_t i : order) {
      const size_t r =
          static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[r] += tokens[i];
      picked[r].push_back(i);
    }
    for (size_t r = 0; r < R; ++r) {
      std::sort(picked[r].begin(), picked[r].end());
      out.samples[r].insert(out.samples[r].end(), picked[r].begin(), picked[r].end());
      out.mini_batch_sizes[r][m] = static_cast<int32_t>(picked[r].size());
    }
  }
  return out;
}

}  // namespace gyre::controller
