// The timing wheel alone (every entry fires once, never early, at the first
// expire() at or after its deadline, across many turns of the wheel;
// cancel and move; next_at never later than the earliest deadline), and in
// the engine: QPs that wait only on their retry timers are off the active
// list, in the wheel, and still time out and retry; an ACK that leaves a QP
// nothing to send moves its timer without a visit of the poll loop.
#include <gtest/gtest.h>

#include <random>

#include "stack/transport/timer_wheel.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

struct Item {
  transport::WheelHook<Item> hook;
  std::uint64_t due = 0;  // 0: not scheduled (the model)
  int fired = 0;
};
using Wheel = transport::TimerWheel<Item, &Item::hook>;

TEST(TimerWheel, FiresEachEntryOnceNeverEarlyAndAsSoonAsDue) {
  std::mt19937_64 rng(7);
  std::vector<Item> items(2000);
  auto wheel = std::make_unique<Wheel>();
  std::uint64_t now = 1'000'000;
  std::uint64_t fired = 0, scheduled = 0;
  for (int round = 0; round < 3000; ++round) {
    // Schedule, move or cancel a few (deadlines up to 5 turns ahead, some already past).
    for (int k = 0; k < 4; ++k) {
      Item& it = items[rng() % items.size()];
      const int what = static_cast<int>(rng() % 8);
      if (what == 0) {
        wheel->cancel(it);
        it.due = 0;
      } else {
        const std::uint64_t at = now + (rng() % 22'000'000) - 2'000;
        if (it.due == 0) ++scheduled;
        wheel->schedule(it, at);
        it.due = at;
      }
    }
    std::uint64_t earliest = 0;
    std::size_t pending = 0;
    for (const Item& it : items)
      if (it.due != 0) {
        ++pending;
        if (earliest == 0 || it.due < earliest) earliest = it.due;
      }
    ASSERT_EQ(wheel->size(), pending);
    const std::uint64_t next = wheel->next_at();
    if (pending != 0) {
      ASSERT_NE(next, 0u);
      ASSERT_LE(next, std::max(earliest, now)) << "never later than the earliest deadline";
    } else {
      ASSERT_EQ(next, 0u);
    }
    now += 1 + rng() % 40'000;  // up to 40 us a step
    wheel->expire(now, [&](Item& it) {
      ASSERT_NE(it.due, 0u) << "only what is scheduled fires";
      ASSERT_LE(it.due, now) << "never early";
      ++it.fired;
      it.due = 0;
      ++fired;
    });
    for (const Item& it : items) ASSERT_TRUE(it.due == 0 || it.due > now) << "everything due has fired";
  }
  EXPECT_GT(fired, 3000u);
  std::uint64_t by_item = 0;
  for (const Item& it : items) by_item += static_cast<std::uint64_t>(it.fired);
  EXPECT_EQ(by_item, fired);
  EXPECT_LE(fired, scheduled);
}

TEST(TimerWheel, NextAtIsExactWithFewEntries) {
  auto wheel = std::make_unique<Wheel>();
  Item a, b;
  wheel->schedule(a, 50'000'000);  // beyond a turn
  wheel->schedule(b, 3'000'000);
  EXPECT_EQ(wheel->next_at(), 3'000'000u);
  wheel->cancel(b);
  EXPECT_EQ(wheel->next_at(), 50'000'000u);
  wheel->schedule(a, 7'000);  // moved
  EXPECT_EQ(wheel->next_at(), 7'000u);
  EXPECT_EQ(wheel->size(), 1u);
}

TEST(TimerWheel, QpsWaitingOnlyOnTimersAreOffTheActiveList) {
  // 100 QP pairs, one WRITE each, every ACK lost: after the sends, no QP
  // is polled until its retry timer (in the wheel) comes due; then each
  // resends once, and with the ACKs back every WRITE completes.
  Pair p(3, 4u << 20, 256);
  std::vector<QpPair> qs;
  for (int i = 0; i < 100; ++i) qs.push_back(p.connect());
  sim::Impairments imp;
  imp.loss = 1.0;
  imp.filter = [](const TxFrame& f) { return f.opcode == wire::op::kRcAck; };
  p.wire.set_impairments(imp);
  Sge s = p.sge(0, 0, 8);
  for (std::size_t i = 0; i < qs.size(); ++i) ASSERT_EQ(p.A().post_send(qs[i].a, p.write_to(1, s, 4096, i)), 0);
  p.wire.run_until([&] { return p.wire.stats().dropped >= qs.size(); }, 1'000'000);
  ASSERT_EQ(p.wire.stats().dropped, qs.size());
  p.A().poll(p.wire.now());
  EXPECT_EQ(p.A().active_count(), 0u) << "nothing to do but wait";
  EXPECT_EQ(p.A().timers_pending(), qs.size()) << "each QP's retry timer is in the wheel";
  for (const QpPair& q : qs) EXPECT_EQ(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  imp.loss = 0;
  p.wire.set_impairments(imp);
  std::vector<ibv_wc> wc;
  ASSERT_TRUE(p.wire.run_until([&] { return p.poll(0, wc) >= 0 && wc.size() == qs.size(); },
                               4 * transport::timeout_ns(PairOptions{}.timeout)));
  for (const ibv_wc& c : wc) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  for (const QpPair& q : qs) {
    EXPECT_EQ(q.a->ctr[QpCounter::timeouts], 1u);
    EXPECT_EQ(q.a->ctr[QpCounter::retransmitted_pkts], 1u);
  }
  p.A().poll(p.wire.now());
  EXPECT_EQ(p.A().timers_pending(), 0u) << "nothing outstanding: no timer";
}

TEST(TimerWheel, AnAckThatLeavesNothingToSendNeedsNoVisit) {
  // Frames cross by hand (poll, drain, rx), so what an ACK does is seen
  // before A polls again.
  Pair p(3, 4u << 20, 256);
  std::vector<QpPair> qs;
  for (int i = 0; i < 50; ++i) qs.push_back(p.connect());
  std::vector<std::uint8_t> buf(16384);
  std::uint64_t now = p.wire.now() + 1000;
  const auto cross = [&](Engine& from, Engine& to) {
    from.poll(now);
    from.drain_tx([&](const TxFrame& f) { to.rx(wire::ConstBytes(buf.data(), f.copy_to(buf)), now); });
    now += 1000;
  };
  Sge s = p.sge(0, 0, 8);
  for (std::size_t i = 0; i < qs.size(); ++i) ASSERT_EQ(p.A().post_send(qs[i].a, p.write_to(1, s, 4096, i)), 0);
  // A paced QP with a second WRITE: the pacer holds it, so after the first
  // one's ACK it has more to send, and that ACK must bring a visit.
  ASSERT_EQ(p.A().set_rate(qs[0].a, 1'000'000), 0);
  ASSERT_EQ(p.A().post_send(qs[0].a, p.write_to(1, s, 8192, 99)), 0);
  cross(p.A(), p.B());
  EXPECT_EQ(p.A().active_count(), 0u);
  EXPECT_EQ(p.A().timers_pending(), qs.size()) << "each QP's retry timer (and the pacer's) is in the wheel";
  cross(p.B(), p.A());  // the ACKs
  EXPECT_EQ(p.A().active_count(), 1u) << "only the QP with a WRITE still to send is to be visited";
  EXPECT_EQ(p.A().timers_pending(), 1u) << "the others' retry timers are out at once (the paced one's stays until its visit)";
  std::vector<ibv_wc> wc;
  ASSERT_EQ(p.poll(0, wc), static_cast<int>(qs.size()));
  for (const ibv_wc& c : wc) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  // The paced QP's second WRITE still goes, and completes.
  wc.clear();
  for (int k = 0; k < 200 && wc.empty(); ++k) {
    now += 100'000;
    cross(p.A(), p.B());
    cross(p.B(), p.A());
    p.poll(0, wc);
  }
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 99u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace uroce::testing
