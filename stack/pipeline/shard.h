// Sharding a port between pipelines: which shard's engine a received frame
// goes to. RoCE by its DestQP, as the engines' QPN spaces say
// (transport/qpn_space.h); ARP and ICMPv6 (neighbour discovery) to every
// shard, so each learns its neighbours; everything else to shard 0, which
// answers the host's traffic. The only place a frame is classified for this.
#pragma once

#include <cstdint>

#include "stack/wire/be.h"

namespace uroce::pipeline {

/// The shard of `shards` that owns `frame`, or -1 for every shard. It reads
/// only the headers up to the BTH's DestQP, and checks nothing the owner's
/// own parse checks (the ICRC, the lengths past the BTH).
int frame_owner(wire::ConstBytes frame, std::uint16_t shards);

}  // namespace uroce::pipeline
