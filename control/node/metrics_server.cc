#include "control/node/metrics_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

namespace uroce::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr std::size_t kMaxConns = 16;
constexpr std::size_t kMaxRequest = 8 * 1024;
constexpr auto kClientTime = std::chrono::seconds(5);

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(tcp::socket s, const std::function<std::string()>& render, std::shared_ptr<std::size_t> open,
       std::shared_ptr<std::uint64_t> scrapes)
      : stream(std::move(s)), render(render), open(std::move(open)), scrapes(std::move(scrapes)) {
    ++*this->open;
    parser.header_limit(kMaxRequest);
    parser.body_limit(kMaxRequest);
  }
  ~Conn() { --*open; }
  beast::tcp_stream stream;
  beast::flat_buffer buf{kMaxRequest};
  http::request_parser<http::string_body> parser;
  http::response<http::string_body> res;
  std::function<std::string()> render;  // a copy: a Conn may outlive its server in the io_context
  std::shared_ptr<std::size_t> open;
  std::shared_ptr<std::uint64_t> scrapes;

  void start() {
    stream.expires_after(kClientTime);
    http::async_read(stream, buf, parser, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec == http::error::end_of_stream) return self->close();
      if (ec == asio::error::operation_aborted || ec == beast::error::timeout) return self->close();
      if (ec) return self->reply(http::status::bad_request, "bad request\n", 11);
      self->answer();
    });
  }
  void answer() {
    const auto& req = parser.get();
    const int version = req.version();
    if (req.method() != http::verb::get && req.method() != http::verb::head)
      return reply(http::status::method_not_allowed, "only GET and HEAD\n", version);
    const std::string_view target(req.target().data(), req.target().size());
    if (target != "/metrics" && target.rfind("/metrics?", 0) != 0)
      return reply(http::status::not_found, "uroced serves /metrics only\n", version);
    ++*scrapes;
    std::string body = render();
    reply(http::status::ok, std::move(body), version, req.method() == http::verb::head);
  }
  void reply(http::status st, std::string body, int version, bool head = false) {
    res = {};
    res.version(version == 10 ? 10 : 11);
    res.result(st);
    res.set(http::field::server, "uroced");
    res.set(http::field::content_type, st == http::status::ok ? "text/plain; version=0.0.4; charset=utf-8"
                                                                : "text/plain; charset=utf-8");
    if (st == http::status::method_not_allowed) res.set(http::field::allow, "GET, HEAD");
    res.keep_alive(false);  // one request a connection: scrapes are seconds apart
    res.body() = std::move(body);
    res.prepare_payload();
    if (head) res.body().clear();  // Content-Length stays the GET's
    http::async_write(stream, res, [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
  }
  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
  }
};

}  // namespace

MetricsServer::MetricsServer(asio::io_context& io, const tcp::endpoint& ep, std::function<std::string()> render)
    : acceptor_(io), render_(std::move(render)), pause_(io) {
  acceptor_.open(ep.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  acceptor_.bind(ep);
  acceptor_.listen();
  accept();
}

bool MetricsServer::parse(const std::string& text, tcp::endpoint& out, std::string& why) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    why = "want ADDR:PORT (an IPv6 address in brackets), got '" + text.substr(0, 64) + "'";
    return false;
  }
  std::string addr = text.substr(0, colon);
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') addr = addr.substr(1, addr.size() - 2);
  const std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  const unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
  if (*end != '\0' || port == 0 || port > 65535) {
    why = "the port must be 1..65535, got '" + port_text.substr(0, 16) + "'";
    return false;
  }
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(addr, ec);
  if (ec) {
    why = "not an IP address: '" + addr.substr(0, 64) + "'";
    return false;
  }
  out = tcp::endpoint(ip, static_cast<std::uint16_t>(port));
  return true;
}

void MetricsServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted) return;
    // Out of descriptors or worse: shed, pause, accept again (no spin).
    if (guard_.retry_on_failure(ec, acceptor_.native_handle(), pause_, [this] { accept(); })) return;
    if (*open_ >= kMaxConns) {
      boost::system::error_code ignored;
      s.close(ignored);
    } else {
      std::make_shared<Conn>(std::move(s), render_, open_, scrapes_)->start();
    }
    accept();
  });
}

}  // namespace uroce::control
