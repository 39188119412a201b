#include "control/node/preflight.h"

#include "control/node/privileges.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace uroce::control {

namespace fs = std::filesystem;

std::string host_netdev_name(const NodeOptions& o, bool embedded, std::size_t pipelines) {
  std::string name = o.host_netdev;
  if (name != "auto") return name;
  name.clear();
  if (!embedded && !o.app_socket.empty() && !o.ports.empty() && o.ports[0].rfind("net_af_packet", 0) != 0 &&
      pipelines == 1) {
    name = o.app_socket.substr(o.app_socket.rfind('/') + 1);
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".sock") == 0) name.resize(name.size() - 5);
    if (name.empty() || name.size() > 15) name = "uroce%d";
  }
  return name;
}

namespace {

class Report {
 public:
  Report(std::ostream& out) : out_(out) {}
  void ok(const std::string& what, const std::string& detail) { out_ << "ok   " << what << ": " << detail << "\n"; }
  void na(const std::string& what, const std::string& detail) { out_ << "--   " << what << ": " << detail << "\n"; }
  void fail(const std::string& what, const std::string& detail, const std::string& fix) {
    out_ << "FAIL " << what << ": " << detail << "; fix: " << fix << "\n";
    ++failures_;
  }
  [[nodiscard]] int failures() const { return failures_; }

 private:
  std::ostream& out_;
  int failures_ = 0;
};

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

void hugepages(const NodeOptions& o, const std::string& root, Report& r) {
  if (o.no_huge) return r.na("hugepages", "--no-huge: the EAL takes ordinary memory");
  std::uint64_t free_bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root + "/sys/kernel/mm/hugepages", ec)) {
    const std::string name = e.path().filename();  // hugepages-2048kB
    const std::uint64_t kb = std::strtoull(name.c_str() + std::strlen("hugepages-"), nullptr, 10);
    free_bytes += std::strtoull(read_line(e.path() / "free_hugepages").c_str(), nullptr, 10) * kb * 1024;
  }
  bool mounted = false;
  std::ifstream m(root + "/proc/mounts");
  for (std::string line; std::getline(m, line);)
    if (line.find(" hugetlbfs ") != std::string::npos) mounted = true;
  const std::uint64_t want = std::uint64_t{o.mem_mb} << 20;
  if (!mounted && is_root())
    return r.fail("hugepages", "no hugetlbfs is mounted",
                  "mount -t hugetlbfs nodev /dev/hugepages (docs/deploy.md, section 1), or run with --no-huge");
  if (free_bytes < want)
    return r.fail("hugepages",
                  std::to_string(free_bytes >> 20) + " MiB of hugepages free, --mem-mb asks " + std::to_string(o.mem_mb),
                  "echo " + std::to_string((want >> 21) + 1) +
                      " > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages, lower --mem-mb, or --no-huge");
  r.ok("hugepages", std::to_string(free_bytes >> 20) + " MiB free, --mem-mb " + std::to_string(o.mem_mb) +
                        (is_root() ? "" : " (unprivileged: taken with memfd, no hugetlbfs files)"));
}

void privilege(const NodeOptions& o, const std::string& root, Report& r) {
  const std::string who = "this process (" + (is_root() ? std::string("root") : "uid " + std::to_string(::geteuid()) +
                                                                 "; capabilities: " + held_capabilities()) + ")";
  const auto needs = privileges(o, host_netdev_name(o, false, o.ports.size() * o.shards), root);
  if (needs.empty()) return r.ok("privileges", "the ports need none; " + who);
  for (const PrivilegeNeed& n : needs) {
    const std::string what = "privileges of " + n.what;
    if (n.missing.empty()) {
      r.ok(what, "needs " + n.needs + "; " + who + " has them");
    } else {
      r.fail(what, "needs " + n.needs + "; " + who + " lacks " + n.missing,
             n.needs == "root" ? std::string("run uroced as root (a drop-in with User=root for the unit; docs/deploy.md)")
                               : "grant " + n.missing + " (the units' AmbientCapabilities=; docs/deploy.md), or run as root");
    }
  }
}

void pci_port(const std::string& port, const std::string& root, Report& r) {
  const std::string addr = port.find(':') == 4 ? port : "0000:" + port;
  const std::string dev = root + "/sys/bus/pci/devices/" + addr;
  const std::string what = "port " + port;
  std::error_code ec;
  if (!fs::exists(dev, ec)) return r.fail(what, "no PCI device " + addr, "name a device that lspci -D lists");
  const fs::path drv = fs::read_symlink(dev + "/driver", ec);
  const std::string driver = ec ? "" : drv.filename().string();
  if (driver.empty())
    return r.fail(what, "bound to no driver", "dpdk-devbind.py -b vfio-pci " + addr + " (docs/deploy.md, section 2)");
  if (driver == "vfio-pci") {
    const bool groups = fs::exists(dev + "/iommu_group", ec);
    const bool noiommu = read_line(root + "/sys/module/vfio/parameters/enable_unsafe_noiommu_mode") == "Y";
    if (!groups && !noiommu)
      return r.fail(what, "vfio-pci without an IOMMU group (the IOMMU is off)",
                    "boot with intel_iommu=on iommu=pt (or amd_iommu=on), or echo Y > "
                    "/sys/module/vfio/parameters/enable_unsafe_noiommu_mode for a test host");
    return r.ok(what, "vfio-pci, " + std::string(groups ? "IOMMU group " + fs::read_symlink(dev + "/iommu_group", ec).filename().string()
                                                          : "no-IOMMU mode"));
  }
  if (driver == "uio_pci_generic" || driver == "igb_uio") return r.ok(what, driver + " (no IOMMU protection)");
  if (driver == "mlx5_core" || driver == "mlx4_core")
    return r.ok(what, driver + " (bifurcated: DPDK's mlx5 driver shares the port with the kernel)");
  r.fail(what, "bound to " + driver + ", a kernel driver DPDK cannot use",
         "dpdk-devbind.py -b vfio-pci " + addr + " (the kernel's netdev goes away)");
}

void iface_port(const NodeOptions& o, const std::string& port, const std::string& iface, const std::string& root,
                Report& r) {
  const std::string what = "port " + port;
  const std::string net = root + "/sys/class/net/" + iface;
  std::error_code ec;
  if (iface.empty()) return r.fail(what, "its --vdev names no iface=", "add iface=NAME to the --vdev");
  if (!fs::exists(net, ec))
    return r.fail(what, "no network interface " + iface, "create it, or name one that ip link lists");
  const std::string state = read_line(net + "/operstate");
  if (state != "up" && state != "unknown")
    return r.fail(what, iface + " is " + (state.empty() ? std::string("not up") : state), "ip link set " + iface + " up");
  const unsigned long mtu = std::strtoul(read_line(net + "/mtu").c_str(), nullptr, 10);
  if (o.mtu && mtu < o.mtu)
    return r.fail(what, iface + "'s MTU is " + std::to_string(mtu) + ", --link-mtu is " + std::to_string(o.mtu),
                  "ip link set " + iface + " mtu " + std::to_string(o.mtu) + ", or a smaller --link-mtu");
  r.ok(what, iface + " up, MTU " + std::to_string(mtu));
}

void ports(const NodeOptions& o, const std::string& root, Report& r) {
  for (const std::string& p : o.ports) {
    if (is_pci(p)) {
      pci_port(p, root, r);
    } else if (p.rfind("net_af_packet", 0) == 0 || p.rfind("net_af_xdp", 0) == 0) {
      iface_port(o, p, vdev_arg(o, p, "iface"), root, r);
    } else if (p.rfind("net_memif", 0) == 0) {
      const std::string sock = vdev_arg(o, p, "socket");
      const std::string dir = sock.empty() ? "/run/memif.sock" : fs::path(sock).parent_path().string();
      if (!sock.empty() && ::access(dir.c_str(), W_OK) != 0)
        r.fail("port " + p, "memif socket " + sock + ": its folder " + dir + " is not writable (" + std::strerror(errno) + ")",
               "create " + dir + ", or give socket= a path in a writable folder");
      else
        r.ok("port " + p, "memif, socket " + (sock.empty() ? std::string("/run/memif.sock") : sock));
    } else {
      r.na("port " + p, "a virtual device: checked when it starts");
    }
  }
}

void lcores(const NodeOptions& o, Report& r) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return r.na("lcores", "cannot read this process's CPU set");
  std::string allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) allowed += (allowed.empty() ? "" : ",") + std::to_string(c);
  std::vector<unsigned> want = o.lcores.empty() ? std::vector<unsigned>{0} : o.lcores;
  for (std::size_t i = 0; i < want.size(); ++i)
    for (std::size_t j = i + 1; j < want.size(); ++j)
      if (want[i] == want[j])
        return r.fail("lcores", "lcore " + std::to_string(want[i]) + " is named twice", "one lcore a pipeline");
  for (unsigned l : want)
    if (l >= CPU_SETSIZE || !CPU_ISSET(l, &set))
      return r.fail("lcores", "lcore " + std::to_string(l) + " is not among this process's CPUs (" + allowed + ")",
                    "choose --lcore among " + allowed + " (or widen the CPU set: taskset, CPUAffinity=)");
  std::string list;
  for (unsigned l : want) list += (list.empty() ? "" : ",") + std::to_string(l);
  r.ok("lcores", list + " of " + allowed);
}

/// Whether a process listens on the Unix socket at `path`.
bool socket_live(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return live;
}

void socket_path(const std::string& flag, const std::string& path, Report& r) {
  const std::string what = flag + " " + path;
  if (path.empty()) return;
  if (path.size() >= sizeof(sockaddr_un{}.sun_path))
    return r.fail(what, "longer than a Unix socket path may be (107 bytes)", "a shorter path");
  const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return r.fail(what, "its folder " + dir + " is not writable (" + std::strerror(errno) + ")",
                  "mkdir -p " + dir + " (the units' RuntimeDirectory makes /run/uroce)");
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return r.fail(what, "a file that is not a socket is there", "remove it, or another path");
    if (socket_live(path))
      return r.fail(what, "another process listens on it (another uroced?)",
                    "stop it, or give this one another path");
    return r.ok(what, "a stale socket from a daemon that ended: replaced at start");
  }
  r.ok(what, "free, in a writable folder");
}

void host_netdev(const NodeOptions& o, const std::string& root, Report& r) {
  const std::string name = host_netdev_name(o, false, o.ports.size() * o.shards);
  if (name.empty()) return r.na("host netdev", "none (--no-host-netdev, or not a daemon serving applications on one port)");
  if (::access((root + "/dev/net/tun").c_str(), R_OK | W_OK) != 0)
    return r.fail("host netdev " + name, "/dev/net/tun cannot be opened (" + std::string(std::strerror(errno)) + ")",
                  "modprobe tun, or --no-host-netdev");
  std::error_code ec;
  if (name.find('%') == std::string::npos && fs::exists(root + "/sys/class/net/" + name, ec))
    return r.fail("host netdev " + name, "an interface of that name already exists",
                  "ip link del " + name + " if a crashed uroced left it, or --host-netdev another name");
  r.ok("host netdev " + name, "/dev/net/tun is there, the name is free");
}

void dpdk_prefix(const NodeOptions& o, const std::string& root, Report& r) {
  const std::string prefix = o.file_prefix.empty() ? "rte" : o.file_prefix;
  if (o.eal_extra.find("--in-memory") != std::string::npos || (!is_root() && !o.no_huge))
    return r.na("DPDK --file-prefix " + prefix, "--in-memory (an unprivileged daemon's with hugepages): no shared files");
  if (!is_root()) return r.na("DPDK --file-prefix " + prefix, "unprivileged: its files are its own, in $XDG_RUNTIME_DIR/dpdk");
  const std::string cfg = root + "/var/run/dpdk/" + prefix + "/config";
  const int fd = ::open(cfg.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return r.ok("DPDK --file-prefix " + prefix, "no other process runs with it");
  struct flock l{};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  const bool held = ::fcntl(fd, F_GETLK, &l) == 0 && l.l_type != F_UNLCK;
  ::close(fd);
  if (held)
    return r.fail("DPDK --file-prefix " + prefix, "process " + std::to_string(l.l_pid) + " runs with it (another uroced?)",
                  "stop it, or give each daemon its own --file-prefix (the units' instance name does)");
  r.ok("DPDK --file-prefix " + prefix, "left by a process that ended: reused at start");
}

}  // namespace

int preflight(const NodeOptions& o, const std::string& root, std::ostream& out) {
  Report r(out);
  hugepages(o, root, r);
  ports(o, root, r);
  privilege(o, root, r);
  lcores(o, r);
  socket_path("--app-socket", o.app_socket, r);
  socket_path("--ctl-socket", o.ctl_socket, r);
  host_netdev(o, root, r);
  dpdk_prefix(o, root, r);
  out << (r.failures() ? std::to_string(r.failures()) + " check(s) failed: uroced would not start as configured\n"
                       : "every check passed\n");
  return r.failures();
}

}  // namespace uroce::control
