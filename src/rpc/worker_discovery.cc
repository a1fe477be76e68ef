#include "rpc/worker_discovery.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace gyre::rpc {

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

StatusOr<int> ParseWorkerIndex(const std::string& text, const std::string& source) {
  if (text.empty() || text.size() > 4 ||
      text.find_first_not_of("0123456789") != std::string::npos || std::stoi(text) > 4095) {
    return InvalidArgument(source + " = '" + text + "' is not a worker index (0 to 4095)");
  }
  return std::stoi(text);
}

std::string PrimaryHostAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf)) != nullptr) found = buf;
  }
  freeifaddrs(list);
  return found;
}

StatusOr<WorkerPlacement> DiscoverPlacement(const std::string& controller, int index,
                                            const std::string& bind_host,
                                            const std::string& advertise_host,
                                            const EnvLookup& env) {
  WorkerPlacement p;
  p.controller = controller;
  if (p.controller.empty()) {
    if (const char* c = env("GYRE_CONTROLLER"); c != nullptr && *c != '\0') p.controller = c;
  }
  if (p.controller.empty()) {
    return InvalidArgument(
        "the controller's address is needed: --controller HOST:PORT or $GYRE_CONTROLLER");
  }
  if (index >= 0) {
    p.index = index;
    p.index_source = "--index";
  } else {
    p.index_source = "default";
    for (const char* var : {"GYRE_WORKER_INDEX", "JOB_COMPLETION_INDEX", "SLURM_PROCID"}) {
      const char* v = env(var);
      if (v == nullptr || *v == '\0') continue;
      auto parsed = ParseWorkerIndex(v, std::string("$") + var);
      if (!parsed.ok()) return parsed.status();
      p.index = *parsed;
      p.index_source = var;
      break;
    }
  }
  p.advertise_host = advertise_host;
  if (p.advertise_host.empty()) {
    if (const char* a = env("GYRE_ADVERTISE_HOST"); a != nullptr && *a != '\0') {
      p.advertise_host = a;
    }
  }
  if (p.advertise_host.empty()) {
    const bool wildcard = bind_host == "0.0.0.0" || bind_host == "::" || bind_host == "[::]";
    p.advertise_host = wildcard ? PrimaryHostAddress() : bind_host;
    if (p.advertise_host.empty()) {
      return FailedPrecondition(
          "--bind-host " + bind_host +
          " listens everywhere, and this host has no non-loopback IPv4 address to give the "
          "controller: set --advertise-host (or $GYRE_ADVERTISE_HOST)");
    }
  }
  return p;
}

}  // namespace gyre::rpc
