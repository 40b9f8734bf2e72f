#include "server/transport/inprocess_transport.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace hsap::transport {
namespace internal {
namespace {

struct ExchangeState;

enum class OpState { kPosted, kCopying, kDone, kFailed, kWithdrawn };

// One send or receive of an exchange.
struct Op {
  bool is_send = false;
  int32_t peer = 0;
  void* data = nullptr;  // const for sends
  int64_t bytes = 0;
  OpState state = OpState::kPosted;
  ExchangeState* owner = nullptr;
};

// What one Start() posted. Ops never move (the vector is sized once).
struct ExchangeState {
  uint64_t tag = 0;
  int32_t rank = 0;
  std::vector<Op> ops;
  int remaining = 0;     // ops neither done nor failed
  int copying = 0;       // ops of this exchange whose bytes are being copied
  absl::Status error;    // first failure of one of its ops
  bool finished = false;  // Wait returned (or the exchange was withdrawn)
};

// (tag, source, destination).
using Key = std::tuple<uint64_t, int32_t, int32_t>;

struct Mailbox {
  std::deque<Op*> sends;  // posted, unmatched
  std::deque<Op*> recvs;
};

}  // namespace

class FabricCore {
 public:
  FabricCore(int32_t num_ranks, int32_t devices_per_node)
      : num_ranks_(num_ranks), devices_per_node_(devices_per_node), endpoints_(num_ranks) {}

  int32_t num_ranks() const { return num_ranks_; }
  Tier TierOf(int32_t a, int32_t b) const {
    return a / devices_per_node_ == b / devices_per_node_ ? Tier::kIntraNode : Tier::kInterNode;
  }

  absl::StatusOr<std::unique_ptr<ExchangeState>> Start(int32_t rank, uint64_t tag,
                                                       absl::Span<const SendOp> sends,
                                                       absl::Span<const RecvOp> recvs);
  absl::Status Wait(ExchangeState* ex, absl::Time deadline);
  // Withdraws what is still posted and waits for copies in progress.
  void Withdraw(ExchangeState* ex);
  void Abort(int32_t rank, const absl::Status& reason);
  TransferCounters Counters(int32_t rank) const;

 private:
  struct EndpointState {
    absl::Status aborted;
    TransferCounters counters;
  };
  struct Pair {
    Op* send;
    Op* recv;
  };

  void WithdrawLocked(ExchangeState* ex) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(Op* op, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string OwedLocked(const ExchangeState& ex) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t num_ranks_;
  const int32_t devices_per_node_;
  mutable absl::Mutex mu_;
  std::map<Key, Mailbox> mailboxes_ ABSL_GUARDED_BY(mu_);
  std::vector<EndpointState> endpoints_ ABSL_GUARDED_BY(mu_);
};

void FabricCore::Fail(Op* op, const absl::Status& status) {
  op->state = OpState::kFailed;
  ExchangeState* ex = op->owner;
  --ex->remaining;
  if (ex->error.ok()) ex->error = status;
}

absl::StatusOr<std::unique_ptr<ExchangeState>> FabricCore::Start(int32_t rank, uint64_t tag,
                                                                 absl::Span<const SendOp> sends,
                                                                 absl::Span<const RecvOp> recvs) {
  auto check = [&](const char* what, size_t i, int32_t peer, const void* data,
                   int64_t bytes) -> absl::Status {
    if (peer < 0 || peer >= num_ranks_) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " exchange tag ", tag, ": ",
                                                     what, "[", i, "].peer (", peer,
                                                     ") is not in [0, ", num_ranks_, ")"));
    }
    if (bytes < 0 || (bytes > 0 && data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " exchange tag ", tag, ": ",
                                                     what, "[", i, "] has ", bytes,
                                                     " bytes at ", data == nullptr ? "null" : "",
                                                     data == nullptr ? "" : "a valid address"));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < sends.size(); ++i) {
    absl::Status s = check("sends", i, sends[i].peer, sends[i].data, sends[i].bytes);
    if (!s.ok()) return s;
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    absl::Status s = check("recvs", i, recvs[i].peer, recvs[i].data, recvs[i].bytes);
    if (!s.ok()) return s;
  }
  auto ex = std::make_unique<ExchangeState>();
  ex->tag = tag;
  ex->rank = rank;
  ex->ops.resize(sends.size() + recvs.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    ex->ops[i] = {true, sends[i].peer, const_cast<void*>(sends[i].data), sends[i].bytes,
                  OpState::kPosted, ex.get()};
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    ex->ops[sends.size() + i] = {false, recvs[i].peer, recvs[i].data, recvs[i].bytes,
                                 OpState::kPosted, ex.get()};
  }
  ex->remaining = static_cast<int>(ex->ops.size());

  std::vector<Pair> pairs;
  {
    absl::MutexLock lock(&mu_);
    if (!endpoints_[rank].aborted.ok()) return endpoints_[rank].aborted;
    for (Op& op : ex->ops) {
      const Key key = op.is_send ? Key{tag, rank, op.peer} : Key{tag, op.peer, rank};
      Mailbox& box = mailboxes_[key];
      std::deque<Op*>& mine = op.is_send ? box.sends : box.recvs;
      std::deque<Op*>& theirs = op.is_send ? box.recvs : box.sends;
      if (theirs.empty()) {
        mine.push_back(&op);
        continue;
      }
      Op* other = theirs.front();
      theirs.pop_front();
      if (box.sends.empty() && box.recvs.empty()) mailboxes_.erase(key);
      Pair p = op.is_send ? Pair{&op, other} : Pair{other, &op};
      if (p.send->bytes != p.recv->bytes) {
        const int32_t src = p.send->owner->rank, dst = p.recv->owner->rank;
        const absl::Status s = absl::InternalError(absl::StrCat(
            "exchange tag ", tag, ": rank ", src, " sends ", p.send->bytes, " bytes to rank ",
            dst, ", which expects ", p.recv->bytes, " bytes from it"));
        Fail(p.send, s);
        Fail(p.recv, s);
        continue;
      }
      p.send->state = p.recv->state = OpState::kCopying;
      ++p.send->owner->copying;
      ++p.recv->owner->copying;
      pairs.push_back(p);
    }
  }
  // Copy outside the lock: both halves are kCopying, so neither owner can
  // withdraw its buffers until the copy is accounted for below.
  for (const Pair& p : pairs) {
    if (p.send->bytes > 0) std::memcpy(p.recv->data, p.send->data, p.send->bytes);
  }
  if (!pairs.empty()) {
    absl::MutexLock lock(&mu_);
    for (const Pair& p : pairs) {
      const int32_t src = p.send->owner->rank, dst = p.recv->owner->rank;
      const int tier = static_cast<int>(TierOf(src, dst));
      endpoints_[src].counters.sent_bytes[tier] += p.send->bytes;
      endpoints_[dst].counters.received_bytes[tier] += p.recv->bytes;
      for (Op* op : {p.send, p.recv}) {
        op->state = OpState::kDone;
        --op->owner->remaining;
        --op->owner->copying;
      }
    }
  }
  return ex;
}

std::string FabricCore::OwedLocked(const ExchangeState& ex) const {
  std::vector<std::string> owed;
  for (const Op& op : ex.ops) {
    if (op.state == OpState::kPosted || op.state == OpState::kCopying) {
      owed.push_back(absl::StrCat(op.is_send ? "send to rank " : "receive from rank ", op.peer,
                                  " (", op.bytes, " bytes)"));
    }
  }
  return absl::StrJoin(owed, ", ");
}

absl::Status FabricCore::Wait(ExchangeState* ex, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const EndpointState* ep = &endpoints_[ex->rank];
  struct Ready {
    const ExchangeState* ex;
    const EndpointState* ep;
    bool operator()() const { return ex->remaining == 0 || !ex->error.ok() || !ep->aborted.ok(); }
  } ready{ex, ep};
  const bool woke = mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  absl::Status status;
  if (!ep->aborted.ok()) {
    status = ep->aborted;
  } else if (!ex->error.ok()) {
    status = ex->error;
  } else if (!woke) {
    status = absl::DeadlineExceededError(absl::StrCat(
        "rank ", ex->rank, " exchange tag ", ex->tag, ": deadline passed; still owed: ",
        OwedLocked(*ex)));
  }
  if (status.ok() && ex->remaining == 0) {
    ex->finished = true;
    return absl::OkStatus();
  }
  WithdrawLocked(ex);
  return status;
}

void FabricCore::WithdrawLocked(ExchangeState* ex) {
  for (Op& op : ex->ops) {
    if (op.state != OpState::kPosted) continue;
    const Key key = op.is_send ? Key{ex->tag, ex->rank, op.peer} : Key{ex->tag, op.peer, ex->rank};
    auto it = mailboxes_.find(key);
    if (it != mailboxes_.end()) {
      std::deque<Op*>& q = op.is_send ? it->second.sends : it->second.recvs;
      q.erase(std::remove(q.begin(), q.end(), &op), q.end());
      if (it->second.sends.empty() && it->second.recvs.empty()) mailboxes_.erase(it);
    }
    op.state = OpState::kWithdrawn;
    --ex->remaining;
  }
  // A peer may be copying into or out of our buffers right now: a bounded
  // memcpy, so waiting for it without a deadline cannot hang.
  mu_.Await(absl::Condition(
      +[](ExchangeState* e) { return e->copying == 0; }, ex));
  ex->finished = true;
}

void FabricCore::Withdraw(ExchangeState* ex) {
  absl::MutexLock lock(&mu_);
  if (!ex->finished) WithdrawLocked(ex);
}

void FabricCore::Abort(int32_t rank, const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (endpoints_[rank].aborted.ok()) {
    endpoints_[rank].aborted =
        reason.ok() ? absl::AbortedError(absl::StrCat("rank ", rank, " aborted")) : reason;
  }
}

TransferCounters FabricCore::Counters(int32_t rank) const {
  absl::MutexLock lock(&mu_);
  return endpoints_[rank].counters;
}

namespace {

class InProcessPending : public PendingExchange {
 public:
  InProcessPending(FabricCore* core, std::unique_ptr<ExchangeState> ex)
      : core_(core), ex_(std::move(ex)) {}
  ~InProcessPending() override { core_->Withdraw(ex_.get()); }
  absl::Status Wait(absl::Time deadline) override { return core_->Wait(ex_.get(), deadline); }

 private:
  FabricCore* core_;
  std::unique_ptr<ExchangeState> ex_;
};

class InProcessEndpoint : public Transport {
 public:
  InProcessEndpoint(FabricCore* core, int32_t rank) : core_(core), rank_(rank) {}
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return core_->num_ranks(); }
  Tier TierOf(int32_t peer) const override { return core_->TierOf(rank_, peer); }
  absl::StatusOr<std::unique_ptr<PendingExchange>> Start(uint64_t tag,
                                                         absl::Span<const SendOp> sends,
                                                         absl::Span<const RecvOp> recvs) override {
    auto ex = core_->Start(rank_, tag, sends, recvs);
    if (!ex.ok()) return ex.status();
    return std::unique_ptr<PendingExchange>(new InProcessPending(core_, std::move(*ex)));
  }
  void Abort(const absl::Status& reason) override { core_->Abort(rank_, reason); }
  TransferCounters counters() const override { return core_->Counters(rank_); }

 private:
  FabricCore* core_;
  int32_t rank_;
};

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<InProcessFabric>> InProcessFabric::Create(
    int32_t num_ranks, int32_t devices_per_node) {
  if (num_ranks < 1 || devices_per_node < 1 || num_ranks % devices_per_node != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process fabric: num_ranks (", num_ranks,
                     ") must be a positive multiple of devices_per_node (", devices_per_node, ")"));
  }
  return std::unique_ptr<InProcessFabric>(new InProcessFabric(
      std::make_unique<internal::FabricCore>(num_ranks, devices_per_node)));
}

InProcessFabric::InProcessFabric(std::unique_ptr<internal::FabricCore> core)
    : core_(std::move(core)) {
  endpoints_.reserve(core_->num_ranks());
  for (int32_t r = 0; r < core_->num_ranks(); ++r) {
    endpoints_.push_back(std::make_unique<internal::InProcessEndpoint>(core_.get(), r));
  }
}

InProcessFabric::~InProcessFabric() = default;

int32_t InProcessFabric::size() const { return core_->num_ranks(); }

Transport* InProcessFabric::endpoint(int32_t rank) { return endpoints_[rank].get(); }

void InProcessFabric::AbortAll(const absl::Status& reason) {
  for (int32_t r = 0; r < core_->num_ranks(); ++r) core_->Abort(r, reason);
}

}  // namespace hsap::transport
