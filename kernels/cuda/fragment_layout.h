// Which shared-memory element each lane addresses for the ldmatrix loads of
// the attention kernels, and which element of a tile each accumulator
// register holds: the layout arithmetic of mma.sync m16n8k16, as plain
// host/device functions. The kernels (attention_fwd.cu, attention_bwd.cu)
// compute their addresses with these, and fragment_layout_test.cc runs them
// through a CPU model of ldmatrix and mma.sync (PTX ISA semantics) to check
// that every product the kernels form is the intended one.
//
// An ldmatrix .x4 reads four 8x8 matrices of 16-bit elements; lane l gives
// the address of row l % 8 of matrix l / 8. Every load below returns the
// registers in the order mma.sync wants them.
#ifndef HSAP_KERNELS_CUDA_FRAGMENT_LAYOUT_H_
#define HSAP_KERNELS_CUDA_FRAGMENT_LAYOUT_H_

#include "common/dtype.h"  // HSAP_HOST_DEVICE

namespace hsap::kernels::cuda {

// Row and column, relative to the 16x16 (or 16x2x8) block being loaded, of
// the shared-memory row a lane points ldmatrix at.
struct LaneRowCol {
  int row;
  int col;
};

// A operand (16 m x 16 k) stored row-major as [m][k]; ldmatrix (no .trans)
// gives a0..a3. Also: the B operands of two adjacent n8 tiles stored as
// [k][n] (k = 16 rows, n = 16 columns) with ldmatrix.trans gives b0, b1 of
// the first tile and b0, b1 of the second.
HSAP_HOST_DEVICE constexpr LaneRowCol LdmRowMajorA(int lane) {
  return {lane % 16, (lane / 16) * 8};
}
HSAP_HOST_DEVICE constexpr LaneRowCol LdmTransBPair(int lane) { return LdmRowMajorA(lane); }

// B operands of two adjacent n8 tiles stored as [n][k] (n = 16 rows, k = 16
// columns), ldmatrix without .trans: registers 0, 1 = b0, b1 of the tile of
// rows 0..7, registers 2, 3 = b0, b1 of the tile of rows 8..15. Also: the A
// operand stored transposed as [k][m] with ldmatrix.trans gives a0..a3.
HSAP_HOST_DEVICE constexpr LaneRowCol LdmBPair(int lane) {
  return {(lane / 16) * 8 + lane % 8, ((lane / 8) % 2) * 8};
}
HSAP_HOST_DEVICE constexpr LaneRowCol LdmTransA(int lane) { return LdmBPair(lane); }

// Row and column of accumulator register e (0..3) of a lane in a 16x8 C tile.
HSAP_HOST_DEVICE constexpr int AccRow(int lane, int e) { return lane / 4 + (e / 2) * 8; }
HSAP_HOST_DEVICE constexpr int AccCol(int lane, int e) { return 2 * (lane % 4) + (e & 1); }

}  // namespace hsap::kernels::cuda

#endif  // HSAP_KERNELS_CUDA_FRAGMENT_LAYOUT_H_
