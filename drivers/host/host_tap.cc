#include "drivers/host/host_tap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace uroce::host {
namespace {

std::string sys_err(const std::string& what) { return what + ": " + std::strerror(errno); }

/// The kernel's IPv6 address request (linux/ipv6.h's in6_ifreq; that header
/// clashes with netinet/in.h).
struct In6Ifreq {
  in6_addr addr;
  std::uint32_t prefixlen;
  int ifindex;
};

/// Sets one of the netdev's sysctls (/proc/sys/net/ipv6/conf/NAME/KEY).
bool ipv6_conf(const std::string& name, const char* key, const char* value) {
  std::ofstream f("/proc/sys/net/ipv6/conf/" + name + "/" + key);
  return static_cast<bool>(f << value);
}

}  // namespace

std::unique_ptr<HostTap> HostTap::open(const TapOptions& o, std::string& err) {
  if (o.name.empty() || o.name.size() >= IFNAMSIZ) {
    err = "the host netdev's name must be 1.." + std::to_string(IFNAMSIZ - 1) + " bytes, got '" + o.name + "'";
    return nullptr;
  }
  const bool v4 = o.ip.is_v4_mapped();
  if (o.prefix > (v4 ? 32u : 128u)) {
    err = "the address's prefix length is over " + std::to_string(v4 ? 32 : 128);
    return nullptr;
  }
  std::unique_ptr<HostTap> t(new HostTap());
  t->mac_ = o.mac;
  t->fd_ = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (t->fd_ < 0) {
    err = sys_err("cannot open /dev/net/tun (the host netdev needs the tun module and CAP_NET_ADMIN)");
    return nullptr;
  }
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  std::memcpy(ifr.ifr_name, o.name.data(), o.name.size());
  if (::ioctl(t->fd_, TUNSETIFF, &ifr) != 0) {
    err = errno == EBUSY ? "a netdev named " + o.name + " exists and is in use (another node's?); name another with --host-netdev"
                         : sys_err("cannot create the TAP netdev " + o.name + " (a netdev of another kind may have that name)");
    return nullptr;
  }
  t->name_.assign(ifr.ifr_name, ::strnlen(ifr.ifr_name, IFNAMSIZ));
  const int s = ::socket(v4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    err = sys_err("socket for the host netdev's setup");
    return nullptr;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{s};
  auto req = [&] {
    ifreq r{};
    std::memcpy(r.ifr_name, t->name_.data(), t->name_.size());
    return r;
  };
  ifr = req();
  ifr.ifr_hwaddr.sa_family = ARPHRD_ETHER;
  std::memcpy(ifr.ifr_hwaddr.sa_data, o.mac.data(), 6);
  if (::ioctl(s, SIOCSIFHWADDR, &ifr) != 0) {
    err = sys_err("cannot give " + t->name_ + " the port's MAC");
    return nullptr;
  }
  if (o.mtu) {
    ifr = req();
    ifr.ifr_mtu = static_cast<int>(o.mtu);
    if (::ioctl(s, SIOCSIFMTU, &ifr) != 0) {
      err = sys_err("cannot set " + t->name_ + "'s MTU to " + std::to_string(o.mtu));
      return nullptr;
    }
  }
  if (v4) {
    ifr = req();
    auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
    sin->sin_family = AF_INET;
    std::memcpy(&sin->sin_addr, o.ip.v4(), 4);
    if (::ioctl(s, SIOCSIFADDR, &ifr) != 0) {
      err = sys_err("cannot give " + t->name_ + " the address " + o.ip.to_string());
      return nullptr;
    }
    const unsigned len = o.prefix ? o.prefix : 32;
    ifr = req();
    sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_netmask);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(len == 0 ? 0 : ~std::uint32_t{0} << (32 - len));
    if (::ioctl(s, SIOCSIFNETMASK, &ifr) != 0) {
      err = sys_err("cannot set " + t->name_ + "'s netmask");
      return nullptr;
    }
  }
  ifr = req();
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
    err = sys_err("cannot read " + t->name_ + "'s flags");
    return nullptr;
  }
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) {
    err = sys_err("cannot bring " + t->name_ + " up");
    return nullptr;
  }
  if (!v4) {
    // The node already owns the address: no duplicate detection, so the
    // kernel can bind it at once (a tentative address cannot be bound).
    ipv6_conf(t->name_, "accept_dad", "0");
    ifr = req();
    if (::ioctl(s, SIOCGIFINDEX, &ifr) != 0) {
      err = sys_err("cannot read " + t->name_ + "'s index");
      return nullptr;
    }
    In6Ifreq r6{};
    std::memcpy(&r6.addr, o.ip.b.data(), 16);
    r6.prefixlen = o.prefix ? o.prefix : 128;
    r6.ifindex = ifr.ifr_ifindex;
    if (::ioctl(s, SIOCSIFADDR, &r6) != 0) {
      err = sys_err("cannot give " + t->name_ + " the address " + o.ip.to_string());
      return nullptr;
    }
  }
  t->rx_buf_ = std::make_unique<std::uint8_t[]>(kBurst * kFrameMax);
  t->tx_buf_ = std::make_unique<std::uint8_t[]>(kFrameMax);
  return t;
}

HostTap::~HostTap() {
  if (fd_ >= 0) ::close(fd_);  // a TAP that is not persistent goes with its last descriptor
}

std::uint16_t HostTap::rx_burst(pipeline::RxFrame* out, std::uint16_t max) {
  std::uint16_t n = 0;
  if (max > kBurst) max = kBurst;
  while (n < max) {
    std::uint8_t* buf = rx_buf_.get() + std::size_t{n} * kFrameMax;
    const ssize_t r = ::read(fd_, buf, kFrameMax);
    if (r <= 0) break;  // EAGAIN: nothing more
    out[n].data = buf;
    out[n].len = static_cast<std::uint32_t>(r);
    ++n;
  }
  stats_.rx_frames += n;
  return n;
}

bool HostTap::tx(const transport::TxFrame& f) {
  const std::size_t len = f.copy_to(wire::Bytes(tx_buf_.get(), kFrameMax));
  return tx_raw(wire::ConstBytes(tx_buf_.get(), len));
}

bool HostTap::tx_raw(wire::ConstBytes frame) {
  if (frame.empty() || frame.size() > kFrameMax || ::write(fd_, frame.data(), frame.size()) != static_cast<ssize_t>(frame.size())) {
    ++stats_.tx_dropped;
    return false;
  }
  ++stats_.tx_frames;
  return true;
}

}  // namespace uroce::host
