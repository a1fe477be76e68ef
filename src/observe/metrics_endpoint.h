#pragma once
// An HTTP endpoint for Prometheus and health checks (docs/observability.md):
//   GET /metrics  the process's gauges and counters in Prometheus' text exposition format
//                 (prometheus-cpp's registry and serializer);
//   GET /health   a JSON object from the owner's health callback; 200 when its "status" is "ok",
//                 503 otherwise (a load balancer or Kubernetes probe reads the code).
// Served by GNU libmicrohttpd on HOST:PORT (port 0: the system picks one; `address()` says
// which). (Not civetweb, prometheus-cpp's own server: its threads' fixed small stacks cannot
// hold the thread-local storage of a process that links libtorch, and pthread_create fails.)
//
// Thread contract: Set/Add/SetRefresh may be called from any thread, concurrently with scrapes.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "gyre/status.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Gauge;
class Counter;
}  // namespace prometheus

struct MHD_Daemon;
struct MHD_Connection;

namespace gyre::observe {

using MetricLabels = std::map<std::string, std::string>;

class MetricsEndpoint {
 public:
  // `address`: "HOST:PORT". `health` builds /health's body; it runs on the server's thread.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                          std::function<nlohmann::json()> health);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // A gauge `name` (with `help` on first use) at `labels` takes `value`.
  void Set(const std::string& name, const std::string& help, double value,
           const MetricLabels& labels = {});
  // A counter `name` (with `help` on first use; the name ends in _total) grows by `delta` >= 0.
  void Add(const std::string& name, const std::string& help, double delta,
           const MetricLabels& labels = {});
  // Called before each scrape, to set the gauges that describe the present (worker states).
  void SetRefresh(std::function<void(MetricsEndpoint*)> refresh);

  // The text a scrape of /metrics returns now.
  std::string Scrape();
  // "HOST:PORT" with the port actually bound.
  const std::string& address() const { return address_; }

  // Answers one request (called on the HTTP server's thread); returns libmicrohttpd's result.
  int Serve(MHD_Connection* conn, const char* url, const char* method);

 private:
  MetricsEndpoint();

  std::shared_ptr<prometheus::Registry> registry_;
  std::mutex mu_;  // the families, the refresh callback
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_;
  std::function<void(MetricsEndpoint*)> refresh_;
  std::function<nlohmann::json()> health_;
  std::mutex scrape_mu_;  // one refresh + serialisation at a time
  MHD_Daemon* daemon_ = nullptr;
  std::string address_;
};

// Splits "HOST:PORT" (HOST may be "[v6]"); an error names what is wrong.
Status ParseListenAddress(const std::string& address, std::string* host, int* port);

}  // namespace gyre::observe
