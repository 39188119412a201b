// uroced: the uroce dataplane daemon. One node (control/node) for every
// application on the host.
//
//   uroced --port net_memif0 --vdev net_memif0,role=server,socket=/tmp/m.sock
//          --ip 10.0.0.1 --no-huge [--config FILE] [--app-socket PATH ...]
//
// Every option can also come from a config file (key = value, same names).

#include "control/node/node.h"

int main(int argc, char** argv) { return uroce::control::host_main("uroced", argc, argv); }
