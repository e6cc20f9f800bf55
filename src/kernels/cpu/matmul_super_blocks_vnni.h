#pragma once
// Internal to src/kernels: the dense int8 micro-kernel of the super-block types' prefill on x86
// CPUs with AVX-512 VNNI (vpdpbusd), in its own translation unit for the reason given in
// matmul_vnni.h. The AVX3 target of cpu/matmul_super_blocks.cc decodes 16 weight rows x a
// column slice into the tile below once, then runs every activation row over it here.
#include <cstdint>

#include "kernels/blocks.h"

namespace sieve::kernels::vnni {

// 16 weight rows x num_super_blocks * 256 columns, decoded. Per group of `group_cols` (16 or
// 32) columns g, the rows' values are scale[g][r] * (level - offset) - min[g][r] with
// unsigned levels (the offset is folded into the activation side, see below):
//   levels  [cols / 4][16 rows][4 columns] u8: one 64-byte vector holds 4 columns of all rows
//   scales  [cols / group_cols][16] f32
//   mins    [cols / group_cols][16] f32, or nullptr when the type has none
struct SuperBlockTile {
  const uint8_t* levels;
  const float* scales;
  const float* mins;
  int group_cols;
  int64_t num_super_blocks;
};

// Activation rows i < num_x in Q8_K, and per row and column group (over all columns):
//   offset_sums[i][g] = -offset * sum of the group's q_x   (the levels' offset, in integer)
//   neg_sums[i][g]    = -(sum of the group's q_x) as f32    (against mins)
struct SuperBlockActivations {
  const BlockQ8_K* x;  // [num_x][blocks_per_row]
  int64_t blocks_per_row;
  const int32_t* offset_sums;
  const float* neg_sums;
  int64_t groups_per_row;
};

// y[i * y_stride + r] (+)= the tile's rows r < num_rows against activation rows i < num_x, over
// the tile's columns, which start at super-block first_block of the activation rows.
void super_block_tile(const SuperBlockTile& tile, const SuperBlockActivations& x,
                      int64_t first_block, int64_t num_x, float* y, int64_t y_stride, int num_rows,
                      bool accumulate);

}  // namespace sieve::kernels::vnni
