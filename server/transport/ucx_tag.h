// The 64-bit UCP tag of one message of the UCX transport, and why it cannot
// match the wrong receive.
//
// Transport::Start's tag is 64 bits already, and a message must also name
// its group, its sender, its receiver and its place among the messages of
// the pair, so the tag cannot be carried verbatim. Instead:
//
//   bits 63..54  comm      (10)  the receiving node's communicator id for
//                                the call, unique among the calls alive on
//                                its worker (comm_ids.h); senders learn it
//                                in the plan agreement
//   bits 53..34  ordinal   (20)  the exchange's index on the endpoint
//                                (the n-th Start() call), mod 2^20
//   bits 33..30  tag check  (4)  a hash of Start's tag
//   bits 29..18  src rank  (12)  rank within the group, < 4096
//   bits 17..6   dst rank  (12)
//   bits  5..0   k          (6)  the k-th message src -> dst within the
//                                exchange, < 64
//
// The matching rule of transport.h (every rank calls Exchange for the same
// tag sequence) makes the exchange ordinal equal on every rank for the same
// tag, so (comm, ordinal, src, dst, k) identifies a message exactly among
// 2^20 consecutive exchanges of a call — far more than can be in flight.
// Receives match on the receiving worker, whichever endpoint a message came
// from, so the comm id only has to tell apart the calls alive on that one
// worker, and the receiver's allocator guarantees it. The only ways two
// messages can share a UCP tag are a message that outlived its exchange
// (its receive timed out) meeting the exchange 2^20 later with the same
// pair and k, and then the tag check must agree too (1 in 16); or a failed
// call's stray message still in UCX's unexpected queue when its receiver's
// id comes back, which first-in-first-out reuse delays for as long as
// possible (1023 other calls on that worker).
// The tag check also turns ranks that diverge from the tag sequence (a
// bug) into a DEADLINE_EXCEEDED naming the peers instead of silently
// swapped data, 15 times in 16. Receives use the full mask.
#ifndef HSAP_SERVER_TRANSPORT_UCX_TAG_H_
#define HSAP_SERVER_TRANSPORT_UCX_TAG_H_

#include <cstdint>

namespace hsap::transport::ucx_tag {

inline constexpr int kCommBits = 10;
inline constexpr int kOrdinalBits = 20;
inline constexpr int kCheckBits = 4;
inline constexpr int kRankBits = 12;
inline constexpr int kIndexBits = 6;
static_assert(kCommBits + kOrdinalBits + kCheckBits + 2 * kRankBits + kIndexBits == 64);

inline constexpr uint32_t kMaxComms = 1u << kCommBits;          // comm ids < this
inline constexpr int32_t kMaxRanks = 1 << kRankBits;            // group size <= this
inline constexpr int32_t kMaxMessagesPerPair = 1 << kIndexBits; // per exchange
inline constexpr uint64_t kFullMask = ~uint64_t{0};

// splitmix64's finalizer: a bijection that spreads every input bit.
inline constexpr uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// REQUIRES: comm < kMaxComms, 0 <= src, dst < kMaxRanks,
// 0 <= k < kMaxMessagesPerPair (the transport checks these).
inline constexpr uint64_t Encode(uint32_t comm, uint64_t ordinal, uint64_t tag, int32_t src,
                                 int32_t dst, int32_t k) {
  uint64_t t = comm;
  t = (t << kOrdinalBits) | (ordinal & ((uint64_t{1} << kOrdinalBits) - 1));
  t = (t << kCheckBits) | (Mix(tag) >> (64 - kCheckBits));
  t = (t << kRankBits) | static_cast<uint64_t>(src);
  t = (t << kRankBits) | static_cast<uint64_t>(dst);
  t = (t << kIndexBits) | static_cast<uint64_t>(k);
  return t;
}

}  // namespace hsap::transport::ucx_tag

#endif  // HSAP_SERVER_TRANSPORT_UCX_TAG_H_
