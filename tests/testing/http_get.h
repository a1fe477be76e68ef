#pragma once
// A minimal HTTP/1.1 GET over a real TCP socket, for tests of Gyre's HTTP endpoints.

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace gyre::testing {

struct HttpReply {
  int code = 0;  // 0: no connection or no reply
  std::string body;
};

// GET http://`address``path`, where `address` is "HOST:PORT".
inline HttpReply HttpGet(const std::string& address, const std::string& path) {
  HttpReply r;
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return r;
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return r;
  }
  freeaddrinfo(res);
  const std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\nConnection: close\r\n\r\n";
  if (send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  if (raw.compare(0, 5, "HTTP/") != 0) return r;
  r.code = std::atoi(raw.c_str() + raw.find(' ') + 1);
  const size_t split = raw.find("\r\n\r\n");
  if (split != std::string::npos) r.body = raw.substr(split + 4);
  return r;
}

}  // namespace gyre::testing
