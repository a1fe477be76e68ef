#pragma once
// How a `gyre worker` started by a cluster launcher finds its place (docs/cluster.md): what its
// flags leave unset comes from the environment that Slurm, Kubernetes or a script sets.
//
//   controller address   --controller, else $GYRE_CONTROLLER
//   index                --index, else $GYRE_WORKER_INDEX, else $JOB_COMPLETION_INDEX (a
//                        Kubernetes Indexed Job), else $SLURM_PROCID (the task's rank in its srun
//                        step), else 0
//   advertised host      --advertise-host, else $GYRE_ADVERTISE_HOST, else --bind-host unless
//                        that is a wildcard (0.0.0.0, ::), in which case this host's first
//                        non-loopback IPv4 address
//
// Thread contract: plain functions; they read the process environment.

#include <functional>
#include <string>

#include "gyre/status.h"

namespace gyre::rpc {

// Reads an environment variable; nullptr when unset (tests pass their own).
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup ProcessEnvironment();

struct WorkerPlacement {
  std::string controller;  // HOST:PORT
  int index = 0;
  std::string index_source;    // "--index", "GYRE_WORKER_INDEX", ... or "default"
  std::string advertise_host;  // what the controller and peers dial
};

// `controller`, `index` (-1 = unset) and `advertise_host` are the flags' values ("" = unset).
StatusOr<WorkerPlacement> DiscoverPlacement(const std::string& controller, int index,
                                            const std::string& bind_host,
                                            const std::string& advertise_host,
                                            const EnvLookup& env);

// Parses a worker index (0 .. 4095) from `text`; `source` names where it came from in errors.
StatusOr<int> ParseWorkerIndex(const std::string& text, const std::string& source);

// This host's first non-loopback IPv4 address (by its host name), or "" if it has none.
std::string PrimaryHostAddress();

}  // namespace gyre::rpc
