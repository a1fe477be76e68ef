#include "controller/relay_plan.h"

#include <algorithm>

namespace gyre::controller {

double RelayPublishSeconds(int64_t receivers, int64_t fanout, double trainer_copy_s,
                           double relay_copy_s) {
  if (receivers <= 0) return 0;
  if (fanout <= 0 || fanout >= receivers) return static_cast<double>(receivers) * trainer_copy_s;
  double seconds = static_cast<double>(fanout) * trainer_copy_s;
  int64_t holders = fanout;
  int64_t waiting = receivers - fanout;
  while (waiting > 0) {
    // Every holder sends up to `fanout` copies; the round lasts as long as the busiest sender.
    const int64_t per_sender = std::min(fanout, (waiting + holders - 1) / holders);
    const int64_t sent = std::min(waiting, per_sender * holders);
    seconds += static_cast<double>(per_sender) * relay_copy_s;
    holders += sent;
    waiting -= sent;
  }
  return seconds;
}

int ChooseRelayFanout(int64_t receivers, double trainer_copy_s, double relay_copy_s,
                      int max_fanout) {
  int best = 0;
  double best_s = RelayPublishSeconds(receivers, 0, trainer_copy_s, relay_copy_s);
  const int64_t top = std::min<int64_t>(max_fanout, receivers - 1);
  for (int64_t f = 1; f <= top; ++f) {
    const double s = RelayPublishSeconds(receivers, f, trainer_copy_s, relay_copy_s);
    // Strictly better by more than rounding: ties keep the smaller fan-out.
    if (s < best_s * (1 - 1e-9)) {
      best = static_cast<int>(f);
      best_s = s;
    }
  }
  return best;
}

namespace {

void Average(double* estimate, double seconds, int64_t copies) {
  if (copies <= 0 || !(seconds >= 0)) return;
  const double per_copy = seconds / static_cast<double>(copies);
  *estimate = *estimate > 0 ? 0.5 * (*estimate + per_copy) : per_copy;
}

}  // namespace

void RelayPlanner::ObserveTrainer(double seconds, int64_t copies) {
  Average(&trainer_copy_s_, seconds, copies);
}

void RelayPlanner::ObserveRelay(double seconds, int64_t copies) {
  Average(&relay_copy_s_, seconds, copies);
}

int RelayPlanner::Choose(int64_t receivers) {
  double trainer = trainer_copy_s_, relay = relay_copy_s_;
  if (trainer <= 0 && relay <= 0) trainer = relay = 1;
  if (trainer <= 0) trainer = relay;
  if (relay <= 0) relay = trainer;
  int fanout = ChooseRelayFanout(receivers, trainer, relay);
  if (receivers == last_receivers_ && fanout != last_fanout_) {
    const double kept = RelayPublishSeconds(receivers, last_fanout_, trainer, relay);
    const double chosen = RelayPublishSeconds(receivers, fanout, trainer, relay);
    if (chosen > 0.9 * kept) fanout = last_fanout_;
  }
  last_receivers_ = receivers;
  last_fanout_ = fanout;
  return fanout;
}

}  // namespace gyre::controller
