/* host_addrs: the host's interface addresses as getifaddrs() gives them,
 * one "NAME ADDRESS" line each (IPv4 and IPv6): what libraries that look
 * for RDMA interfaces by address see. Plain C against glibc. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>

int main(void) {
  struct ifaddrs *list, *i;
  char text[INET6_ADDRSTRLEN];
  if (getifaddrs(&list) != 0) {
    perror("getifaddrs");
    return 1;
  }
  for (i = list; i; i = i->ifa_next) {
    const void *a = NULL;
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET) a = &((struct sockaddr_in *)i->ifa_addr)->sin_addr;
    if (i->ifa_addr->sa_family == AF_INET6) a = &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
    if (a && inet_ntop(i->ifa_addr->sa_family, a, text, sizeof text)) printf("%s %s\n", i->ifa_name, text);
  }
  freeifaddrs(list);
  return 0;
}
