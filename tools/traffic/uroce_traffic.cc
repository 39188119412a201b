// uroce-traffic: verified RC traffic between two processes, each hosting a
// node (the same options as uroced: --port, --vdev, --ip, ...) with the
// traffic generator as its stage on the engine directly, so no liburoce
// hop. The server waits for a client's TCP exchange; the client runs the
// messages and prints a summary; both exit 0 only if every payload checked.
//
//   uroce-traffic --role server --port net_memif0 --vdev ... --ip 10.0.0.1 --no-huge
//   uroce-traffic --role client --peer 127.0.0.1 --messages 1000 --size 4096
//                 --ops send,write,read,atomic --port net_memif1 --vdev ... --ip 10.0.0.2 --no-huge
//
// Every option can also come from a --config file.

#include <boost/program_options.hpp>
#include <string>

#include "control/node/node.h"
#include "control/node/options.h"
#include "tools/traffic/app.h"

using namespace uroce;
namespace po = boost::program_options;

int main(int argc, char** argv) {
  traffic::AppOptions ao;
  std::string role, ops;
  unsigned exchange_port = ao.port, mtu = 1024, timeout = ao.timeout, retry_cnt = ao.retry_cnt, pipeline = 0;
  po::options_description mine("uroce-traffic options");
  mine.add_options()("role", po::value(&role), "server or client (required)")
      ("peer", po::value(&ao.peer_host), "client: host of the server's TCP exchange")
      ("exchange-port", po::value(&exchange_port), "TCP port of the exchange (default 18515)")
      ("messages", po::value(&ao.messages), "client: messages to run (default 1000)")
      ("size", po::value(&ao.size), "message size in bytes, >= 8 (default 4096)")
      ("ops", po::value(&ops), "operations: send,write,read,atomic (default all)")
      ("depth", po::value(&ao.depth), "messages in flight (default 32)")
      ("forever", po::bool_switch(&ao.forever), "server: keep serving clients, one after another")
      ("pipeline", po::value(&pipeline), "which pipeline runs the traffic (default 0)")
      ("mtu", po::value(&mtu), "path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)")
      ("timeout", po::value(&timeout), "QP timeout exponent 0..31: 4.096 us * 2^timeout (default 14)")
      ("retry-cnt", po::value(&retry_cnt), "QP retry count 0..7 (default 7)")
      ("selective-repeat", po::bool_switch(&ao.selective_repeat),
       "IRN-style selective repeat on the QP (both ends must say so)");
  control::ExtraOptions extra;
  extra.desc = &mine;
  extra.check = [&](std::size_t pipelines) -> std::string {
    if (role == "server") ao.role = traffic::AppOptions::Role::kServer;
    else if (role == "client") ao.role = traffic::AppOptions::Role::kClient;
    else return "--role must be server or client";
    if (ao.role == traffic::AppOptions::Role::kClient && ao.peer_host.empty()) return "--role client needs --peer";
    if (ao.size < 8 || ao.size > (64u << 20)) return "--size must be 8 bytes .. 64 MiB";
    if (ao.depth == 0 || ao.depth > 1024) return "--depth must be 1..1024";
    if (exchange_port < 1 || exchange_port > 65535) return "--exchange-port must be 1..65535";
    if (mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096)
      return "--mtu must be 256, 512, 1024, 2048 or 4096";
    if (timeout > 31) return "--timeout must be 0..31";
    if (retry_cnt > 7) return "--retry-cnt must be 0..7";
    if (pipeline >= pipelines) return "--pipeline must be below the number of pipelines (" + std::to_string(pipelines) + ")";
    std::string err;
    if (!ops.empty() && !traffic::parse_ops(ops, ao.ops, err)) return "--ops: " + err;
    // Selective repeat carries every operation (READs and atomics go fenced),
    // so --selective-repeat takes any --ops: the WRITEs' read-back READs are
    // fenced by the app anyway, and fenced atomics keep their running value.
    ao.port = static_cast<std::uint16_t>(exchange_port);
    ao.mtu = static_cast<ibv_mtu>(__builtin_ctz(mtu) - 7);
    ao.timeout = static_cast<std::uint8_t>(timeout);
    ao.retry_cnt = static_cast<std::uint8_t>(retry_cnt);
    return "";
  };
  return control::host_main("uroce-traffic", argc, argv, extra, [&] {
    control::StageSpec stage;
    stage.pipeline = pipeline;
    stage.make = [&ao](transport::Engine& eng, pipeline::Dataplane& dp) {
      return std::make_unique<traffic::TrafficApp>(eng, dp, ao);
    };
    return stage;
  });
}
