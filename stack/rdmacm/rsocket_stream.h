// The stream rsocket (rsockets' RC protocol, version 1): its state and
// the protocol's operations, which rsocket_stream.cc implements, for the
// public calls in rsocket.cc. Every call below takes the socket's lock
// (`lock`, over Rs::mu) where it names one, and may release it while it
// waits.
#pragma once

#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

namespace uroce::rsockets {

// ------------------------------------------------------------ the wire
// The immediate: bits 31..29 the message, 28..0 its argument.
enum : std::uint32_t { kOpData = 0, kOpWrite = 2, kOpSgl = 4, kOpIomapSgl = 6, kOpCtrl = 7 };
enum : std::uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };
constexpr std::uint32_t msg_set(std::uint32_t op, std::uint32_t data) { return op << 29 | data; }
constexpr std::uint32_t msg_op(std::uint32_t m) { return m >> 29; }
constexpr std::uint32_t msg_data(std::uint32_t m) { return m & 0x1FFFFFFFu; }

constexpr std::uint64_t kRecvWr = 1ull << 63;  // a receive's wr_id; a send's is its message
constexpr std::uint32_t kSndLowat = 2048;      // the least send space worth a message
constexpr std::uint32_t kMaxTransfer = 65536;  // one message's most
constexpr std::uint32_t kOlapStart = 2048;     // the first message of a send; doubles up to kMaxTransfer
constexpr std::uint16_t kQpMin = 16, kQpMax = 0xFFFE;
constexpr std::uint32_t kCtrlSlots = 4;  // control messages in flight (power of 2)
constexpr int kSglSize = 2;              // receive-space entries in the target list
constexpr std::uint8_t kConnFlagNet = 1, kConnFlagIomap = 2;

/// Remote memory, in the sender's byte order (the peer swaps when the
/// connection data's NET flags differ).
struct Sge {
  std::uint64_t addr;
  std::uint32_t key;
  std::uint32_t length;
};
struct Iomap {
  std::uint64_t offset;
  Sge sge;
};
/// The CM private data of the REQ and the REP; its SGEs are big-endian.
struct ConnData {
  std::uint8_t version;
  std::uint8_t flags;
  std::uint16_t credits;  // big-endian: the sender's receive queue
  std::uint8_t reserved[3];
  std::uint8_t target_iomap_size;  // scaled (scale_of)
  Sge target_sgl;                  // where the peer writes receive space
  Sge data_buf;                    // the first receive space
};
static_assert(sizeof(Sge) == 16 && sizeof(Iomap) == 24 && sizeof(ConnData) == 40, "rsockets' wire layout");

constexpr bool host_is_net() { return __BYTE_ORDER == __BIG_ENDIAN; }
/// An 8-bit size field: values to 128 as they are, larger ones as 128 | v >> 8.
inline int scale_of(int v) { return v <= 128 ? v : 128 | (v >> 8); }
inline int value_of(int s) { return s <= 128 ? s : (s & ~128) << 8; }

// ------------------------------------------------------------ a socket
// States as rsockets orders them: passive, connecting, connected, closed.
enum : int {
  kInit = 0,
  kBound = 0x1,
  kListening = 0x2,
  kOpening = 0x4,
  kResolvingAddr = kOpening | 0x10,
  kResolvingRoute = kOpening | 0x20,
  kConnecting = kOpening | 0x40,
  kAccepting = kOpening | 0x80,
  kConnected = 0x100,
  kWritable = 0x200,
  kReadable = 0x400,
  kConnectRdwr = kConnected | kReadable | kWritable,
  kConnectError = 0x800,
  kDisconnected = 0x1000,
  kError = 0x2000,
};

struct MapMr {
  std::uint64_t offset = 0;
  ibv_mr* mr = nullptr;
  bool queued = false;  // announced to the peer at the next send
};

struct Rs {
  int index = -1;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  std::mutex mu;
  int state = kInit;
  int err = 0;
  int fs_flags = 0;  // O_NONBLOCK
  bool swap = false;
  // Options (SOL_SOCKET, IPPROTO_TCP, SOL_RDMA), before the QP.
  std::uint32_t sbuf_size = 1 << 17, rbuf_size = 1 << 17;
  std::uint16_t sq_size = 384, rq_size = 384;
  std::uint32_t sq_inline = 64;
  std::uint16_t target_iomap_size = 0;
  int so_reuseaddr = 0, so_keepalive = 0, so_oobinline = 0, so_linger_off = 0;
  int tcp_nodelay = 0, tcp_keepidle = 7200, tcp_keepintvl = 75, tcp_keepcnt = 9;
  // A listener's connections, accepted and waiting for raccept.
  std::deque<Rs*> accepted;
  // The connection.
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool cq_armed = false;
  std::uint32_t ctrl_seqno = 0, ctrl_max_seqno = kCtrlSlots;
  std::uint16_t sseq_no = 0, sseq_comp = 0, rseq_no = 0, rseq_comp = 0;
  int remote_sge = 0;
  Sge remote_sgl{}, remote_iomap{};
  std::uint8_t* target = nullptr;  // target list, then iomap table: the peer writes them
  ibv_mr* target_mr = nullptr;
  int target_sge = 0;
  volatile Sge* target_sgl = nullptr;
  Iomap* target_iomap = nullptr;
  std::uint8_t* rbuf = nullptr;
  ibv_mr* rmr = nullptr;
  int rbuf_bytes_avail = 0, rbuf_free_offset = 0, rbuf_offset = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> rmsg;  // (op, length) of data received
  int rmsg_head = 0, rmsg_tail = 0;
  std::uint8_t* sbuf = nullptr;
  ibv_mr* smr = nullptr;
  int sbuf_bytes_avail = 0;
  ibv_sge ssgl[2]{};
  int sqe_avail = 0;
  std::vector<MapMr> remote_maps;  // riomap(PROT_WRITE): the peer's iomap table's entries
  std::vector<MapMr> local_maps;   // riomap without PROT_WRITE
  bool iomap_pending = false;
};

inline int fail(int err) {
  errno = err;
  return -1;
}

inline bool ctrl_avail(const Rs* rs) { return rs->ctrl_seqno != rs->ctrl_max_seqno; }
inline bool conn_can_send_ctrl(const Rs* rs) { return ctrl_avail(rs) || !(rs->state & kConnected); }

/// The stream socket numbered `s`, or null.
Rs* lookup(int s);
/// A new socket on its own event channel (a listener's connection: the
/// channel its id moves to).
Rs* make_rs(const Rs* parent);
/// Makes the socket findable by its number.
void insert(Rs* rs);
/// Unlists and frees the socket, its accepted connections, and everything
/// it holds (QP, MRs, CQ, channels).
void free_rs(Rs* rs);
/// Whether every send has completed, or the connection is gone.
bool conn_all_sends_done(const Rs* rs);
/// Makes progress until `test` holds: 0; -1 with EWOULDBLOCK when
/// non-blocking, or with errno when the socket failed. Waits in poll() with
/// the socket's lock released.
int wait_until(Rs* rs, std::unique_lock<std::mutex>& lock, bool nonblock, bool (*test)(const Rs*));
/// Drives a connection being made (rconnect's, or an accepted one's):
/// 0 once connected; -1 with EINPROGRESS while it is on its way
/// (non-blocking), or the reason it failed.
int drive_connect(Rs* rs, std::unique_lock<std::mutex>& lock, bool nonblock);
/// Takes a listener's connection requests: each becomes a socket,
/// accepted, queued for raccept.
void accept_requests(Rs* l);
/// Announces riomap'd buffers to the peer (its iomap table, at their index).
int send_iomaps(Rs* rs, std::unique_lock<std::mutex>& lock, int flags);
/// The entry point of every data call on a stream: finishes a connection
/// being made first.
int ready(Rs* rs, std::unique_lock<std::mutex>& lock, int flags);
/// rsend and rrecv on a connected stream: the bytes moved, 0 at the end
/// of the stream (rrecv), or -1 with errno.
ssize_t do_send(Rs* rs, std::unique_lock<std::mutex>& lock, const void* buf, std::size_t len, int flags);
ssize_t do_recv(Rs* rs, std::unique_lock<std::mutex>& lock, void* buf, std::size_t len, int flags);
/// What poll would say of an rsocket, without waiting.
short poll_rs(Rs* rs, short events);
/// Before rpoll sleeps: arms an rsocket's CQ and adds what wakes it.
void arm_rs(Rs* rs, std::vector<pollfd>& w);
/// A control message (kCtrlDisconnect, kCtrlShutdown) in one of the
/// control slots, which the caller has checked is free (ctrl_avail).
int send_ctrl(Rs* rs, std::uint32_t ctrl);
/// riowrite: `count` bytes of `buf` into the peer's riomap'd memory at
/// `offset`, as RDMA WRITEs. Returns the bytes written, or -1 (errno) if
/// none were.
ssize_t do_iowrite(Rs* rs, std::unique_lock<std::mutex>& lock, const void* buf, std::size_t count, off_t offset, int flags);

}  // namespace uroce::rsockets
