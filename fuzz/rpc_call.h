#pragma once
// The one way the RPC fuzz targets call a handler: parse the payload as the request, let the
// target adjust it (keep it off the network, confine a path, skip over-budget work), and call
// the handler with a fresh ServerContext, as a server would. The handlers under test do not read
// their context.

#include <grpcpp/grpcpp.h>

#include <string>

namespace gyre::fuzz {

// Returns whether the handler ran. `adjust(&request)` returns false to skip the call.
template <typename Request, typename Response, typename Service, typename Method, typename Adjust>
bool CallHandler(Service* service, Method method, const std::string& payload, Adjust adjust) {
  Request request;
  if (!request.ParseFromString(payload) || !adjust(&request)) return false;
  Response response;
  grpc::ServerContext context;
  (void)(service->*method)(&context, &request, &response);
  return true;
}

template <typename Request, typename Response, typename Service, typename Method>
bool CallHandler(Service* service, Method method, const std::string& payload) {
  return CallHandler<Request, Response>(service, method, payload, [](Request*) { return true; });
}

}  // namespace gyre::fuzz
