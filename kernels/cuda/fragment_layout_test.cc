// The kernels' fragment addressing (fragment_layout.h) through a CPU model of
// one warp's ldmatrix.x4 (with and without .trans) and mma.sync m16n8k16,
// following the PTX ISA's fragment tables. Each test forms one of the
// products the attention kernels form, with the same address expressions,
// and compares it with a plain loop. Integer-valued inputs keep every sum
// exact, so equality is exact.
#include "kernels/cuda/fragment_layout.h"

#include <array>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace hsap::kernels::cuda {
namespace {

// One 32-bit register holding two 16-bit elements (lo = lower address).
struct Reg {
  float lo = 0, hi = 0;
};
using Frag4 = std::array<std::array<Reg, 4>, 32>;  // [lane][register]
using Acc = std::array<std::array<float, 4>, 32>;   // [lane][register]

// Shared memory: `rows` rows of `stride` elements.
struct Smem {
  int stride;
  std::vector<float> data;
  Smem(int rows, int stride) : stride(stride), data(rows * stride, 0.f) {}
  float& at(int r, int c) { return data[r * stride + c]; }
};

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l supplies the
// element offset of row l % 8 of matrix l / 8 via `address`.
Frag4 LdMatrixX4(const Smem& s, const std::function<int(int)>& address, bool trans) {
  Frag4 out;
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) {
      auto row_start = [&](int r) { return address(8 * i + r); };
      if (!trans) {
        out[l][i].lo = s.data[row_start(l / 4) + 2 * (l % 4)];
        out[l][i].hi = s.data[row_start(l / 4) + 2 * (l % 4) + 1];
      } else {
        out[l][i].lo = s.data[row_start(2 * (l % 4)) + l / 4];
        out[l][i].hi = s.data[row_start(2 * (l % 4) + 1) + l / 4];
      }
    }
  }
  return out;
}

// mma.sync.aligned.m16n8k16.row.col.f32: c += A(a) * B(b); b holds the two
// registers b[0], b[1] of each lane.
void Mma(Acc* c, const std::array<std::array<Reg, 4>, 32>& a,
         const std::array<std::array<Reg, 2>, 32>& b) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    A[g][2 * t] = a[l][0].lo, A[g][2 * t + 1] = a[l][0].hi;
    A[g + 8][2 * t] = a[l][1].lo, A[g + 8][2 * t + 1] = a[l][1].hi;
    A[g][2 * t + 8] = a[l][2].lo, A[g][2 * t + 9] = a[l][2].hi;
    A[g + 8][2 * t + 8] = a[l][3].lo, A[g + 8][2 * t + 9] = a[l][3].hi;
    B[2 * t][g] = b[l][0].lo, B[2 * t + 1][g] = b[l][0].hi;
    B[2 * t + 8][g] = b[l][1].lo, B[2 * t + 9][g] = b[l][1].hi;
    C[g][2 * t] = (*c)[l][0], C[g][2 * t + 1] = (*c)[l][1];
    C[g + 8][2 * t] = (*c)[l][2], C[g + 8][2 * t + 1] = (*c)[l][3];
  }
  for (int l = 0; l < 32; ++l) {
    for (int e = 0; e < 4; ++e) {
      const int r = AccRow(l, e), col = AccCol(l, e);
      float sum = C[r][col];
      for (int k = 0; k < 16; ++k) sum += A[r][k] * B[k][col];
      (*c)[l][e] = sum;
    }
  }
}

// Registers {first, first + 1} of each lane as a B operand.
std::array<std::array<Reg, 2>, 32> BHalf(const Frag4& f, int first) {
  std::array<std::array<Reg, 2>, 32> b;
  for (int l = 0; l < 32; ++l) b[l] = {f[l][first], f[l][first + 1]};
  return b;
}

void FillRandom(Smem* s, std::mt19937* rng) {
  for (float& x : s->data) x = static_cast<float>(static_cast<int>((*rng)() % 7) - 3);
}

constexpr int kD = 32;        // head dim of the model tiles
constexpr int kS = kD + 8;    // padded smem stride, as the kernels

// Forward S = Q·K^T: Q rows of warp w from [rows][D], K block as [keys][D].
TEST(FragmentLayoutTest, QKTransposeAsInForward) {
  std::mt19937 rng(1);
  const int warp = 1;
  Smem q(32, kS), k(16, kS);
  FillRandom(&q, &rng);
  FillRandom(&k, &rng);
  Acc s[2] = {};
  for (int kk = 0; kk < kD / 16; ++kk) {
    const Frag4 a = LdMatrixX4(q, [&](int lane) {
      const LaneRowCol p = LdmRowMajorA(lane);
      return (warp * 16 + p.row) * kS + kk * 16 + p.col;
    }, false);
    const Frag4 b = LdMatrixX4(k, [&](int lane) {
      const LaneRowCol p = LdmBPair(lane);
      return (0 * 8 + p.row) * kS + kk * 16 + p.col;
    }, false);
    Mma(&s[0], a, BHalf(b, 0));
    Mma(&s[1], a, BHalf(b, 2));
  }
  for (int j = 0; j < 2; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        float want = 0;
        for (int d = 0; d < kD; ++d) {
          want += q.at(warp * 16 + AccRow(l, e), d) * k.at(j * 8 + AccCol(l, e), d);
        }
        ASSERT_EQ(s[j][l][e], want) << "tile " << j << " lane " << l << " reg " << e;
      }
    }
  }
}

// Forward O += P·V: P from two S tiles re-packed in registers, V as [keys][D].
TEST(FragmentLayoutTest, PVWithPFromAccumulatorsAsInForward) {
  std::mt19937 rng(2);
  Smem v(16, kS);
  FillRandom(&v, &rng);
  float p[16][16];
  Acc s[2];
  for (int j = 0; j < 2; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        s[j][l][e] = static_cast<float>(static_cast<int>(rng() % 5) - 2);
        p[AccRow(l, e)][j * 8 + AccCol(l, e)] = s[j][l][e];
      }
    }
  }
  std::array<std::array<Reg, 4>, 32> a;  // the kernel's {Pack(s0[0], s0[1]), ...}
  for (int l = 0; l < 32; ++l) {
    a[l] = {Reg{s[0][l][0], s[0][l][1]}, Reg{s[0][l][2], s[0][l][3]}, Reg{s[1][l][0], s[1][l][1]},
            Reg{s[1][l][2], s[1][l][3]}};
  }
  Acc o[kD / 8] = {};
  for (int j = 0; j < kD / 8; j += 2) {
    const Frag4 b = LdMatrixX4(v, [&](int lane) {
      const LaneRowCol r = LdmTransBPair(lane);
      return (0 * 16 + r.row) * kS + j * 8 + r.col;
    }, true);
    Mma(&o[j], a, BHalf(b, 0));
    Mma(&o[j + 1], a, BHalf(b, 2));
  }
  for (int j = 0; j < kD / 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        float want = 0;
        for (int key = 0; key < 16; ++key) want += p[AccRow(l, e)][key] * v.at(key, j * 8 + AccCol(l, e));
        ASSERT_EQ(o[j][l][e], want) << "d tile " << j << " lane " << l << " reg " << e;
      }
    }
  }
}

// Backward: P^T written from accumulators into [keys][rows] smem (step A),
// read back as the A operand of dV += P^T·dO (step B), and read transposed
// as the A operand of dQ += dS·K (step C).
TEST(FragmentLayoutTest, BackwardProductsThroughSharedMemory) {
  std::mt19937 rng(3);
  constexpr int kRows = 32, kKeys = 16, kPS = kRows + 8;
  Smem pt(kKeys, kPS), dout(kRows, kS), k(kKeys, kS);
  FillRandom(&dout, &rng);
  FillRandom(&k, &rng);
  // Step A's stores: accumulator tile j covers rows j*8.., keys 0..15.
  float p[kKeys][kRows];
  for (int j = 0; j < kRows / 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        const float x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
        const int key = AccRow(l, e), row = j * 8 + AccCol(l, e);
        p[key][row] = x;
        pt.at(key, row) = x;
      }
    }
  }
  // Step B: dV[key][d] = sum_row P^T[key][row] dO[row][d].
  Acc dv[kD / 8] = {};
  for (int kk = 0; kk < kRows / 16; ++kk) {
    const Frag4 a = LdMatrixX4(pt, [&](int lane) {
      const LaneRowCol r = LdmRowMajorA(lane);
      return (0 * 16 + r.row) * kPS + kk * 16 + r.col;
    }, false);
    for (int j = 0; j < kD / 8; j += 2) {
      const Frag4 b = LdMatrixX4(dout, [&](int lane) {
        const LaneRowCol r = LdmTransBPair(lane);
        return (kk * 16 + r.row) * kS + j * 8 + r.col;
      }, true);
      Mma(&dv[j], a, BHalf(b, 0));
      Mma(&dv[j + 1], a, BHalf(b, 2));
    }
  }
  for (int j = 0; j < kD / 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        float want = 0;
        for (int row = 0; row < kRows; ++row) want += p[AccRow(l, e)][row] * dout.at(row, j * 8 + AccCol(l, e));
        ASSERT_EQ(dv[j][l][e], want) << "dV tile " << j << " lane " << l;
      }
    }
  }
  // Step C: dQ[row][d] = sum_key dS[row][key] K[key][d], dS stored as [key][row]
  // (here P^T plays dS^T); row group 1 (rows 16..31).
  const int row_group = 1;
  Acc dq[kD / 8] = {};
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const Frag4 a = LdMatrixX4(pt, [&](int lane) {
      const LaneRowCol r = LdmTransA(lane);
      return (kk * 16 + r.row) * kPS + row_group * 16 + r.col;
    }, true);
    for (int j = 0; j < kD / 8; j += 2) {
      const Frag4 b = LdMatrixX4(k, [&](int lane) {
        const LaneRowCol r = LdmTransBPair(lane);
        return (kk * 16 + r.row) * kS + j * 8 + r.col;
      }, true);
      Mma(&dq[j], a, BHalf(b, 0));
      Mma(&dq[j + 1], a, BHalf(b, 2));
    }
  }
  for (int j = 0; j < kD / 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        float want = 0;
        for (int key = 0; key < kKeys; ++key) {
          want += p[key][row_group * 16 + AccRow(l, e)] * k.at(key, j * 8 + AccCol(l, e));
        }
        ASSERT_EQ(dq[j][l][e], want) << "dQ tile " << j << " lane " << l;
      }
    }
  }
}

// Backward step A: S^T = K·Q^T, K rows of key group kw as A, Q rows of the
// warp's row slice as B pairs.
TEST(FragmentLayoutTest, KQTransposeAsInBackward) {
  std::mt19937 rng(4);
  const int kw = 1, row_slice = 16;  // rows 16..31 of the Q block
  Smem k(32, kS), q(32, kS);
  FillRandom(&k, &rng);
  FillRandom(&q, &rng);
  Acc st[2] = {};
  for (int kk = 0; kk < kD / 16; ++kk) {
    const Frag4 a = LdMatrixX4(k, [&](int lane) {
      const LaneRowCol r = LdmRowMajorA(lane);
      return (kw * 16 + r.row) * kS + kk * 16 + r.col;
    }, false);
    const Frag4 b = LdMatrixX4(q, [&](int lane) {
      const LaneRowCol r = LdmBPair(lane);
      return (row_slice + 0 * 8 + r.row) * kS + kk * 16 + r.col;
    }, false);
    Mma(&st[0], a, BHalf(b, 0));
    Mma(&st[1], a, BHalf(b, 2));
  }
  for (int j = 0; j < 2; ++j) {
    for (int l = 0; l < 32; ++l) {
      for (int e = 0; e < 4; ++e) {
        float want = 0;
        for (int d = 0; d < kD; ++d) {
          want += k.at(kw * 16 + AccRow(l, e), d) * q.at(row_slice + j * 8 + AccCol(l, e), d);
        }
        ASSERT_EQ(st[j][l][e], want) << "tile " << j << " lane " << l;
      }
    }
  }
}

}  // namespace
}  // namespace hsap::kernels::cuda
