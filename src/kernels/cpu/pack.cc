// pack_for_matmul(): the CPU backend's weight repackings (layouts in cpu/pack.h) and the one
// table of which dtype packs how.
#include "kernels/cpu/pack.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <iterator>
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/cpu/matmul_float_avx512.h"
#include "kernels/cpu/matmul_super_blocks_vnni.h"
#include "kernels/cpu/matmul_vnni.h"
#include "kernels/cpu/matmul_vnni_small_blocks.h"
#include "kernels/quant_super_blocks.h"
#include "util/thread_pool.h"

namespace sieve::kernels {

namespace {

// fn(begin, end) over groups [0, num_groups): on the pool's threads where there is a pool of more
// than one, else here.
template <class Fn>
void for_groups(ThreadPool* pool, int64_t num_groups, const Fn& fn) {
  if (pool == nullptr || pool->num_threads() == 1) {
    fn(0, num_groups);
  } else {
    pool->parallel_for(num_groups, fn);
  }
}

// The packed copy of w: groups of 16 rows, per group and block (block_bytes(w.dtype) bytes of a
// row, block_cols columns) packed_bytes bytes, all `fill` at first. pack_block(block, out, lane)
// writes row `lane`'s share of the group's packed block `out`; rows run on the pool's threads
// where there is one, in whole groups, so that each group's bytes are written by one thread.
template <class Fn>
PackedBytes pack_blocks(const MatrixView& w, int64_t block_cols, int64_t packed_bytes,
                        ThreadPool* pool, const Fn& pack_block, uint8_t fill = 0) {
  constexpr int64_t kGroupRows = 16;
  assert(w.cols % block_cols == 0);
  const int64_t num_groups = (w.rows + kGroupRows - 1) / kGroupRows;
  const int64_t num_blocks = w.cols / block_cols;
  const size_t bytes_per_row = row_bytes(w.dtype, w.cols), block_size = block_bytes(w.dtype);
  PackedBytes packed(static_cast<size_t>(num_groups * num_blocks * packed_bytes), fill);
  const auto pack_groups = [&](int64_t g_begin, int64_t g_end) {
    for (int64_t r = g_begin * kGroupRows; r < std::min(w.rows, g_end * kGroupRows); ++r) {
      const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * bytes_per_row;
      const int64_t g = r / kGroupRows, lane = r % kGroupRows;
      for (int64_t b = 0; b < num_blocks; ++b)
        pack_block(row + b * block_size, packed.data() + (g * num_blocks + b) * packed_bytes, lane);
    }
  };
  for_groups(pool, num_groups, pack_groups);
  return packed;
}

// F16 / BF16 as cpu/matmul_float_avx512.h's packed groups, padding rows zero. A group is
// transposed in tiles of 64 rows x 64 columns (8 KiB: the strided writes stay in L1; one row at a
// time across all columns took ~2 s for the 2048-dim model's 852 MB).
PackedBytes pack_floats(const MatrixView& w, ThreadPool* pool) {
  constexpr int64_t kGroupRows = avx512::kPackedGroupRows, kTileCols = 64;
  assert(block_bytes(w.dtype) == sizeof(uint16_t));
  const int64_t num_groups = (w.rows + kGroupRows - 1) / kGroupRows;
  PackedBytes packed(static_cast<size_t>(num_groups * kGroupRows * w.cols) * sizeof(uint16_t), 0);
  const auto* in = static_cast<const uint16_t*>(w.data);
  auto* out = reinterpret_cast<uint16_t*>(packed.data());
  const auto pack_groups = [&](int64_t g_begin, int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t rows = std::min(kGroupRows, w.rows - g * kGroupRows);
      uint16_t* group = out + g * kGroupRows * w.cols;
      for (int64_t c0 = 0; c0 < w.cols; c0 += kTileCols) {
        const int64_t c1 = std::min(w.cols, c0 + kTileCols);
        // The tile's rows first into a contiguous buffer: rows 4 KiB apart map to one L1 set.
        uint16_t tile[kGroupRows][kTileCols];
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(tile[r], in + (g * kGroupRows + r) * w.cols + c0,
                      (c1 - c0) * sizeof(uint16_t));
        for (int64_t c = c0; c < c1; ++c) {
          uint16_t* column = group + c * kGroupRows;
          for (int64_t r = 0; r < rows; ++r) column[r] = tile[r][c - c0];
        }
      }
    }
  };
  for_groups(pool, num_groups, pack_groups);
  return packed;
}

PackedBytes pack_q8_0(const MatrixView& w, ThreadPool* pool) {
  assert(w.dtype == DType::kQ8_0);
  constexpr int64_t kGroupRows = 16, kBlockBytes = 32 + kGroupRows * kQBlock;
  // Padding rows: weights 0 (stored as 0x80), scale 0 (below).
  PackedBytes packed = pack_blocks(
      w, kQBlock, kBlockBytes, pool,
      [](const uint8_t* bytes, uint8_t* out, int64_t lane) {
        const auto& block = *reinterpret_cast<const BlockQ8_0*>(bytes);
        std::memcpy(out + 2 * lane, &block.d, 2);
        for (int64_t k = 0; k < kQBlock / 4; ++k) {
          for (int64_t j = 0; j < 4; ++j)
            out[32 + (k * kGroupRows + lane) * 4 + j] =
                static_cast<uint8_t>(block.qs[4 * k + j]) ^ 0x80;
        }
      },
      0x80);
  const int64_t num_groups = (w.rows + kGroupRows - 1) / kGroupRows;
  const int64_t num_blocks = w.cols / kQBlock;
  for (int64_t r = w.rows; r < num_groups * kGroupRows; ++r) {  // zero scales
    for (int64_t b = 0; b < num_blocks; ++b) {
      uint8_t* out = packed.data() + ((r / kGroupRows) * num_blocks + b) * kBlockBytes;
      out[2 * (r % kGroupRows)] = 0;
      out[2 * (r % kGroupRows) + 1] = 0;
    }
  }
  return packed;
}

// The 32-value blocks of 4 / 5 bits, layout as packed_block_bytes(). Every such block starts
// with its f16 d, then (Q4_1 / Q5_1) its f16 m, then (Q5_x) 4 bytes qh, then 16 bytes qs.
// Padding rows stay all zero: scale 0 adds nothing.
PackedBytes pack_small_blocks(const MatrixView& w, vnni::SmallBlockFormat format,
                              ThreadPool* pool) {
  constexpr int64_t kGroupRows = 16;
  const int64_t packed_bytes = vnni::packed_block_bytes(format);
  assert(packed_bytes == kGroupRows * static_cast<int64_t>(block_bytes(w.dtype)));
  const bool has_min = vnni::packed_has_min(format);
  const bool has_fifth = vnni::packed_has_fifth_bits(format);
  const int64_t qh_at = has_min ? 4 : 2, qs_at = qh_at + (has_fifth ? 4 : 0);
  const auto pack_block = [&](const uint8_t* block, uint8_t* out, int64_t lane) {
    std::memcpy(out + 2 * lane, block, 2);
    if (has_min) std::memcpy(out + 32 + 2 * lane, block + 2, 2);
    if (has_fifth)
      std::memcpy(out + vnni::packed_fifth_offset(format) + 4 * lane, block + qh_at, 4);
    uint8_t* levels = out + vnni::packed_levels_offset(format);
    for (int64_t k = 0; k < 4; ++k)
      std::memcpy(levels + (k * kGroupRows + lane) * 4, block + qs_at + 4 * k, 4);
  };
  return pack_blocks(w, kQBlock, packed_bytes, pool, pack_block);
}

// Q4_K and Q5_K (Block), layouts as vnni::kPackedQ4_KBytes and kPackedQ5_KBytes. The block's own
// qs already pair column 64j + l (low nibble) with 64j + 32 + l (high) in byte 32j + l, so the
// levels move as 4-byte copies; only the 6-bit scales and mins (and Q5_K's fifth bits) are
// unpacked (quant::decode_super_block would decode all 256 levels too: ~1/4 of a short run's time
// at load).
template <class Block>
PackedBytes pack_q4_k_or_q5_k(const MatrixView& w, ThreadPool* pool) {
  constexpr bool kFifthBits = std::is_same_v<Block, BlockQ5_K>;
  constexpr int64_t kGroupRows = 16;
  constexpr int64_t kBytes = kFifthBits ? vnni::kPackedQ5_KBytes : vnni::kPackedQ4_KBytes;
  constexpr int64_t kChunkBytes =
      kFifthBits ? vnni::kPackedQ5_KChunkBytes : vnni::kPackedQ4_KChunkBytes;
  const auto pack_block = [](const uint8_t* bytes, uint8_t* out, int64_t lane) {
    const Block& block = *reinterpret_cast<const Block*>(bytes);
    std::memcpy(out + 2 * lane, &block.d, 2);
    std::memcpy(out + 32 + 2 * lane, &block.dmin, 2);
    for (int j = 0; j < 4; ++j) {
      uint8_t* chunk = out + 64 + j * kChunkBytes;
      for (int half = 0; half < 2; ++half) {
        int scale = 0, min = 0;
        quant::scale_min_k4(2 * j + half, block.scales, &scale, &min);
        chunk[half * kGroupRows + lane] = static_cast<uint8_t>(scale);
        chunk[(2 + half) * kGroupRows + lane] = static_cast<uint8_t>(min);
      }
      uint8_t* levels = chunk + 64;
      for (int k = 0; k < 8; ++k)
        std::memcpy(levels + (k * kGroupRows + lane) * 4, block.qs + 32 * j + 4 * k, 4);
      if constexpr (kFifthBits) {
        // Column 64j + 32 half + 4k + e has its fifth bit at bit 2j + half of qh[4k + e]; it
        // goes to bit 4 lane + e of level vector k's 8-byte mask (the lane's nibble).
        for (int half = 0; half < 2; ++half) {
          for (int k = 0; k < 8; ++k) {
            int bits = 0;
            for (int e = 0; e < 4; ++e) bits |= ((block.qh[4 * k + e] >> (2 * j + half)) & 1) << e;
            levels[8 * 64 + half * 64 + 8 * k + lane / 2] |=
                static_cast<uint8_t>(bits << (4 * (lane % 2)));
          }
        }
      }
    }
  };
  return pack_blocks(w, kQKBlock, kBytes, pool, pack_block);
}

// Q2_K and Q3_K, layouts as vnni::kPackedQ2_KBytes and kPackedQ3_KBytes: levels q (Q3_K: q + 4,
// i.e. the 2 stored bits and the hmask bit), moved byte-wise without decoding the block. In both
// blocks column 128 H + 32 g + l (l < 32) keeps its 2 low bits in bits 2g, 2g + 1 of
// qs[32 H + l]; Q3_K's third bit is bit 4 H + g of hmask[l].
PackedBytes pack_q2_k_or_q3_k(const MatrixView& w, ThreadPool* pool) {
  constexpr int64_t kGroupRows = 16;
  const bool q3 = w.dtype == DType::kQ3_K;
  assert(q3 || w.dtype == DType::kQ2_K);
  const int64_t chunk_bytes = q3 ? vnni::kPackedQ3_KChunkBytes : vnni::kPackedQ2_KChunkBytes;
  // Chunk j (64 columns) of the block at `out`: the scales of its four 16-column groups, then its
  // levels from byte 64.
  const auto chunk_at = [&](uint8_t* out, int j) { return out + 64 + j * chunk_bytes; };
  const auto scale_at = [&](uint8_t* out, int s, int64_t lane) {
    return chunk_at(out, s / 4) + s % 4 * kGroupRows + lane;
  };
  const auto pack_block = [&](const uint8_t* block, uint8_t* out, int64_t lane) {
    const uint8_t* qs;
    const uint8_t* hmask = nullptr;
    if (q3) {
      const auto& b = *reinterpret_cast<const BlockQ3_K*>(block);
      qs = b.qs;
      hmask = b.hmask;
      std::memcpy(out + 2 * lane, &b.d, 2);
      for (int s = 0; s < 16; ++s)
        *scale_at(out, s, lane) = static_cast<uint8_t>(quant::scale_q3_k(s, b.scales) - 32);
    } else {
      const auto& b = *reinterpret_cast<const BlockQ2_K*>(block);
      qs = b.qs;
      std::memcpy(out + 2 * lane, &b.d, 2);
      std::memcpy(out + 32 + 2 * lane, &b.dmin, 2);
      for (int s = 0; s < 16; ++s) *scale_at(out, s, lane) = b.scales[s];
    }
    for (int j = 0; j < 4; ++j) {
      // Chunk j: columns 128 H + 32 g + l for H = j / 2, g = 2 (j % 2) + half.
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);  // of g's bits for half 0; half 1's are 2 above
      uint8_t* low = chunk_at(out, j) + 64;
      // Field f of byte (m, e): half f / 2, column l = 4 (m + 4 (f % 2)) + e of it.
      for (int m = 0; m < 4; ++m) {
        for (int e = 0; e < 4; ++e) {
          const int a = (q[4 * m + e] >> shift) & 0xF, b = (q[16 + 4 * m + e] >> shift) & 0xF;
          low[(m * kGroupRows + lane) * 4 + e] =
              static_cast<uint8_t>((a & 3) | (b & 3) << 2 | (a >> 2) << 4 | (b >> 2) << 6);
        }
      }
      if (!q3) continue;
      for (int half = 0; half < 2; ++half) {
        const int bit = 4 * (j / 2) + 2 * (j % 2) + half;
        for (int e = 0; e < 4; ++e) {
          int bits = 0;
          for (int k = 0; k < 8; ++k) bits |= ((hmask[4 * k + e] >> bit) & 1) << k;
          low[4 * 64 + half * 64 + lane * 4 + e] = static_cast<uint8_t>(bits);
        }
      }
    }
  };
  return pack_blocks(w, kQKBlock, q3 ? vnni::kPackedQ3_KBytes : vnni::kPackedQ2_KBytes, pool,
                     pack_block);
}

// IQ4_XS, layout as vnni::kPackedIQ4_XSBytes: each sub-block's 16 qs bytes are a 32-value
// block's, so they move as 4-byte copies; the 6-bit scales are unpacked to ls - 32.
PackedBytes pack_iq4_xs(const MatrixView& w, ThreadPool* pool) {
  constexpr int64_t kGroupRows = 16;
  assert(w.dtype == DType::kIQ4_XS);
  const auto pack_block = [](const uint8_t* bytes, uint8_t* out, int64_t lane) {
    const auto& block = *reinterpret_cast<const BlockIQ4_XS*>(bytes);
    std::memcpy(out + 2 * lane, &block.d, 2);
    uint8_t* scales = out + 32;
    uint8_t* levels = out + vnni::kPackedIQ4_XSLevels;
    for (int s = 0; s < 8; ++s) {
      const int ls = ((block.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) |
                     (((block.scales_h >> (2 * s)) & 3) << 4);
      scales[s * kGroupRows + lane] = static_cast<uint8_t>(static_cast<int8_t>(ls - 32));
      for (int k = 0; k < 4; ++k)
        std::memcpy(levels + 256 * s + (k * kGroupRows + lane) * 4, block.qs + 16 * s + 4 * k, 4);
    }
  };
  return pack_blocks(w, kQKBlock, vnni::kPackedIQ4_XSBytes, pool, pack_block);
}

// Q6_K, layout as vnni::kPackedQ6_KBytes; levels q + 32, i.e. the block's 6 stored bits, moved
// byte-wise without decoding (quant::decode_super_block took ~40% of loading a Q6_K file). In the
// block, columns 128 H + l (l < 32) and + 32, + 64, + 96 take their low 4 bits from ql[64 H + l]
// (low nibble), ql[64 H + 32 + l] (low), ql[64 H + l] (high), ql[64 H + 32 + l] (high), and their
// high 2 bits from bits 0-1, 2-3, 4-5, 6-7 of qh[32 H + l]. So packed chunk j (H = j / 2, nibble
// and bit pair set by j % 2) is a nibble selection of ql and a shift of qh.
PackedBytes pack_q6_k(const MatrixView& w, ThreadPool* pool) {
  constexpr int64_t kGroupRows = 16;
  assert(w.dtype == DType::kQ6_K);
  const auto pack_block = [](const uint8_t* bytes, uint8_t* out, int64_t lane) {
    const auto& block = *reinterpret_cast<const BlockQ6_K*>(bytes);
    std::memcpy(out + 2 * lane, &block.d, 2);
    for (int j = 0; j < 4; ++j) {
      uint8_t* chunk = out + vnni::kPackedQ6_KLevels + j * vnni::kPackedQ6_KChunkBytes;
      for (int g = 0; g < 4; ++g)
        chunk[g * kGroupRows + lane] = static_cast<uint8_t>(block.scales[4 * j + g]);
      const uint8_t* ql = block.ql + 64 * (j / 2);
      const uint8_t* qh = block.qh + 32 * (j / 2);
      const int nibble = 4 * (j % 2);
      for (int i = 0; i < 32; ++i) {  // columns 64 j + i (low nibble) and 64 j + 32 + i (high)
        uint8_t* low = chunk + 64 * vnni::Q6_KLowVector(i / 4);
        low[lane * 4 + i % 4] =
            static_cast<uint8_t>(((ql[i] >> nibble) & 0xF) | ((ql[32 + i] >> nibble) & 0xF) << 4);
      }
      for (int i = 0; i < 16; ++i) {  // high bits of columns 64 j + i, + 32, + 16, + 48
        uint8_t* high = chunk + 64 * vnni::Q6_KHighVector(i / 4);
        high[lane * 4 + i % 4] =
            static_cast<uint8_t>(((qh[i] >> nibble) & 0xF) | ((qh[16 + i] >> nibble) & 0xF) << 4);
      }
    }
  };
  return pack_blocks(w, kQKBlock, vnni::kPackedQ6_KBytes, pool, pack_block);
}

template <vnni::SmallBlockFormat kFormat>
PackedBytes pack_small_blocks_as(const MatrixView& w, ThreadPool* pool) {
  return pack_small_blocks(w, kFormat, pool);
}

// Which dtype packs how, and what the kernels that read the packing need of the CPU.
struct Packer {
  enum class Needs : uint8_t { kNone, kAvx512, kVnni };
  Needs needs = Needs::kNone;  // kNone: no packing (F32)
  PackedBytes (*pack)(const MatrixView& w, ThreadPool* pool) = nullptr;
};
using Needs = Packer::Needs;
using Format = vnni::SmallBlockFormat;
constexpr Packer kPackers[] = {
    {},  // F32
    {Needs::kAvx512, pack_floats},
    {Needs::kAvx512, pack_floats},  // BF16
    {Needs::kVnni, pack_q8_0},
    {Needs::kVnni, pack_small_blocks_as<Format::kQ4_0>},
    {Needs::kVnni, pack_small_blocks_as<Format::kQ4_1>},
    {Needs::kVnni, pack_small_blocks_as<Format::kQ5_0>},
    {Needs::kVnni, pack_small_blocks_as<Format::kQ5_1>},
    {Needs::kVnni, pack_small_blocks_as<Format::kIQ4_NL>},
    {Needs::kVnni, pack_q2_k_or_q3_k},  // Q2_K
    {Needs::kVnni, pack_q2_k_or_q3_k},  // Q3_K
    {Needs::kVnni, pack_q4_k_or_q5_k<BlockQ4_K>},
    {Needs::kVnni, pack_q4_k_or_q5_k<BlockQ5_K>},
    {Needs::kVnni, pack_q6_k},
    {Needs::kVnni, pack_iq4_xs},
};
static_assert(std::size(kPackers) == std::size(kAllDTypes), "one packer per DType, in its order");

const Packer& packer(DType dtype) { return kPackers[static_cast<size_t>(dtype)]; }

}  // namespace

bool packed_matmul_supported(DType dtype) {
  const Needs needs = packer(dtype).needs;
  return (needs == Needs::kAvx512 && avx512::supported()) ||
         (needs == Needs::kVnni && vnni::supported());
}

PackedBytes pack_for_matmul(const MatrixView& w, ThreadPool* pool) {
  assert(packer(w.dtype).pack != nullptr);
  return packer(w.dtype).pack(w, pool);
}

}  // namespace sieve::kernels
