// LSE merging and work-item composition: splitting a key range into k pieces
// and merging their partial results must equal the unsplit computation, for
// MergePartial done by hand and for concurrent items sharing accumulators.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/test_util.h"

namespace hsap::kernels::cpu {
namespace {

using testing::TypedBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kSplitTolerance = 1e-6;

TEST(MergePartialTest, NegativeInfinityRulesAreExactAndNaNFree) {
  // Row 0: both -inf. Row 1: only b. Row 2: only a. Row 3: both finite.
  const int H = 1, D = 2;
  std::vector<float> o_a = {0, 0, 0, 0, 5, 6, 1, 3};
  std::vector<float> lse_a = {-kInf, -kInf, 0.5f, std::log(1.f)};
  const std::vector<float> o_b = {0, 0, 7, 8, 0, 0, 3, 5};
  const std::vector<float> lse_b = {-kInf, 2.f, -kInf, std::log(3.f)};
  MergePartial(H, D, 4, o_a.data(), lse_a.data(), o_b.data(), lse_b.data(), 4);
  EXPECT_EQ(o_a[0], 0.f);
  EXPECT_EQ(o_a[1], 0.f);
  EXPECT_EQ(lse_a[0], -kInf);
  EXPECT_EQ(o_a[2], 7.f);
  EXPECT_EQ(o_a[3], 8.f);
  EXPECT_EQ(lse_a[1], 2.f);
  EXPECT_EQ(o_a[4], 5.f);
  EXPECT_EQ(o_a[5], 6.f);
  EXPECT_EQ(lse_a[2], 0.5f);
  // Weights 1/4 and 3/4: (1*1 + 3*3)/4 = 2.5, (1*3 + 3*5)/4 = 4.5, lse = log 4.
  EXPECT_NEAR(o_a[6], 2.5f, 1e-6);
  EXPECT_NEAR(o_a[7], 4.5f, 1e-6);
  EXPECT_NEAR(lse_a[3], std::log(4.f), 1e-6);
}

TEST(MergePartialTest, EmptyRowWithStaleOutputEndsAtZero) {
  std::vector<float> o_a = {9.f, -9.f}, lse_a = {-kInf};
  const std::vector<float> o_b = {0.f, 0.f}, lse_b = {-kInf};
  MergePartial(1, 2, 1, o_a.data(), lse_a.data(), o_b.data(), lse_b.data(), 1);
  EXPECT_EQ(o_a[0], 0.f);
  EXPECT_EQ(o_a[1], 0.f);
  EXPECT_EQ(lse_a[0], -kInf);
}

// The slice [k_begin + a, k_begin + b) of `s`'s keys as a work-item slice:
// a CAUSAL offset shifts with the first key, the window does not.
MaskSlice KeyPiece(const MaskSlice& s, int64_t a, int64_t b) {
  MaskSlice p = s;
  p.k_begin = s.k_begin + a;
  p.k_end = s.k_begin + b;
  if (p.type == MaskType::kCausal) p.offset = s.offset - a;
  return p;
}

struct Problem {
  AttentionShape shape;
  int64_t nq, nk;
  MaskSlice slice;
};

FwdWorkItem MakeFwdItem(const Problem& p, const MaskSlice& s, const TypedBuffer& q,
                        const TypedBuffer& k, const TypedBuffer& v, float* o_acc,
                        float* lse_acc) {
  const int64_t q_row = int64_t{p.shape.num_heads_q} * p.shape.head_dim;
  const int64_t kv_row = int64_t{p.shape.num_heads_kv} * p.shape.head_dim;
  FwdWorkItem it;
  it.q = static_cast<const float*>(q.data()) + s.q_begin * q_row;
  it.k = static_cast<const float*>(k.data()) + s.k_begin * kv_row;
  it.v = static_cast<const float*>(v.data()) + s.k_begin * kv_row;
  it.num_q = s.num_q();
  it.num_k = s.num_k();
  it.type = s.type;
  it.offset = s.offset;
  it.window = s.window;
  it.o_acc = o_acc + s.q_begin * q_row;
  it.lse_acc = lse_acc + s.q_begin;
  it.lse_stride = p.nq;
  return it;
}

TEST(SplitMergeTest, KeySplitsMergeToTheUnsplitResult) {
  std::mt19937_64 rng(99);
  ThreadPool pool(2);
  double worst_manual = 0, worst_items = 0, worst_bwd = 0;
  for (int n = 0; n < 120; ++n) {
    Problem p;
    const int dims[] = {32, 64, 72, 128};
    p.shape = {2, 1, dims[rng() % 4], DType::kFloat32, 0.f};
    p.shape.num_heads_q = (rng() % 2 + 1) * p.shape.num_heads_kv;
    p.shape.softmax_scale = 1.f / std::sqrt(static_cast<float>(p.shape.head_dim));
    p.nq = 1 + rng() % 140;
    p.nk = 1 + rng() % 160;
    p.slice = {0, p.nq, 0, p.nk, MaskType::kCausal, 0, -1};
    switch (rng() % 4) {
      case 0: p.slice.type = MaskType::kFull; break;
      case 1: p.slice.offset = p.nk - p.nq; break;
      case 2: p.slice.offset = static_cast<int64_t>(rng() % (p.nq + p.nk)) - p.nq; break;
      default: p.slice.window = rng() % (p.nk + 1); break;
    }
    SCOPED_TRACE(SliceDebugString(p.slice));
    const int64_t q_elems = p.nq * p.shape.num_heads_q * p.shape.head_dim;
    const int64_t kv_elems = p.nk * p.shape.num_heads_kv * p.shape.head_dim;
    TypedBuffer q(DType::kFloat32, q_elems), k(DType::kFloat32, kv_elems),
        v(DType::kFloat32, kv_elems), dout(DType::kFloat32, q_elems);
    q.FillRandom(&rng, 1.f);
    k.FillRandom(&rng, 1.f);
    v.FillRandom(&rng, 1.f);
    dout.FillRandom(&rng, 1.f);

    // k pieces at random cut points (pieces may be empty).
    const int pieces = 2 + rng() % 3;
    std::vector<int64_t> cuts = {0, p.nk};
    for (int i = 1; i < pieces; ++i) cuts.push_back(rng() % (p.nk + 1));
    std::sort(cuts.begin(), cuts.end());

    const size_t lse_n = static_cast<size_t>(p.shape.num_heads_q * p.nq);
    std::vector<float> o_full(q_elems, 0.f), lse_full(lse_n, -kInf);
    const FwdWorkItem whole = MakeFwdItem(p, p.slice, q, k, v, o_full.data(), lse_full.data());
    Forward(p.shape, {&whole, 1}, &pool);

    // (a) each piece into its own accumulators, merged by hand.
    std::vector<float> o_merged(q_elems, 0.f), lse_merged(lse_n, -kInf);
    // (b) all pieces as items of one call, sharing accumulators.
    std::vector<float> o_shared(q_elems, 0.f), lse_shared(lse_n, -kInf);
    std::vector<FwdWorkItem> shared_items;
    std::vector<MaskSlice> piece_slices;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const MaskSlice piece = KeyPiece(p.slice, cuts[c], cuts[c + 1]);
      piece_slices.push_back(piece);
      std::vector<float> o_part(q_elems, 0.f), lse_part(lse_n, -kInf);
      const FwdWorkItem it = MakeFwdItem(p, piece, q, k, v, o_part.data(), lse_part.data());
      Forward(p.shape, {&it, 1}, &pool);
      MergePartial(p.shape.num_heads_q, p.shape.head_dim, p.nq, o_merged.data(),
                   lse_merged.data(), o_part.data(), lse_part.data(), p.nq);
      shared_items.push_back(MakeFwdItem(p, piece, q, k, v, o_shared.data(), lse_shared.data()));
    }
    Forward(p.shape, shared_items, &pool);

    auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
      return MaxRelativeError(std::vector<double>(a.begin(), a.end()),
                              std::vector<double>(b.begin(), b.end()));
    };
    const double e_manual = std::max(rel(o_merged, o_full), rel(lse_merged, lse_full));
    const double e_items = std::max(rel(o_shared, o_full), rel(lse_shared, lse_full));
    EXPECT_LE(e_manual, kSplitTolerance);
    EXPECT_LE(e_items, kSplitTolerance);
    worst_manual = std::max(worst_manual, e_manual);
    worst_items = std::max(worst_items, e_items);

    // Backward: the pieces as items sharing dQ/dK/dV equal the whole.
    std::vector<float> delta(lse_n);
    ComputeDelta(p.shape, o_full.data(), dout.data(), p.nq, delta.data(), p.nq, &pool);
    auto backward = [&](const std::vector<MaskSlice>& slices, std::vector<float>* dq,
                        std::vector<float>* dk, std::vector<float>* dv) {
      dq->assign(q_elems, 0.f);
      dk->assign(kv_elems, 0.f);
      dv->assign(kv_elems, 0.f);
      const int64_t q_row = int64_t{p.shape.num_heads_q} * p.shape.head_dim;
      const int64_t kv_row = int64_t{p.shape.num_heads_kv} * p.shape.head_dim;
      std::vector<BwdWorkItem> items;
      for (const MaskSlice& s : slices) {
        BwdWorkItem it;
        it.q = static_cast<const float*>(q.data()) + s.q_begin * q_row;
        it.dout = static_cast<const float*>(dout.data()) + s.q_begin * q_row;
        it.k = static_cast<const float*>(k.data()) + s.k_begin * kv_row;
        it.v = static_cast<const float*>(v.data()) + s.k_begin * kv_row;
        it.lse = lse_full.data() + s.q_begin;
        it.delta = delta.data() + s.q_begin;
        it.lse_stride = p.nq;
        it.num_q = s.num_q();
        it.num_k = s.num_k();
        it.type = s.type;
        it.offset = s.offset;
        it.window = s.window;
        it.dq_acc = dq->data() + s.q_begin * q_row;
        it.dk_acc = dk->data() + s.k_begin * kv_row;
        it.dv_acc = dv->data() + s.k_begin * kv_row;
        items.push_back(it);
      }
      Backward(p.shape, items, &pool);
    };
    std::vector<float> dq_a, dk_a, dv_a, dq_b, dk_b, dv_b;
    backward({p.slice}, &dq_a, &dk_a, &dv_a);
    backward(piece_slices, &dq_b, &dk_b, &dv_b);
    const double e_bwd = std::max({rel(dq_b, dq_a), rel(dk_b, dk_a), rel(dv_b, dv_a)});
    EXPECT_LE(e_bwd, kSplitTolerance);
    worst_bwd = std::max(worst_bwd, e_bwd);
  }
  std::printf("split/merge worst: manual %.3g, shared items %.3g, backward %.3g\n", worst_manual,
              worst_items, worst_bwd);
}

}  // namespace
}  // namespace hsap::kernels::cpu
