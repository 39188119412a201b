// Datagram rsockets (rsocket_dgram.cc), for rsocket.cc's calls: each takes
// the socket's number and answers like the call it serves. Internal to
// uroce's librdmacm.
#ifndef UROCE_RDMACM_RSOCKET_DGRAM_H
#define UROCE_RDMACM_RSOCKET_DGRAM_H

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <vector>

namespace uroce::rsockets {

/// A new datagram rsocket: its number, or -1 with errno.
int dgram_socket(int domain, int type);
/// Whether `s` is a datagram rsocket.
bool is_dgram(int s);

int dgram_bind(int s, const sockaddr* addr, socklen_t len);
int dgram_connect(int s, const sockaddr* addr, socklen_t len);
/// `to` null: the connected peer's.
ssize_t dgram_sendto(int s, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t tolen);
ssize_t dgram_recvfrom(int s, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen);
int dgram_close(int s);
int dgram_getsockname(int s, sockaddr* addr, socklen_t* len);
int dgram_getpeername(int s, sockaddr* addr, socklen_t* len);
int dgram_setsockopt(int s, int level, int name, const void* val, socklen_t len);
int dgram_getsockopt(int s, int level, int name, void* val, socklen_t* len);
int dgram_fcntl(int s, int cmd, int arg);

/// rpoll's look, without waiting: the events that hold.
short dgram_poll(int s, short events);
/// Before rpoll sleeps: arms the socket's CQs and adds what wakes it.
void dgram_arm(int s, std::vector<pollfd>& wake);

}  // namespace uroce::rsockets

#endif
