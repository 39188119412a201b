// The algorithms there are. Adding one: write its class (a header and a
// source file, the .cc added to meson.build's list), then its #include and a
// line here with its name, a sentence, and a factory (docs/research.md).
#include <algorithm>
#include <bit>
#include <cmath>

#include "stack/cc/dcqcn.h"
#include "stack/cc/swift.h"

namespace uroce::cc {

namespace {
template <typename A>
std::unique_ptr<Algorithm> make(const Path& p) {
  return std::make_unique<A>(p);
}

constexpr Entry kAlgorithms[] = {
    {"none", "no congestion control: the engine's fixed window, unpaced (or set_rate's rate)", nullptr},
    {"dcqcn", "DCQCN's reaction point: rate cut by alpha/2 on a CNP, fast recovery, additive and hyper increase",
     &make<Dcqcn>, true},
    {"swift", "a Swift-style delay-target window from the requester's RTT samples", &make<Swift>},
};
}  // namespace

std::span<const Entry> registry() { return kAlgorithms; }

const Entry* find(std::string_view name) {
  for (const Entry& e : kAlgorithms)
    if (e.name == name) return &e;
  return nullptr;
}

std::string ud_refusal(std::string_view name) {
  std::string ok;
  for (const Entry& e : kAlgorithms)
    if (!e.make || e.ud) ok += (ok.empty() ? "" : ", ") + std::string(e.name);
  return std::string(name) + " needs ACKs, which a UD QP does not get (a UD QP takes " + ok + ")";
}

// ------------------------------------------------------------------ RttStats

int RttStats::bucket(std::uint64_t ns) {
  if (ns < kSub) return static_cast<int>(ns);
  const int e = std::bit_width(ns) - 1;  // ns in [2^e, 2^(e+1))
  const int sub = static_cast<int>((ns >> (e - 2)) & (kSub - 1));
  return std::min(e * kSub + sub, kBuckets - 1);
}

std::uint64_t RttStats::upper(int b) {
  if (b < kSub) return static_cast<std::uint64_t>(b);
  const int e = b / kSub, sub = b % kSub;
  return (std::uint64_t{1} << e) + (std::uint64_t{static_cast<unsigned>(sub) + 1} << (e - 2)) - 1;
}

void RttStats::add(std::uint64_t ns) {
  ++hist_[bucket(ns)];
  if (n_ == 0 || ns < min_) min_ = ns;
  max_ = std::max(max_, ns);
  sum_ += ns;
  ++n_;
  last_ = ns;
}

std::uint64_t RttStats::quantile(double q) const {
  if (n_ == 0) return 0;
  const auto want = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n_)));
  std::uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += hist_[b];
    if (seen >= want && hist_[b]) return std::min(upper(b), max_);
  }
  return max_;
}

}  // namespace uroce::cc
