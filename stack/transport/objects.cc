#include "stack/transport/objects.h"

namespace uroce::transport {

MrTable::MrTable(std::uint32_t capacity, std::uint64_t seed)
    : slots_(capacity), last_byte_(capacity), rng_(seed) {
  free_.reserve(capacity);
  // Index 0 is never handed out, so key 0 is never valid.
  for (std::uint32_t i = capacity; i-- > 1;) free_.push_back(i);
}

Mr* MrTable::reg(Pd* pd, void* addr, std::uint64_t len, unsigned access, std::uint64_t iova) {
  if (free_.empty()) return nullptr;
  const std::uint32_t idx = free_.back();
  free_.pop_back();
  std::uint8_t byte;
  do {
    byte = static_cast<std::uint8_t>(rng_());
  } while (byte == last_byte_[idx]);
  last_byte_[idx] = byte;
  Mr& m = slots_[idx];
  m = Mr{};
  m.pd = pd;
  m.addr = static_cast<std::uint8_t*>(addr);
  m.iova = iova;
  m.length = len;
  m.access = access;
  m.lkey = m.rkey = (idx << 8) | byte;
  m.valid = true;
  m.remote_ok = (access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  ++pd->refs;
  ++in_use_;
  return &m;
}

void MrTable::dereg(Mr* mr) {
  if (mr == nullptr || !mr->valid) return;
  const std::uint32_t idx = mr->lkey >> 8;
  --mr->pd->refs;
  *mr = Mr{};
  free_.push_back(idx);
  --in_use_;
}

Mr* MrTable::find(std::uint32_t key) const {
  const std::uint32_t idx = key >> 8;
  if (idx == 0 || idx >= slots_.size()) return nullptr;
  const Mr& m = slots_[idx];
  if (!m.valid || m.lkey != key) return nullptr;
  return const_cast<Mr*>(&m);
}

KeyCheck MrTable::check(std::uint32_t key, bool remote, const Pd* pd, std::uint64_t va, std::uint64_t len,
                        unsigned need, std::uint8_t** out) const {
  const Mr* m = find(key);
  if (m == nullptr || (remote && !m->remote_ok)) return KeyCheck::kBadKey;
  if (m->pd != pd) return KeyCheck::kWrongPd;
  if (va < m->iova || len > m->length || va - m->iova > m->length - len) return KeyCheck::kOutOfBounds;
  if ((m->access & need) != need) return KeyCheck::kNoPermission;
  *out = m->addr + (va - m->iova);
  return KeyCheck::kOk;
}

bool MrTable::invalidate(std::uint32_t rkey, const Pd* pd) {
  Mr* m = find(rkey);
  if (m == nullptr || m->pd != pd || !m->remote_ok) return false;
  m->remote_ok = false;
  return true;
}

}  // namespace uroce::transport
