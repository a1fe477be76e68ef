#include "controller/sharding.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace gyre::controller {

DpShards ShardBatch(const std::vector<int64_t>& tokens, int ranks, int minis,
                    const std::vector<uint64_t>& groups) {
  const size_t n = tokens.size();
  const size_t R = static_cast<size_t>(std::max(ranks, 1));
  const size_t M = static_cast<size_t>(std::max(minis, 1));
  const bool keyed = groups.size() == n;
  DpShards out;
  out.samples.resize(R);
  out.mini_batch_sizes.assign(R, std::vector<int32_t>(M, 0));
  for (size_t m = 0; m < M; ++m) {
    const size_t begin = n * m / M, end = n * (m + 1) / M;
    // The units placed: whole groups (in order of first appearance), or single samples.
    std::vector<std::vector<size_t>> units;
    if (keyed) {
      std::map<uint64_t, size_t> unit_of;
      for (size_t i = begin; i < end; ++i) {
        auto [it, added] = unit_of.emplace(groups[i], units.size());
        if (added) units.emplace_back();
        units[it->second].push_back(i);
      }
      if (units.size() < 2 * R) units.clear();
    }
    if (units.empty()) {
      for (size_t i = begin; i < end; ++i) units.push_back({i});
    }
    std::vector<int64_t> cost(units.size(), 0);
    for (size_t u = 0; u < units.size(); ++u) {
      for (size_t i : units[u]) cost[u] += tokens[i];
    }
    std::vector<size_t> order(units.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost[a] > cost[b]; });
    std::vector<int64_t> load(R, 0);
    std::vector<std::vector<size_t>> picked(R);
    for (size_t u : order) {
      const size_t r =
          static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[r] += cost[u];
      picked[r].insert(picked[r].end(), units[u].begin(), units[u].end());
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
