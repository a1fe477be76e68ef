#include "trainer/user_losses.h"

#include <map>
#include <mutex>

#include "algorithm/registry.h"

namespace gyre {
namespace {

std::mutex& Mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::map<std::string, TokenLossFn>& Losses() {
  static auto* losses = new std::map<std::string, TokenLossFn>;
  return *losses;
}

}  // namespace

Status RegisterPolicyLoss(const std::string& name, const std::string& formula, TokenLossFn fn) {
  if (!fn) return InvalidArgument("RegisterPolicyLoss: '" + name + "' has no function");
  algorithm::AlgorithmInfo info;
  info.family = algorithm::Family::kPolicyLoss;
  info.name = name;
  info.formula = formula;
  // The name's checks (format, uniqueness against built-ins and earlier registrations).
  GYRE_RETURN_IF_ERROR(algorithm::RegisterAlgorithmName(info).WithContext("RegisterPolicyLoss"));
  std::lock_guard<std::mutex> lock(Mutex());
  Losses()[name] = std::move(fn);
  return Status::Ok();
}

namespace trainer {

const TokenLossFn* FindUserPolicyLoss(const std::string& name) {
  std::lock_guard<std::mutex> lock(Mutex());
  auto it = Losses().find(name);
  return it == Losses().end() ? nullptr : &it->second;
}

}  // namespace trainer
}  // namespace gyre
