// Device code of the attend kernel (TPP's two phases, the paged baseline and prefill) and of the
// partial merge. Included by attention_f16.cu and attention_bf16.cu only.
//
// Attend kernel, per thread block (4 warps, 128 threads): up to 64 rows (query vectors) attend to
// a run of chunks of one KV head.
//  - Q: the rows' vectors are gathered (16-byte cp.async per piece) into shared memory, rows past
//    the task's last zero-filled (the source is never read), then held as mma A fragments.
//  - K/V: a stage is 64 tokens of whole chunks (one chunk when chunk_size >= 64), copied with
//    cp.async into one of two buffers while the other is computed on. Token rows past a chunk's
//    length are zero-filled, not read (the arena holds garbage there).
//  - Warps: row tile (16 rows) x token slice. With fewer than 64 rows the spare warps take other
//    16-token tiles of the same stage (a decode step's sequence-first rows are one GQA group:
//    1-16 rows, so all four warps split the tokens). Each warp keeps its own online softmax; the
//    slices are merged through shared memory at the end.
//  - Per 16-token tile: S = Q K^T (mma.sync m16n8k16, K fragments by ldmatrix), mask, online
//    softmax in registers (base 2), P converted to the A fragment in registers (the accumulator
//    layout of S is the A layout of P V), O += P V (V fragments by ldmatrix.trans).
// Shared rows are padded by 16 bytes so that ldmatrix's 8 row addresses hit 8 different bank
// groups.
#ifndef CHUNKSERVE_KERNELS_CUDA_ATTENTION_IMPL_CUH_
#define CHUNKSERVE_KERNELS_CUDA_ATTENTION_IMPL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"

namespace chunkserve::kernels::cuda::detail {

constexpr int kWarps = 4;
constexpr int kTaskRows = 64;
constexpr int kPad = 8;  // elements (16 bytes) of padding per shared-memory row
constexpr int kMaxChunksPerStage = 4;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; with valid == false nothing is read and 16 zero bytes are
// written (src-size 0). `src` must still be a mapped address: callers pass the tensor's base.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(src),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

// 2^x; ex2.approx(-inf) = +0, which the -inf guards below rely on.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
struct Mma;

template <>
struct Mma<__half> {
  // d += a * b, a 16x16 (row), b 16x8 (col), fp32 accumulate.
  static __device__ __forceinline__ void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ __half From(float x) { return __float2half_rn(x); }
};

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 From(float x) { return __float2bfloat16_rn(x); }
};

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename T, int D>
__global__ void __launch_bounds__(kAttendThreads) AttendKernel(const AttendArgs a) {
  // Any multiple of 16 works (MMA k-steps and pairs of 8-wide output tiles); 64 and 128 are the
  // ones instantiated. Past 128 the accumulators would need more registers than this layout has.
  static_assert(D % 16 == 0 && D <= 128, "head_dim");
  constexpr int kStride = D + kPad;
  constexpr int kPieces = D / 8;  // 16-byte pieces per row
  constexpr int kNt = D / 8;      // n-tiles of the output
  constexpr int kKs = D / 16;     // k-steps of Q K^T
  using M = Mma<T>;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int group = a.group;
  const int heads = a.num_qo_heads;

  // ---- The task: rows [row_begin, row_begin + num_rows) of a row space whose row R is token
  // token_base + R / group, query head kv_head * group + R % group; chunks [cb, ce).
  int kv_head, token_base, row_begin, num_rows, cb, ce, out, path_base = 0;
  const bool causal = a.mode == AttendMode::kPrefill;
  if (a.mode == AttendMode::kTpp) {
    const TppTask t = a.tasks[blockIdx.x];
    kv_head = blockIdx.y;
    token_base = t.seq_begin;
    row_begin = t.row_begin;
    num_rows = t.num_rows;
    cb = t.chunk_begin;
    ce = t.chunk_end;
    out = t.out;
  } else if (a.mode == AttendMode::kPaged) {
    // vLLM's grid order: the KV heads of one sequence are adjacent blocks.
    int x = blockIdx.x;
    kv_head = x % a.num_kv_heads;
    x /= a.num_kv_heads;
    const int rb = x % a.row_blocks;
    const int seq = x / a.row_blocks;
    token_base = seq;
    row_begin = rb * kTaskRows;
    num_rows = min(kTaskRows, group - row_begin);
    cb = a.chunk_indptr[seq];
    ce = a.chunk_indptr[seq + 1];
    out = kDirectOutput;
  } else {
    kv_head = blockIdx.y;
    const int seq = blockIdx.x / a.row_blocks;
    const int block = blockIdx.x % a.row_blocks;
    token_base = a.q_indptr[seq];
    const int rows = (a.q_indptr[seq + 1] - token_base) * group;
    row_begin = block * kTaskRows;
    if (row_begin >= rows) return;  // the whole block leaves together, before any barrier
    num_rows = min(kTaskRows, rows - row_begin);
    cb = a.chunk_indptr[seq];
    ce = a.chunk_indptr[seq + 1];
    path_base = cb;
    out = kDirectOutput;
  }
  if (ce < cb) ce = cb;  // malformed device lists: attend to nothing rather than misbehave

  const int c = a.chunk_size;
  const int cps = c >= 64 ? 1 : 64 / c;  // chunks per stage
  const int cap = cps * c;               // token rows per stage buffer

  // Stage buffer b holds K then V of `cap` token rows: [K_b | V_b]. The Q tile aliases stage
  // buffer 1: Q is read into registers once, before stage 1's copies are issued, so it needs no
  // space of its own (68 KB instead of 85 KB at head_dim 128, chunk 64: three blocks per SM
  // instead of two, the difference between a latency-bound and a streaming full-sharing decode).
  extern __shared__ __align__(16) unsigned char smem[];
  T* const s_stage = reinterpret_cast<T*>(smem);
  auto stage_k = [&](int buf) { return s_stage + buf * 2 * cap * kStride; };
  auto stage_v = [&](int buf) { return s_stage + (buf * 2 + 1) * cap * kStride; };
  T* s_q = stage_k(1);
  int* s_len = reinterpret_cast<int*>(s_stage + 4 * cap * kStride);  // [2][kMaxChunksPerStage]
  int* s_pos = s_len + 2 * kMaxChunksPerStage;                        // [kTaskRows]
  float* scratch = reinterpret_cast<float*>(smem);                    // reused after the loop

  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);

  // ---- Causal: row positions, and the chunks past every row's position are skipped.
  if (causal) {
    for (int r = tid; r < kTaskRows; r += kAttendThreads) {
      s_pos[r] = r < num_rows ? a.q_pos[token_base + (row_begin + r) / group] : -1;
    }
    __syncthreads();
    int max_pos = -1;
    for (int r = 0; r < kTaskRows; ++r) max_pos = max(max_pos, s_pos[r]);
    ce = max_pos < 0 ? cb : min(ce, cb + max_pos / c + 1);
  }

  // ---- Q rows, then the first stage (one cp.async group).
  for (int p = tid; p < kTaskRows * kPieces; p += kAttendThreads) {
    const int r = p / kPieces;
    const int piece = p % kPieces;
    const bool valid = r < num_rows;
    const T* src = q;
    if (valid) {
      const int R = row_begin + r;
      const int64_t token = token_base + R / group;
      const int head = kv_head * group + R % group;
      src = q + (token * heads + head) * D + piece * 8;
    }
    CpAsync16(s_q + r * kStride + piece * 8, src, valid);
  }

  // Chunk (slot, length) lookups run one stage ahead of the copies they address: the lookups of
  // stage s + 1 are issued while stage s is copied and computed, so a stage's cp.async never
  // waits behind a dependent global load (that serialization, one round trip per stage, made
  // the first GPU run latency-bound at full sharing).
  auto fetch_info = [&](int stage, int (&slot)[kMaxChunksPerStage],
                        int (&len)[kMaxChunksPerStage]) {
#pragma unroll
    for (int j = 0; j < kMaxChunksPerStage; ++j) {
      const int chunk = cb + stage * cps + j;
      slot[j] = 0;
      len[j] = 0;
      if (j < cps && chunk < ce) {
        slot[j] = __ldg(a.chunk_slot + chunk);
        len[j] = __ldg(a.chunk_len + chunk);
      }
    }
  };
  // kPieces is a compile-time constant, so the row / piece split of the flat index costs a
  // multiply, not a division.
  auto load_stage = [&](int buf, const int (&slot)[kMaxChunksPerStage],
                        const int (&len_in)[kMaxChunksPerStage]) {
    T* dk = stage_k(buf);
    T* dv = stage_v(buf);
#pragma unroll
    for (int j = 0; j < kMaxChunksPerStage; ++j) {
      if (j >= cps) break;
      const int sl = slot[j];
      const int len = (sl < 0 || sl >= a.num_slots || len_in[j] < 1 || len_in[j] > c) ? 0
                                                                                       : len_in[j];
      const int64_t base =
          (static_cast<int64_t>(len > 0 ? sl : 0) * a.num_kv_heads + kv_head) * c * D;
      for (int p = tid; p < c * kPieces; p += kAttendThreads) {
        const int t = p / kPieces;
        const int piece = p - t * kPieces;
        const bool valid = t < len;
        const int64_t off = base + static_cast<int64_t>(t) * D + piece * 8;
        const int at = (j * c + t) * kStride + piece * 8;
        CpAsync16(dk + at, valid ? k + off : k, valid);
        CpAsync16(dv + at, valid ? v + off : v, valid);
      }
      if (tid == 0) s_len[buf * kMaxChunksPerStage + j] = len;
    }
  };

  const int num_stages = (ce - cb + cps - 1) / cps;
  int next_slot[kMaxChunksPerStage], next_len[kMaxChunksPerStage];
  if (num_stages > 0) {
    fetch_info(0, next_slot, next_len);
    load_stage(0, next_slot, next_len);
    if (num_stages > 1) fetch_info(1, next_slot, next_len);
  }
  CpAsyncCommit();  // Q and stage 0

  // ---- Warp roles.
  const int row_tiles = (num_rows + 15) / 16;  // 1..4
  const int slices = kWarps / row_tiles;       // 4, 2, 1, 1
  const int rt = warp % row_tiles;
  const int slice = warp / row_tiles;
  const bool active = slice < slices;
  const int row_a = rt * 16 + (lane >> 2);  // local rows of this thread's accumulators
  const int row_b = row_a + 8;

  int pos_a = 0, pos_b = 0, warp_max_pos = 0;
  if (causal) {
    pos_a = s_pos[row_a];
    pos_b = s_pos[row_b];
    warp_max_pos = max(pos_a, pos_b);
    for (int o = 16; o > 0; o >>= 1) {
      warp_max_pos = max(warp_max_pos, __shfl_xor_sync(0xffffffffu, warp_max_pos, o));
    }
  }

  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float acc[kNt][4];
#pragma unroll
  for (int n = 0; n < kNt; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  uint32_t qf[kKs][4];

  if (num_stages == 0) {
    CpAsyncWait<0>();
    __syncthreads();
  }
  for (int st = 0; st < num_stages; ++st) {
    const int buf = st & 1;
    if (st == 0) {
      // Q and stage 0 first; Q's A fragments go to registers (matrices (rows 0-7, k 0-7), (rows
      // 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15); lane l gives the address of row
      // l % 8 of matrix l / 8); only then may stage 1 overwrite Q's buffer.
      CpAsyncWait<0>();
      __syncthreads();
      if (active) {
        const T* base =
            s_q + (rt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
        for (int ks = 0; ks < kKs; ++ks) LdMatrixX4(qf[ks], base + ks * 16);
      }
      __syncthreads();
      if (num_stages > 1) {
        load_stage(1, next_slot, next_len);
        CpAsyncCommit();
        if (num_stages > 2) fetch_info(2, next_slot, next_len);
      }
    } else if (st + 1 < num_stages) {
      load_stage(buf ^ 1, next_slot, next_len);
      CpAsyncCommit();
      if (st + 2 < num_stages) fetch_info(st + 2, next_slot, next_len);
      CpAsyncWait<1>();
      __syncthreads();
    } else {
      CpAsyncWait<0>();
      __syncthreads();
    }
    if (active) {
      const T* kb = stage_k(buf);
      const T* vb = stage_v(buf);
      const int first_chunk = cb + st * cps;
      const int tiles = cap / 16;
      for (int tt = slice; tt < tiles; tt += slices) {
        const int r0 = tt * 16;
        const int j = r0 / c;
        const int t0 = r0 - j * c;
        const int n_valid = min(16, s_len[buf * kMaxChunksPerStage + j] - t0);
        if (n_valid <= 0) continue;
        const int kpos0 = (first_chunk + j - path_base) * c + t0;
        if (causal && kpos0 > warp_max_pos) continue;

        // S = Q K^T for 16 tokens: B fragments from K rows (token = n, dim = k): matrices
        // (tokens 0-7, k 0-7), (tokens 0-7, k 8-15), (tokens 8-15, k 0-7), (tokens 8-15, k 8-15).
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const T* kt = kb + (r0 + (lane & 7) + (lane >> 4) * 8) * kStride + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int ks = 0; ks < kKs; ++ks) {
          uint32_t b[4];
          LdMatrixX4(b, kt + ks * 16);
          M::Run(s[0], qf[ks], b[0], b[1]);
          M::Run(s[1], qf[ks], b[2], b[3]);
        }
        // Scale and mask: element (nt, e) is row (e < 2 ? row_a : row_b), token
        // nt * 8 + (lane % 4) * 2 + e % 2 of the tile.
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + (lane & 3) * 2 + (e & 1);
            bool ok = col < n_valid;
            if (causal) ok = ok && kpos0 + col <= (e < 2 ? pos_a : pos_b);
            s[nt][e] = ok ? s[nt][e] * a.scale_log2 : -INFINITY;
          }
        }
        // Online softmax. A row with no visible key yet keeps m = -inf; its shift is 0 so that
        // no (-inf) - (-inf) appears, and every exp2 of -inf is 0.
        const float mx_a = QuadMax(fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1])));
        const float mx_b = QuadMax(fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3])));
        const float mn_a = fmaxf(m_a, mx_a);
        const float mn_b = fmaxf(m_b, mx_b);
        const float shift_a = mn_a == -INFINITY ? 0.0f : mn_a;
        const float shift_b = mn_b == -INFINITY ? 0.0f : mn_b;
        const float alpha_a = Exp2(m_a - shift_a);
        const float alpha_b = Exp2(m_b - shift_b);
        m_a = mn_a;
        m_b = mn_b;
        float p[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          p[nt][0] = Exp2(s[nt][0] - shift_a);
          p[nt][1] = Exp2(s[nt][1] - shift_a);
          p[nt][2] = Exp2(s[nt][2] - shift_b);
          p[nt][3] = Exp2(s[nt][3] - shift_b);
        }
        l_a = l_a * alpha_a + (p[0][0] + p[0][1] + p[1][0] + p[1][1]);
        l_b = l_b * alpha_b + (p[0][2] + p[0][3] + p[1][2] + p[1][3]);
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
          acc[n][0] *= alpha_a;
          acc[n][1] *= alpha_a;
          acc[n][2] *= alpha_b;
          acc[n][3] *= alpha_b;
        }
        // P as the A fragment of P V (16 rows x 16 tokens).
        uint32_t pa[4];
        pa[0] = M::Pack(p[0][0], p[0][1]);
        pa[1] = M::Pack(p[0][2], p[0][3]);
        pa[2] = M::Pack(p[1][0], p[1][1]);
        pa[3] = M::Pack(p[1][2], p[1][3]);
        // O += P V: B fragments from V rows (token = k, dim = n) transposed: matrices
        // (tokens 0-7, dims 0-7), (tokens 8-15, dims 0-7), (tokens 0-7, dims 8-15), (8-15, 8-15).
        const T* vt = vb + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          LdMatrixX4Trans(b, vt + dn * 16);
          M::Run(acc[2 * dn], pa, b[0], b[1]);
          M::Run(acc[2 * dn + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the buffer just read is the next-but-one load's target
  }

  l_a = QuadSum(l_a);
  l_b = QuadSum(l_b);

  // ---- Merge the token slices of each row tile (scratch aliases the K/V buffers, free now).
  if (slices > 1) {
    float* so = scratch + warp * 16 * D;
    float* sml = scratch + kWarps * 16 * D + warp * 32;
    if (active) {
      const int ra = lane >> 2;
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        const int col = n * 8 + (lane & 3) * 2;
        so[ra * D + col] = acc[n][0];
        so[ra * D + col + 1] = acc[n][1];
        so[(ra + 8) * D + col] = acc[n][2];
        so[(ra + 8) * D + col + 1] = acc[n][3];
      }
      if ((lane & 3) == 0) {
        sml[ra * 2] = m_a;
        sml[ra * 2 + 1] = l_a;
        sml[(ra + 8) * 2] = m_b;
        sml[(ra + 8) * 2 + 1] = l_b;
      }
    }
    __syncthreads();
    if (active && slice == 0) {
      const int ra = lane >> 2;
      for (int s2 = 1; s2 < slices; ++s2) {
        const int w2 = rt + s2 * row_tiles;
        const float* o2 = scratch + w2 * 16 * D;
        const float* ml2 = scratch + kWarps * 16 * D + w2 * 32;
        const float m2a = ml2[ra * 2], l2a = ml2[ra * 2 + 1];
        const float m2b = ml2[(ra + 8) * 2], l2b = ml2[(ra + 8) * 2 + 1];
        const float na = fmaxf(m_a, m2a), nb = fmaxf(m_b, m2b);
        const float sa = na == -INFINITY ? 0.0f : na, sb = nb == -INFINITY ? 0.0f : nb;
        const float wa1 = Exp2(m_a - sa), wa2 = Exp2(m2a - sa);
        const float wb1 = Exp2(m_b - sb), wb2 = Exp2(m2b - sb);
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
          const int col = n * 8 + (lane & 3) * 2;
          acc[n][0] = acc[n][0] * wa1 + o2[ra * D + col] * wa2;
          acc[n][1] = acc[n][1] * wa1 + o2[ra * D + col + 1] * wa2;
          acc[n][2] = acc[n][2] * wb1 + o2[(ra + 8) * D + col] * wb2;
          acc[n][3] = acc[n][3] * wb1 + o2[(ra + 8) * D + col + 1] * wb2;
        }
        l_a = l_a * wa1 + l2a * wa2;
        l_b = l_b * wb1 + l2b * wb2;
        m_a = na;
        m_b = nb;
      }
    }
  }
  if (!active || slice != 0) return;

    // ---- Write: normalized output, or the fp32 partial (o, m, l).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int lr = half == 0 ? row_a : row_b;
    if (lr >= num_rows) continue;
    const float m = half == 0 ? m_a : m_b;
    const float l = half == 0 ? l_a : l_b;
    const int R = row_begin + lr;
    const int head = kv_head * group + R % group;
    if (out == kDirectOutput) {
      const int64_t token = token_base + R / group;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      uint32_t* dst =
          reinterpret_cast<uint32_t*>(static_cast<T*>(a.o) + (token * heads + head) * D);
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        const int col = n * 8 + (lane & 3) * 2;
        dst[col / 2] = M::Pack(acc[n][half * 2] * inv, acc[n][half * 2 + 1] * inv);
      }
    } else {
      const int64_t entry = out + static_cast<int64_t>(R / group) * heads + head;
      float2* po = reinterpret_cast<float2*>(a.part_o + entry * D);
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        const int col = n * 8 + (lane & 3) * 2;
        po[col / 2] = make_float2(acc[n][half * 2], acc[n][half * 2 + 1]);
      }
      if ((lane & 3) == 0) {
        a.part_ml[entry * 2] = m;
        a.part_ml[entry * 2 + 1] = l;
      }
    }
  }
}

// One warp per (merged sequence, query head): combines the sequence's partial entries with the
// online-softmax merge (paper Eq. 2) in fp32 and writes the normalized output. No entries (a
// sequence without tokens) or l == 0: zeros.
//
// Latency, not bandwidth, bounds this kernel (a few KB per warp), so the dependent loads are
// batched: up to 32 entries at a time, each lane reads one entry's id and (m, l) (one round trip
// for the batch, not one per entry), the batch's maximum and weights come from warp shuffles,
// and the o rows are read as independent vector loads (a lane owns D / 32 adjacent columns).
template <typename T, int D>
__global__ void __launch_bounds__(128) MergeKernel(const MergeArgs a) {
  static_assert(D == 64 || D == 128, "head_dim");
  constexpr int kPer = D / 32;  // 2 or 4 adjacent columns per lane
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp_id >= static_cast<int64_t>(a.num_merge) * a.num_qo_heads) return;
  const int kk = static_cast<int>(warp_id / a.num_qo_heads);
  const int h = static_cast<int>(warp_id % a.num_qo_heads);
  const int e0 = a.merge_indptr[kk];
  const int e1 = a.merge_indptr[kk + 1];
  float mx = -INFINITY, l = 0.0f;
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  for (int base = e0; base < e1; base += 32) {
    const int n = min(32, e1 - base);
    int64_t entry = 0;
    float m = -INFINITY, lv = 0.0f;
    if (lane < n) {
      entry = int64_t{a.merge_entry[base + lane]} + h;
      const float2 ml = reinterpret_cast<const float2*>(a.part_ml)[entry];
      m = ml.x;
      lv = ml.y;
    }
    float bm = m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
    const float nm = fmaxf(mx, bm);
    const float shift = nm == -INFINITY ? 0.0f : nm;  // no (-inf) - (-inf)
    const float keep = Exp2(mx - shift);              // 0 for the first batch (mx = -inf)
    const float w = lane < n ? Exp2(m - shift) : 0.0f;
    float wl = w * lv;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) wl += __shfl_xor_sync(0xffffffffu, wl, o);
    l = l * keep + wl;
    mx = nm;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= keep;
#pragma unroll 2
    for (int j = 0; j < n; ++j) {
      const float wj = __shfl_sync(0xffffffffu, w, j);
      const int64_t ej = __shfl_sync(0xffffffffu, entry, j);
      float pv[kPer];
      if constexpr (kPer == 4) {
        const float4 v4 = reinterpret_cast<const float4*>(a.part_o + ej * D)[lane];
        pv[0] = v4.x;
        pv[1] = v4.y;
        pv[2] = v4.z;
        pv[3] = v4.w;
      } else {
        const float2 v2 = reinterpret_cast<const float2*>(a.part_o + ej * D)[lane];
        pv[0] = v2.x;
        pv[1] = v2.y;
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += wj * pv[i];
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* dst = static_cast<T*>(a.o) + (int64_t{a.merge_seq[kk]} * a.num_qo_heads + h) * D;
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    reinterpret_cast<uint32_t*>(dst)[(lane * kPer + i) / 2] =
        Mma<T>::Pack(acc[i] * inv, acc[i + 1] * inv);
  }
}

// Raises the kernel's dynamic shared-memory limit and carveout once per device (the attributes
// are per device context), so that launches in a timed loop pay no driver call.
template <typename T, int D>
cudaError_t EnsureAttendSmem(size_t smem) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> configured[kMaxDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && configured[device].load(std::memory_order_relaxed) >= static_cast<int>(smem)) {
    return cudaSuccess;
  }
  err = cudaFuncSetAttribute(AttendKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
  // The largest shared-memory carveout, so that as many blocks fit per SM as registers allow
  // (three at head_dim 128, chunk 64) rather than what a default carveout leaves room for.
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(AttendKernel<T, D>,
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  }
  if (err == cudaSuccess && cached) {
    int seen = configured[device].load(std::memory_order_relaxed);
    while (seen < static_cast<int>(smem) &&
           !configured[device].compare_exchange_weak(seen, static_cast<int>(smem))) {
    }
  }
  return err;
}

template <typename T, int D>
cudaError_t LaunchAttendD(const AttendArgs& args, dim3 grid, size_t smem, cudaStream_t stream) {
  const cudaError_t err = EnsureAttendSmem<T, D>(smem);
  if (err != cudaSuccess) return err;
  AttendKernel<T, D><<<grid, kAttendThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAttendT(const AttendArgs& args, int32_t head_dim, dim3 grid, size_t smem,
                          cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return LaunchAttendD<T, 64>(args, grid, smem, stream);
    case 128:
      return LaunchAttendD<T, 128>(args, grid, smem, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t LaunchMergeT(const MergeArgs& args, int32_t head_dim, cudaStream_t stream) {
  const int64_t warps = static_cast<int64_t>(args.num_merge) * args.num_qo_heads;
  if (warps == 0) return cudaSuccess;
  const int64_t blocks = (warps * 32 + 127) / 128;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 64:
      MergeKernel<T, 64><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(args);
      break;
    case 128:
      MergeKernel<T, 128><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(args);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace chunkserve::kernels::cuda::detail

#endif  // CHUNKSERVE_KERNELS_CUDA_ATTENTION_IMPL_CUH_
