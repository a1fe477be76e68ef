#pragma once
// How widely rollout workers relay a published version among themselves over gRPC
// (cluster.weight_relay_fanout; docs/weight-sync.md, "Peer relay").
//
// The trainer's uplink carries one copy per worker it sends to. With fan-out F the trainer sends
// F copies; then, round after round, every worker holding the version sends it to up to F that do
// not. A copy costs the trainer `trainer_copy_s` and a relaying worker `relay_copy_s`; copies from
// one sender go one after another (one uplink), senders work in parallel. Direct sending
// (F = 0) takes receivers * trainer_copy_s; F = 1 takes about (1 + log2(receivers)) copies' time.
// The job may fix F; otherwise (weight_relay_fanout: -1, the default) the publisher picks the F
// with the least estimated time from the number of receivers and what the last publishes
// measured of the two per-copy times (equal until measured).
//
// Thread-safety: none; the publisher uses it from the job thread.

#include <cstdint>

namespace gyre::controller {

// Estimated seconds for a publish to `receivers` workers with fan-out `fanout` (0 = the trainer
// sends every copy itself; fanout >= receivers is the same).
double RelayPublishSeconds(int64_t receivers, int64_t fanout, double trainer_copy_s,
                           double relay_copy_s);

// The fan-out in [0, max_fanout] with the least RelayPublishSeconds; on a tie the smaller one
// (0 first: no relay when it gains nothing, as with up to 3 receivers and equal links).
int ChooseRelayFanout(int64_t receivers, double trainer_copy_s, double relay_copy_s,
                      int max_fanout = 64);

// Per-copy times measured from publishes: the trainer's (a direct phase's seconds over its
// copies) and a relaying worker's (a round's seconds over the copies of its busiest sender),
// each the mean of the last few (an exponential average, weight 1/2 on the newest). A phase's
// seconds include a fixed cost per call (the RPC, the controller's bookkeeping) besides the
// copies, which a per-copy figure spreads over fewer copies the smaller the phase; the publisher
// therefore reports only relay rounds in which the busiest sender made as many copies as the
// trainer did (full rounds), so that both figures carry that cost alike.
class RelayPlanner {
 public:
  void ObserveTrainer(double seconds, int64_t copies);
  void ObserveRelay(double seconds, int64_t copies);
  // The fan-out for `receivers`: what ChooseRelayFanout gives for the measured times, taking
  // either one as equal to the other until it is measured (both unmeasured: equal links). The
  // planner keeps its last choice for the same number of receivers unless the new one is
  // estimated at least 10% quicker, so that measurement noise does not make it flap.
  int Choose(int64_t receivers);

  double trainer_copy_s() const { return trainer_copy_s_; }  // 0 = not measured yet
  double relay_copy_s() const { return relay_copy_s_; }

 private:
  double trainer_copy_s_ = 0;
  double relay_copy_s_ = 0;
  int64_t last_receivers_ = -1;  // of the last Choose
  int last_fanout_ = 0;
};

}  // namespace gyre::controller
