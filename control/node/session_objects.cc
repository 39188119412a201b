// The session server's handlers that make and destroy verbs objects: PDs,
// MRs (memfd pieces, ODP, in place), memory windows, CQs (and their
// resizing), XRC domains, SRQs, QPs and flow rules, and DESTROY.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "control/node/session.h"
#include "stack/abi/doorbell.h"
#include "stack/abi/fd_msg.h"
#include "stack/abi/qp_attr.h"
#include "stack/cc/cc.h"

namespace uroce::control {

namespace asio = boost::asio;
using namespace transport;
using namespace sessions_internal;

void SessionServer::on_alloc_pd(Session& s, const Req& req) {
  if (s.pds.size() >= limits_.max_pds) return req.fail(EDQUOT, "too many PDs for this session");
  uroce_handle_reply r{s.next_handle++};
  s.pds[r.handle] = eng_.alloc_pd();
  return req.reply(0, "", &r, sizeof r);
}

void SessionServer::on_reg_mr(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  std::vector<int>& fds = req.fds;
  const std::uint8_t* body = req.body;
  // One memfd (REG_MR), or several mapped one after another
  // (REG_MR_PIECES: memory the application registered before in
  // pieces, which must stay where it is).
  uroce_reg_mr_pieces_msg pm{};
  uroce_reg_mr_exact ex{};
  if (const char* why = parse_mr_memory(h.type == UROCE_MSG_REG_MR, body, h.len, pm, ex)) return req.fail(EINVAL, why);
  const uroce_reg_mr_msg& m = pm.mr;
  auto pd = s.pds.find(m.pd);
  if (pd == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
  if (s.mrs.size() + s.mws.size() >= limits_.max_mrs || s.mr_bytes + m.length > limits_.max_mr_bytes)
    return req.fail(EDQUOT, "over this session's MR limit");
  Mapping map;
  int err = 0;
  if (const char* why = map_mr_memory(pm, fds, map, err)) return req.fail(err, why);
  map.guard = sigbus_guard::guard(map.addr, map.len, s.id);  // a fault in it costs the session, not the daemon
  Mr* mr = eng_.reg_mr_iova(pd->second, static_cast<std::uint8_t*>(map.addr) + ex.head, ex.byte_length, m.access,
                            m.app_va + ex.head);
  if (!mr) {
    return req.fail(EINVAL, "bad MR access flags or range");
  }
  uroce_reg_mr_reply r{s.next_handle++, mr->lkey, mr->rkey, 0};
  s.mrs[r.handle] = {mr, std::move(map)};
  s.mr_bytes += m.length;
  return req.reply(0, "", &r, sizeof r);
}

void SessionServer::on_create_flow(Session& s, const Req& req) {
  uroce_flow_msg m;
  if (!req.take(m)) return;
  auto q = s.qps.find(m.qp);
  if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
  if (q->second.qp->type != IBV_QPT_RAW_PACKET) return req.fail(EINVAL, "a flow rule steers to a raw packet QP");
  if (held_by(sessions_, s.uid, [](const auto& q) { return q.flows.size(); }) >= limits_.max_flows_per_uid) {
    ++refused_.flows_per_uid;
    return req.fail(EDQUOT, "too many flow rules for uid " + std::to_string(s.uid) + " (max_flows_per_uid " +
                            std::to_string(limits_.max_flows_per_uid) + ")");
  }
  const std::uint32_t fh = eng_.create_flow(q->second.qp, m.priority, m.value, m.mask);
  if (fh == 0) return req.fail(ENOMEM, "the port's flow table is full");
  q->second.flows.push_back(fh);
  uroce_handle_reply r{fh};
  return req.reply(0, "", &r, sizeof r);
}

void SessionServer::on_reg_mr_odp(Session& s, const Req& req) {
  std::vector<int>& fds = req.fds;
  uroce_reg_mr_odp_msg m;
  if (!req.take(m)) return;
  if (!limits_.odp) return req.fail(EOPNOTSUPP, "this uroced registers no ODP MR (it runs without --odp)");
  auto pd = s.pds.find(m.pd);
  if (pd == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
  if (s.mrs.size() + s.mws.size() >= limits_.max_mrs) return req.fail(EDQUOT, "over this session's MR limit");
  if (s.mem_fd < 0) {
    // The application's memory file: procfs, opened read-write by the
    // application (which could open only what it may write anyway).
    struct statfs fs {};
    struct stat st {};
    if (fds.empty() || ::fstatfs(fds.front(), &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC ||
        ::fstat(fds.front(), &st) != 0 || !S_ISREG(st.st_mode) ||
        (::fcntl(fds.front(), F_GETFL) & O_ACCMODE) != O_RDWR)
      return req.fail(EINVAL, "the first ODP MR needs the application's /proc/self/mem, open for reading and writing");
    s.mem_fd = fds.front();
    fds.erase(fds.begin());
  }
  Mr* mr = eng_.reg_mr_odp(pd->second, m.addr, m.length, m.iova, m.access, s.mem_fd);
  if (!mr) return req.fail(EINVAL, "bad MR access flags or range");
  uroce_reg_mr_reply r{s.next_handle++, mr->lkey, mr->rkey, 0};
  s.mrs[r.handle] = {mr, Mapping{}};  // nothing mapped, nothing counted against the MR bytes
  return req.reply(0, "", &r, sizeof r);
}

void SessionServer::on_rereg_mr(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  std::vector<int>& fds = req.fds;
  const std::uint8_t* body = req.body;
  // ibv_rereg_mr: the same MR (and keys), with another PD, access, or
  // memory (sent as REG_MR_PIECES sends it).
  uroce_rereg_mr_msg m;
  if (!req.take(m)) return;
  const auto r = s.mrs.find(m.handle);
  if (r == s.mrs.end()) return req.fail(EINVAL, "no such MR in this session");
  Pd* pd = nullptr;
  if (m.flags & IBV_REREG_MR_CHANGE_PD) {
    const auto p = s.pds.find(m.pd);
    if (p == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
    pd = p->second;
  }
  if ((m.flags & IBV_REREG_MR_CHANGE_TRANSLATION) && r->second.mr->odp_fd >= 0)
    return req.fail(EOPNOTSUPP, "an ODP MR keeps its range: register another");
  Mapping map;
  uroce_reg_mr_pieces_msg pm{};
  uroce_reg_mr_exact ex{};
  if (m.flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    if (const char* why = parse_mr_memory(false, body + sizeof m, h.len - sizeof m, pm, ex)) return req.fail(EINVAL, why);
    if (s.mr_bytes - r->second.map.len + pm.mr.length > limits_.max_mr_bytes)
      return req.fail(EDQUOT, "over this session's MR limit");
    int err = 0;
    if (const char* why = map_mr_memory(pm, fds, map, err)) return req.fail(err, why);
    map.guard = sigbus_guard::guard(map.addr, map.len, s.id);
  }
  const int rc = eng_.rereg_mr(r->second.mr, static_cast<int>(m.flags), pd, m.access,
                               map.addr ? static_cast<std::uint8_t*>(map.addr) + ex.head : nullptr, ex.byte_length,
                               pm.mr.app_va + ex.head);
  if (rc != 0) {
    return req.fail(rc, rc == EBUSY ? "memory windows are bound to the MR" : "bad rereg flags, PD, access or range");
  }
  if (map.addr) {
    s.mr_bytes = s.mr_bytes - r->second.map.len + map.len;
    r->second.map = std::move(map);  // the old one is unmapped: the engine no longer reaches it
  }
  uroce_reg_mr_reply rr{m.handle, r->second.mr->lkey, r->second.mr->rkey, 0};
  return req.reply(0, "", &rr, sizeof rr);
}

void SessionServer::on_alloc_mw(Session& s, const Req& req) {
  uroce_alloc_mw_msg m;
  if (!req.take(m)) return;
  const auto pd = s.pds.find(m.pd);
  if (pd == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
  if (m.type != IBV_MW_TYPE_1 && m.type != IBV_MW_TYPE_2) return req.fail(EINVAL, "a memory window is of type 1 or 2");
  if (s.mrs.size() + s.mws.size() >= limits_.max_mrs) return req.fail(EDQUOT, "over this session's MR limit (windows count)");
  Mr* mw = eng_.alloc_mw(pd->second, m.type);
  if (!mw) return req.fail(ENOMEM, "the daemon's key table is full");
  uroce_alloc_mw_reply r{s.next_handle++, mw->rkey};
  s.mws[r.handle] = mw;
  return req.reply(0, "", &r, sizeof r);
}

void SessionServer::on_resize_cq(Session& s, const Req& req) {
  uroce_resize_cq_msg m;
  if (!req.take(m)) return;
  const auto c = s.cqs.find(m.handle);
  if (c == s.cqs.end()) return req.fail(EINVAL, "no such CQ in this session");
  if (m.entries == 0 || m.entries > (1u << 16)) return req.fail(EINVAL, "CQ entries must be 1..65536");
  const std::uint32_t entries = std::bit_ceil(m.entries);
  // What the application posted before asking is done first, as a
  // post completes before the next verb on a kernel device's queue
  // (rxe's UD sends complete at once): the completions waiting then
  // include those of the posts made before the resize.
  for (auto& qp_entry : s.qps) (void)eng_.take_posts(qp_entry.second.qp);
  eng_.poll(now_ns());
  Mapping map;
  Fd fd;
  if (!make_shared(uroce_ring_bytes(entries, sizeof(uroce_cq_entry)), map, fd))
    return req.fail(ENOMEM, "cannot create the CQ ring");
  const auto ring = abi::Ring<uroce_cq_entry>::create(map.addr, entries, UROCE_RING_CQ, m.handle);
  if (c->second.cq->resize(ring) != 0) {
    return req.fail(EINVAL, "the new size has no room for the completions waiting");
  }
  c->second.map = std::move(map);  // the old ring is unmapped
  uroce_handle_reply r{m.handle};
  req.reply(0, "", &r, sizeof r, fd.get());
  return;
}

void SessionServer::on_create_cq(Session& s, const Req& req) {
  std::vector<int>& fds = req.fds;
  uroce_create_cq_msg m;
  if (!req.take(m)) return;
  if (s.cqs.size() >= limits_.max_cqs) return req.fail(EDQUOT, "too many CQs for this session");
  if (m.entries == 0 || m.entries > (1u << 16)) return req.fail(EINVAL, "CQ entries must be 1..65536");
  const std::uint32_t entries = std::bit_ceil(m.entries);
  // A completion channel may come along: it must be a Unix datagram
  // socket, which the daemon writes to without ever blocking.
  Fd chan;
  if (!fds.empty()) {
    if (!abi::is_unix_dgram(fds.front())) return req.fail(EINVAL, "a completion channel must be a Unix datagram socket");
    chan = Fd(fds.front());
    fds.erase(fds.begin());
  }
  Mapping map;
  Fd fd;
  if (!make_shared(uroce_ring_bytes(entries, sizeof(uroce_cq_entry)), map, fd))
    return req.fail(ENOMEM, "cannot create the CQ ring");
  uroce_handle_reply r{s.next_handle++};
  const auto ring = abi::Ring<uroce_cq_entry>::create(map.addr, entries, UROCE_RING_CQ, r.handle);
  Cq* cq = eng_.create_cq(entries, &ring);
  if (!cq) return req.fail(ENOMEM, "cannot create the CQ");
  const bool notify = chan.get() >= 0;
  s.cqs[r.handle] = {cq, std::move(map), chan.release(), r.handle, &s};
  cq->owner = &s.cqs[r.handle];
  cq->want_notify(notify);
  req.reply(0, "", &r, sizeof r, fd.get());
  return;
}

void SessionServer::on_open_xrcd(Session& s, const Req& req) {
  std::vector<int>& fds = req.fds;
  uroce_open_xrcd_msg m;
  if (!req.take(m)) return;
  if (s.pds.size() + s.xrcds.size() >= limits_.max_pds)
    return req.fail(EDQUOT, "too many PDs and XRC domains for this session");
  Xrcd* x = nullptr;
  if (m.has_fd) {
    if (fds.empty()) return req.fail(EINVAL, "an XRC domain of a file needs the file's descriptor");
    struct stat st {};
    const int rc = ::fstat(fds.front(), &st);
    ::close(fds.front());
    fds.erase(fds.begin());
    if (rc != 0) return req.fail(EBADF, "cannot stat the XRC domain's file");
    for (auto& [dom, share] : xrcds_)
      if (share.file && share.dev == st.st_dev && share.ino == st.st_ino) x = dom;
    // As the kernel's ib_uverbs_open_xrcd: none without O_CREAT, or
    // one with O_CREAT | O_EXCL, is EINVAL.
    if (!x && !(m.oflags & O_CREAT)) return req.fail(EINVAL, "the file has no XRC domain and O_CREAT is not set");
    if (x && (m.oflags & O_CREAT) && (m.oflags & O_EXCL))
      return req.fail(EINVAL, "the file has an XRC domain already (O_EXCL)");
    if (!x) {
      x = eng_.alloc_xrcd();
      xrcds_[x] = {true, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino), 0};
    }
  } else {
    x = eng_.alloc_xrcd();
    xrcds_[x] = {};
  }
  ++xrcds_[x].openers;
  uroce_handle_reply r{s.next_handle++};
  s.xrcds[r.handle] = x;
  return req.reply(0, "", &r, sizeof r);
}

void SessionServer::on_create_srq(Session& s, const Req& req) {
  uroce_create_srq_msg m;
  if (!req.take(m, offsetof(uroce_create_srq_msg, xrcd))) return;  // minor 16 and older send 12 bytes
  if (s.srqs.size() >= limits_.max_srqs) return req.fail(EDQUOT, "too many SRQs for this session");
  auto pd = s.pds.find(m.pd);
  if (pd == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
  Xrcd* xrcd = nullptr;
  Cq* xcq = nullptr;
  const bool tm = m.tm_max_tags != 0;  // tag matching (minor 19): `cq` is where its operations complete
  Cq* tm_cq = nullptr;
  if (tm) {
    auto c = s.cqs.find(m.cq);
    if (c == s.cqs.end()) return req.fail(EINVAL, "a tag-matching SRQ needs a CQ of this session");
    if (m.xrcd != 0) return req.fail(EINVAL, "a tag-matching SRQ has no XRC domain");
    if (m.tm_max_tags > UROCE_TM_MAX_TAGS || m.tm_max_ops == 0 || m.tm_max_ops > UROCE_TM_MAX_OPS)
      return req.fail(EINVAL, "a tag-matching SRQ takes 1.." + std::to_string(UROCE_TM_MAX_TAGS) + " tags and 1.." +
                              std::to_string(UROCE_TM_MAX_OPS) + " operations");
    tm_cq = c->second.cq;
  } else if (m.xrcd != 0 || m.cq != 0) {
    // An XRC SRQ (a domain and a CQ), or a receive work queue (a CQ alone, minor 18).
    auto c = s.cqs.find(m.cq);
    if (c == s.cqs.end()) return req.fail(EINVAL, "an XRC SRQ or a work queue needs a CQ of this session");
    xcq = c->second.cq;
    if (m.xrcd != 0) {
      auto x = s.xrcds.find(m.xrcd);
      if (x == s.xrcds.end()) return req.fail(EINVAL, "no such XRC domain in this session");
      xrcd = x->second;
    }
  }
  if (m.max_wr == 0 || m.max_wr > kMaxSrqWr || m.max_sge == 0 || m.max_sge > UROCE_ABI_MAX_SGE)
    return req.fail(EINVAL, "SRQ max_wr must be 1..4096 and max_sge 1..4");
  const std::uint32_t entries = std::bit_ceil(m.max_wr);
  const std::uint32_t ops = tm ? std::bit_ceil(m.tm_max_ops) : 0;
  Mapping map;
  Fd fd;
  const std::size_t bytes = tm ? uroce_tm_srq_bytes(entries, ops, m.tm_max_tags)
                               : uroce_ring_bytes(entries, sizeof(uroce_recv_entry));
  if (!make_shared(bytes, map, fd)) return req.fail(ENOMEM, "cannot create the SRQ ring");
  uroce_handle_reply r{s.next_handle++};
  const auto ring = abi::Ring<uroce_recv_entry>::create(map.addr, entries, UROCE_RING_SRQ, r.handle);
  Srq* srq = eng_.create_srq(pd->second, entries, m.max_sge, &ring, xrcd, xcq);
  if (srq && tm) {
    auto* base = static_cast<std::uint8_t*>(map.addr);
    const auto op_ring =
        abi::Ring<uroce_tm_op>::create(base + uroce_tm_ops_offset(entries), ops, UROCE_RING_TM_OPS, r.handle);
    auto* released = reinterpret_cast<std::uint32_t*>(base + uroce_tm_released_offset(entries, ops));
    if (!eng_.make_tm(srq, tm_cq, m.tm_max_tags, op_ring, released)) {
      eng_.destroy_srq(srq);
      srq = nullptr;
    }
  }
  if (!srq) {
    return req.fail(ENOMEM, "cannot create the SRQ");
  }
  s.srqs[r.handle] = {srq, std::move(map)};
  srq->owner = &s.srqs[r.handle];
  if (tm) intake_.add_tm_srq(s.id, r.handle, srq);
  const uroce_create_srq_reply rr{r.handle, srq->srq_num()};  // a library before minor 17 reads the handle alone
  req.reply(0, "", &rr, sizeof rr, fd.get());
  return;
}

void SessionServer::on_create_qp(Session& s, const Req& req) {
  uroce_create_qp_msg m;
  if (!req.take(m, offsetof(uroce_create_qp_msg, srq))) return;
  if (s.qps.size() >= limits_.max_qps) return req.fail(EDQUOT, "too many QPs for this session");
  {
    if (held_by(sessions_, s.uid, [](const auto&) { return std::size_t{1}; }) >= limits_.max_qps_per_uid) {
      ++refused_.qps_per_uid;
      return req.fail(EDQUOT, "too many QPs for uid " + std::to_string(s.uid) + " (max_qps_per_uid " +
                              std::to_string(limits_.max_qps_per_uid) + ")");
    }
  }
  // XRC (minor 17): a send QP has no receive CQ (its send CQ stands in);
  // a target has no PD or CQs, only its domain.
  if (m.qp_type == IBV_QPT_XRC_SEND && m.recv_cq == 0) m.recv_cq = m.send_cq;
  Xrcd* xrcd = nullptr;
  if (m.qp_type == IBV_QPT_XRC_RECV) {
    auto x = s.xrcds.find(m.xrcd);
    if (x == s.xrcds.end()) return req.fail(EINVAL, "an XRC target QP needs an XRC domain of this session");
    xrcd = x->second;
  } else if (m.xrcd != 0) {
    return req.fail(EINVAL, "only an XRC target QP names an XRC domain");
  }
  // RSS (minor 18): a receive-only raw packet QP over work queues.
  transport::RssConf rss;
  const bool is_rss = m.rss_log_size != 0;
  if (is_rss) {
    if (m.qp_type != IBV_QPT_RAW_PACKET || m.srq != 0)
      return req.fail(EINVAL, "RSS is for a raw packet QP without an SRQ");
    if (m.rss_log_size > UROCE_RSS_MAX_LOG) return req.fail(EINVAL, "an RSS table has at most 64 work queues");
    constexpr std::uint32_t kFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                                      IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
                                      IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;
    if (m.rss_fields & ~kFields) return req.fail(EOPNOTSUPP, "RSS hashes IPv4, IPv6, TCP and UDP fields only");
    std::memcpy(rss.key.data(), m.rss_key, rss.key.size());
    rss.fields = m.rss_fields;
    for (std::uint32_t i = 0; i < (1u << m.rss_log_size); ++i) {
      auto w = s.srqs.find(m.rss_wq[i]);
      if (w == s.srqs.end() || w->second.srq->cq() == nullptr || w->second.srq->xrcd())
        return req.fail(EINVAL, "an RSS table names work queues of this session");
      rss.table.push_back(w->second.srq);
    }
  }
  auto pd = s.pds.find(m.pd);
  auto scq = s.cqs.find(m.send_cq), rcq = s.cqs.find(m.recv_cq);
  if (is_rss && pd == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
  if (!xrcd && !is_rss && (pd == s.pds.end() || scq == s.cqs.end() || rcq == s.cqs.end()))
    return req.fail(EINVAL, "no such PD or CQ in this session");
  if (m.qp_type != IBV_QPT_RC && m.qp_type != IBV_QPT_UC && m.qp_type != IBV_QPT_UD &&
      m.qp_type != IBV_QPT_RAW_PACKET && m.qp_type != IBV_QPT_XRC_SEND && m.qp_type != IBV_QPT_XRC_RECV)
    return req.fail(EINVAL, "QP type must be RC, UC, UD, RAW_PACKET, XRC_SEND or XRC_RECV");
  if (m.qp_type == IBV_QPT_RAW_PACKET && !may_use_raw(s.pid))
    return req.fail(EPERM, "a raw packet QP needs CAP_NET_RAW");
  Srq* srq = nullptr;
  if (m.srq != 0 && (m.qp_type == IBV_QPT_XRC_SEND || m.qp_type == IBV_QPT_XRC_RECV))
    return req.fail(EINVAL, "an XRC QP has no SRQ of its own (its requests name XRC SRQs)");
  if (m.srq != 0) {
    auto sr = s.srqs.find(m.srq);
    if (sr == s.srqs.end()) return req.fail(EINVAL, "no such SRQ in this session");
    srq = sr->second.srq;
    m.max_recv_wr = 1;  // the QP's own receive ring stays unused
  }
  if (m.max_send_wr > 4096 || m.max_recv_wr > 4096) return req.fail(EINVAL, "max_send_wr and max_recv_wr must be 0..4096");
  // A send-only or receive-only QP is legal: a queue asked with 0 gets
  // one slot, as the depths reported are at least those asked.
  m.max_send_wr = std::max<std::uint32_t>(m.max_send_wr, 1);
  m.max_recv_wr = std::max<std::uint32_t>(m.max_recv_wr, 1);
  const std::uint32_t sqn = std::bit_ceil(m.max_send_wr), rqn = std::bit_ceil(m.max_recv_wr);
  const std::size_t sq_bytes = (uroce_ring_bytes(sqn, sizeof(uroce_send_entry)) + 4095) & ~std::size_t{4095};
  Mapping map;
  Fd fd;
  if (!make_shared(sq_bytes + uroce_ring_bytes(rqn, sizeof(uroce_recv_entry)), map, fd))
    return req.fail(ENOMEM, "cannot create the QP's rings");
  const std::uint32_t handle = s.next_handle++;
  const auto sq = abi::Ring<uroce_send_entry>::create(map.addr, sqn, UROCE_RING_SEND, handle);
  const auto rq = abi::Ring<uroce_recv_entry>::create(static_cast<std::uint8_t*>(map.addr) + sq_bytes, rqn,
                                                      UROCE_RING_RECV, handle);
  QpInitAttr ia;
  ia.qp_type = static_cast<ibv_qp_type>(m.qp_type);
  ia.send_cq = xrcd || is_rss ? nullptr : scq->second.cq;
  ia.recv_cq = xrcd || is_rss ? nullptr : rcq->second.cq;
  ia.cap.max_send_wr = sqn;
  ia.cap.max_recv_wr = rqn;
  ia.sq_sig_all = m.sq_sig_all != 0;
  ia.srq = srq;
  ia.xrcd = xrcd;
  ia.sq_ring = xrcd || is_rss ? nullptr : &sq;  // an XRC target or RSS QP sends nothing: the engine gives it no ring
  ia.rq_ring = srq || m.qp_type == IBV_QPT_XRC_SEND || xrcd || is_rss ? nullptr : &rq;
  ia.rss = is_rss ? &rss : nullptr;
  Qp* qp = eng_.create_qp(xrcd ? nullptr : pd->second, ia);
  if (!qp) {
    return req.fail(ENOMEM, "cannot create the QP");
  }
  // Its uid's transmit share (a full table leaves it in the shared entry).
  (void)eng_.set_tenant(qp, static_cast<std::uint32_t>(s.uid), limits_.tx_weight(s.uid));
  uroce_create_qp_reply r{handle, qp->qpn, sqn, rqn, sq_bytes};
  s.qps[handle] = {qp, std::move(map), handle, &s};
  qp->owner = &s.qps[handle];
  intake_.add_qp(s.id, qp);
  req.reply(0, "", &r, sizeof r, fd.get());
  return;
}

void SessionServer::on_destroy(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  uroce_destroy_msg m;
  if (!req.take(m)) return;
  if (m.object == UROCE_OBJ_QP) {
    auto q = s.qps.find(m.handle);
    if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
    for (const ClosingQp& c : closing_)
      if (c.session == s.id && c.qp_handle == m.handle) return req.fail(EBUSY, "the QP is being destroyed");
    if (eng_.datagrams_unsent(q->second.qp)) {
      // Its datagrams first (finish_closing replies): an application may
      // post unsignaled sends and destroy at once (rdmacm-utils' mckey).
      eng_.take_posts(q->second.qp);
      closing_.push_back({s.id, m.handle, h, now_ms() + kClosingMs});
      return;
    }
    destroy_qp(s, m.handle);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.object == UROCE_OBJ_FLOW) {
    for (auto& [qh, q] : s.qps) {
      const auto it = std::find(q.flows.begin(), q.flows.end(), m.handle);
      if (it == q.flows.end()) continue;
      eng_.destroy_flow(m.handle);
      q.flows.erase(it);
      return req.reply(0, "", nullptr, 0);
    }
    return req.fail(EINVAL, "no such flow rule in this session");
  }
  if (m.object == UROCE_OBJ_MW) {
    auto w = s.mws.find(m.handle);
    if (w == s.mws.end()) return req.fail(EINVAL, "no such memory window in this session");
    eng_.dealloc_mw(w->second);  // a bound window comes unbound
    s.mws.erase(w);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.object == UROCE_OBJ_MR) {
    auto r = s.mrs.find(m.handle);
    if (r == s.mrs.end()) return req.fail(EINVAL, "no such MR in this session");
    if (const int rc = eng_.dereg_mr(r->second.mr); rc != 0) return req.fail(rc, "memory windows are bound to the MR");
    s.mr_bytes -= r->second.map.len;
    r->second.map.unmap();
    s.mrs.erase(r);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.object == UROCE_OBJ_CQ) {
    auto c = s.cqs.find(m.handle);
    if (c == s.cqs.end()) return req.fail(EINVAL, "no such CQ in this session");
    if (const int rc = eng_.destroy_cq(c->second.cq); rc != 0) return req.fail(rc, "the CQ is still used by a QP");
    c->second.map.unmap();
    if (c->second.chan >= 0) ::close(c->second.chan);
    s.cqs.erase(c);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.object == UROCE_OBJ_SRQ) {
    auto q = s.srqs.find(m.handle);
    if (q == s.srqs.end()) return req.fail(EINVAL, "no such SRQ in this session");
    if (const int rc = eng_.destroy_srq(q->second.srq); rc != 0) return req.fail(rc, "the SRQ is still used by a QP");
    intake_.remove_srq(q->second.srq);
    q->second.map.unmap();
    s.srqs.erase(q);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.object == UROCE_OBJ_XRCD) {
    auto x = s.xrcds.find(m.handle);
    if (x == s.xrcds.end()) return req.fail(EINVAL, "no such XRC domain in this session");
    for (const auto& [hq, q] : s.srqs)
      if (q.srq->xrcd() == x->second) return req.fail(EBUSY, "an XRC SRQ of this session is in the domain");
    for (const auto& [hq, q] : s.qps)
      if (q.qp->xrcd == x->second) return req.fail(EBUSY, "an XRC target QP of this session is in the domain");
    release_xrcd(x->second);
    s.xrcds.erase(x);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.object == UROCE_OBJ_PD) {
    auto p = s.pds.find(m.handle);
    if (p == s.pds.end()) return req.fail(EINVAL, "no such PD in this session");
    if (const int rc = eng_.dealloc_pd(p->second); rc != 0) return req.fail(rc, "the PD still has QPs or MRs");
    s.pds.erase(p);
    return req.reply(0, "", nullptr, 0);
  }
  return req.fail(EINVAL, "unknown object kind");
}

}  // namespace uroce::control
