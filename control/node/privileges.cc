#include "control/node/privileges.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>

namespace uroce::control {

namespace fs = std::filesystem;

namespace {

struct Cap {
  int bit;
  const char* name;
};
constexpr Cap kNetRaw{CAP_NET_RAW, "CAP_NET_RAW"};
constexpr Cap kNetAdmin{CAP_NET_ADMIN, "CAP_NET_ADMIN"};
constexpr Cap kIpcLock{CAP_IPC_LOCK, "CAP_IPC_LOCK"};

/// The effective capability sets (two 32-bit words), from capget(2).
bool effective(std::uint32_t (&sets)[2]) {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (::syscall(SYS_capget, &h, d) != 0) return false;
  sets[0] = d[0].effective;
  sets[1] = d[1].effective;
  return true;
}

bool holds(int bit) {
  std::uint32_t s[2];
  return effective(s) && (s[bit / 32] >> (bit % 32) & 1u);
}

/// Needs the capabilities `caps`: what of them is missing.
PrivilegeNeed need(std::string what, std::initializer_list<Cap> caps) {
  PrivilegeNeed n{std::move(what), "", ""};
  for (const Cap& c : caps) {
    n.needs += (n.needs.empty() ? "" : ", ") + std::string(c.name);
    if (!holds(c.bit)) n.missing += (n.missing.empty() ? "" : ", ") + std::string(c.name);
  }
  return n;
}

PrivilegeNeed need_root(std::string what) { return {std::move(what), "root", is_root() ? "" : "root"}; }

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

PrivilegeNeed pci(const std::string& port, const std::string& root) {
  const std::string what = "port " + port;
  const std::string dev = root + "/sys/bus/pci/devices/" + (port.find(':') == 4 ? port : "0000:" + port);
  std::error_code ec;
  if (fs::read_symlink(dev + "/driver", ec).filename() != "vfio-pci") return need_root(what);
  // Its IOMMU group's file (or the no-IOMMU one) must be open to this user.
  const std::string group = fs::read_symlink(dev + "/iommu_group", ec).filename().string();
  std::string file = root + "/dev/vfio/" + group;
  if (ec || group.empty()) {
    file.clear();
    for (const auto& e : fs::directory_iterator(root + "/dev/vfio", ec))
      if (starts_with(e.path().filename().string(), "noiommu-")) file = e.path().string();
  }
  PrivilegeNeed n = need(what, {kIpcLock});
  const std::string shown = file.empty() ? std::string("/dev/vfio/GROUP") : file.substr(root.size());
  n.needs = shown + " read-write, " + n.needs;
  if (!is_root() && (file.empty() || ::access(file.c_str(), R_OK | W_OK) != 0))
    n.missing = shown + " read-write" + (n.missing.empty() ? "" : ", " + n.missing);
  return n;
}

}  // namespace

bool is_root() { return ::geteuid() == 0; }

std::string held_capabilities() {
  std::string out;
  for (const Cap& c : {kNetRaw, kNetAdmin, kIpcLock, Cap{CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, Cap{CAP_SYS_RAWIO, "CAP_SYS_RAWIO"}})
    if (holds(c.bit)) out += (out.empty() ? "" : ", ") + std::string(c.name);
  return out.empty() ? "none" : out;
}

std::vector<PrivilegeNeed> privileges(const NodeOptions& o, const std::string& host_netdev, const std::string& root) {
  std::vector<PrivilegeNeed> out;
  for (const std::string& p : o.ports) {
    const std::string what = "port " + p;
    if (is_pci(p)) {
      out.push_back(pci(p, root));
    } else if (starts_with(p, "net_af_packet")) {
      out.push_back(need(what, {kNetRaw, kNetAdmin}));  // a packet socket; the interface's flags at start
    } else if (starts_with(p, "net_tap") || starts_with(p, "net_tun")) {
      out.push_back(need(what, {kNetAdmin}));
    } else if (starts_with(p, "net_pcap")) {
      if (!vdev_arg(o, p, "iface").empty()) out.push_back(need(what, {kNetRaw}));  // a live capture
    } else if (starts_with(p, "net_af_xdp")) {
      out.push_back(need_root(what));  // loads an XDP program
    }
    // net_memif, net_ring, net_null and the rest: file permissions only.
  }
  if (!host_netdev.empty()) out.push_back(need("host netdev " + host_netdev, {kNetAdmin}));
  return out;
}

}  // namespace uroce::control
