// The Prometheus endpoint (--metrics ADDR:PORT): HTTP/1.1 GET /metrics over
// Boost.Beast, on the control plane's io_context, never on a data path. Each
// scrape renders the node's status (metrics.h) when it is asked for. A
// client gets 5 s for its request and the reply; requests over 8 KiB, a
// method other than GET or HEAD, or another path are answered with an
// error and closed; past 16 connections at once a new one is closed at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio.hpp>

#include "control/node/accept_guard.h"

namespace uroce::control {

class MetricsServer {
 public:
  /// Listens on `endpoint` ("ADDR:PORT", IPv4 or [IPv6]); throws what Asio
  /// throws when it cannot.
  MetricsServer(boost::asio::io_context& io, const boost::asio::ip::tcp::endpoint& endpoint,
                std::function<std::string()> render);
  [[nodiscard]] std::uint64_t scrapes() const { return *scrapes_; }
  [[nodiscard]] std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  /// "ADDR:PORT" (IPv4, or IPv6 in brackets) as an endpoint; false and a
  /// reason if it is not one.
  static bool parse(const std::string& text, boost::asio::ip::tcp::endpoint& out, std::string& why);

 private:
  void accept();
  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  AcceptGuard guard_;
  boost::asio::steady_timer pause_;
  std::shared_ptr<std::size_t> open_ = std::make_shared<std::size_t>(0);
  std::shared_ptr<std::uint64_t> scrapes_ = std::make_shared<std::uint64_t>(0);
};

}  // namespace uroce::control
