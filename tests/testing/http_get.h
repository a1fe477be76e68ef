#pragma once
// A plain HTTP GET with libcurl, for tests of Gyre's HTTP endpoints (/metrics, /health).

#include <curl/curl.h>

#include <memory>
#include <string>
#include <utility>

namespace gyre::testing {

struct HttpReply {
  int code = 0;  // 0: no connection or no reply
  std::string body;
};

// GET http://`address``path`, where `address` is "HOST:PORT". Always direct: a proxy set in the
// environment (http_proxy, ...) is not used. Blocks until the server has answered or closed.
inline HttpReply HttpGet(const std::string& address, const std::string& path) {
  // Once per process, before any thread calls curl_easy_init (which would otherwise do it, not
  // thread-safely).
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  HttpReply r;
  if (!initialised) return r;
  const std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (curl == nullptr) return r;
  const std::string url = "http://" + address + path;
  auto append = +[](char* data, size_t size, size_t n, void* body) -> size_t {
    static_cast<std::string*>(body)->append(data, size * n);
    return size * n;
  };
  std::string body;
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, append);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &body);
  if (curl_easy_perform(curl.get()) != CURLE_OK) return r;
  long code = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &code);
  r.code = static_cast<int>(code);
  r.body = std::move(body);
  return r;
}

}  // namespace gyre::testing
