#include "observe/metrics_endpoint.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>

#include <cstring>

#include "common/strings.h"

namespace gyre::observe {

namespace {

int Reply(MHD_Connection* conn, unsigned code, const char* mime, const std::string& body) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, mime);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  const MHD_Result ok = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ok;
}

// libmicrohttpd calls once with a request's headers, then with its (empty) body: the second
// call answers.
MHD_Result HandleRequest(void* self, MHD_Connection* conn, const char* url, const char* method,
                         const char*, const char*, size_t* upload_data_size, void** state) {
  static int headers_seen;
  if (*state == nullptr) {
    *state = &headers_seen;
    return MHD_YES;
  }
  *upload_data_size = 0;
  return static_cast<MHD_Result>(static_cast<MetricsEndpoint*>(self)->Serve(conn, url, method));
}

}  // namespace

Status ParseListenAddress(const std::string& address, std::string* host, int* port) {
  if (!ParseHostPort(address, host, port)) {
    return InvalidArgument("listen address '" + address +
                           "' is not HOST:PORT with a port from 0 to 65535 (e.g. 127.0.0.1:9400)");
  }
  return Status::Ok();
}

MetricsEndpoint::MetricsEndpoint() : registry_(std::make_shared<prometheus::Registry>()) {}

MetricsEndpoint::~MetricsEndpoint() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::function<nlohmann::json()> health) {
  std::string host;
  int port = 0;
  GYRE_RETURN_IF_ERROR(ParseListenAddress(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string bind_host = host == "*" ? "0.0.0.0" : host;
  if (const int rc = getaddrinfo(bind_host.c_str(), std::to_string(port).c_str(), &hints, &res);
      rc != 0) {
    return InvalidArgument("listen address '" + address + "': host '" + host +
                           "' does not resolve (" + gai_strerror(rc) + ")");
  }
  std::unique_ptr<MetricsEndpoint> ep(new MetricsEndpoint());
  ep->health_ = std::move(health);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
  if (res->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  ep->daemon_ = MHD_start_daemon(flags, static_cast<uint16_t>(port), nullptr, nullptr,
                                 &HandleRequest, ep.get(), MHD_OPTION_SOCK_ADDR, res->ai_addr,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_END);
  const int err = errno;
  freeaddrinfo(res);
  if (ep->daemon_ == nullptr) {
    return Unavailable("cannot serve /metrics on " + address + ": " +
                       (err != 0 ? std::strerror(err) : "libmicrohttpd failed to start") +
                       " (is the port in use, or the address not one of this host's?)");
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(ep->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  const int bound = info != nullptr ? info->port : port;
  ep->address_ = host + ":" + std::to_string(bound);
  return ep;
}

void MetricsEndpoint::Set(const std::string& name, const std::string& help, double value,
                          const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = gauges_.find(name);
  if (it == gauges_.end()) {
    auto& family = prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
    it = gauges_.emplace(name, &family).first;
  }
  it->second->Add(labels).Set(value);
}

void MetricsEndpoint::Add(const std::string& name, const std::string& help, double delta,
                          const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counters_.find(name);
  if (it == counters_.end()) {
    auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
    it = counters_.emplace(name, &family).first;
  }
  if (delta > 0) {
    it->second->Add(labels).Increment(delta);
  } else {
    (void)it->second->Add(labels);  // exists from now on, at 0
  }
}

void MetricsEndpoint::SetRefresh(std::function<void(MetricsEndpoint*)> refresh) {
  std::lock_guard<std::mutex> lock(mu_);
  refresh_ = std::move(refresh);
}

std::string MetricsEndpoint::Scrape() {
  std::lock_guard<std::mutex> scrape(scrape_mu_);
  std::function<void(MetricsEndpoint*)> refresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refresh = refresh_;
  }
  if (refresh) refresh(this);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

int MetricsEndpoint::Serve(MHD_Connection* conn, const char* url, const char* method) {
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
    return Reply(conn, 405, "text/plain", "only GET\n");
  }
  const std::string path = url;
  if (path == "/metrics") {
    return Reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", Scrape());
  }
  if (path == "/health") {
    nlohmann::json h = health_ ? health_() : nlohmann::json{{"status", "ok"}};
    const bool ok = h.value("status", "") == "ok";
    return Reply(conn, ok ? 200 : 503, "application/json", h.dump() + "\n");
  }
  return Reply(conn, 404, "text/plain", "not found: try /metrics or /health\n");
}

}  // namespace gyre::observe
