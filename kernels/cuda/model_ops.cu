#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/shapes.h"

namespace chunkserve::kernels::cuda {
namespace {

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromF<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks < 1 ? 1 : blocks) : 65536);
}

constexpr int kNormThreads = 256;

// x in TX (fp32 residual or 16-bit), weight and y in T.
template <typename TX, typename T>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const TX* x, const T* w, T* y, int32_t dim, float eps) {
  const TX* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  T* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kNormThreads) {
    const float v = ToF(xr[i]);
    sum += v * v;
  }
  __shared__ float warp_sums[kNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormThreads / 32; ++i) total += warp_sums[i];
  const float inv = rsqrtf(total / static_cast<float>(dim) + eps);
  // Each thread rewrites only the elements it read, so y may alias x (same dtype).
  for (int i = threadIdx.x; i < dim; i += kNormThreads) {
    yr[i] = FromF<T>(ToF(xr[i]) * inv * ToF(w[i]));
  }
}

template <typename T>
__global__ void RopeKernel(T* x, const int32_t* positions, int64_t rows, int32_t heads,
                           int32_t head_dim, const float* inv_freq) {
  const int32_t half = head_dim / 2;
  const int64_t total = rows * heads * half;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(idx % half);
    const int64_t rh = idx / half;  // row * heads + head
    const int64_t row = rh / heads;
    // fp64 product reduced mod 2 pi, then fp32 sin/cos: exact enough for any int32 position.
    const double angle =
        fmod(static_cast<double>(positions[row]) * inv_freq[i], 6.283185307179586476925286766559);
    float s, c;
    sincosf(static_cast<float>(angle), &s, &c);
    T* v = x + rh * head_dim;
    const float a = ToF(v[i]);
    const float b = ToF(v[i + half]);
    v[i] = FromF<T>(a * c - b * s);
    v[i + half] = FromF<T>(b * c + a * s);
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToF(gate[i]);
    out[i] = FromF<T>(g / (1.0f + expf(-g)) * ToF(up[i]));
  }
}

// Row gather with conversion (16-bit -> 16-bit copies bits; -> fp32 widens).
template <typename TIn, typename TOut>
__global__ void EmbeddingKernel(const TIn* table, int32_t vocab, int32_t dim, const int32_t* ids,
                                int64_t n, TOut* out) {
  const int64_t total = n * dim;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / dim;
    const int32_t d = static_cast<int32_t>(idx % dim);
    const int32_t id = ids[row];
    out[idx] = (id >= 0 && id < vocab) ? FromF<TOut>(ToF(table[static_cast<int64_t>(id) * dim + d]))
                                       : FromF<TOut>(0.0f);
  }
}

// One thread per 16-byte piece (8 elements) of a (token, head) row.
__global__ void KvAppendKernel(uint4* k, uint4* v, int32_t num_slots, int32_t kv_heads,
                               int32_t chunk, int32_t pieces, const uint4* k_new,
                               const uint4* v_new, const int32_t* slot, const int32_t* offset,
                               int32_t num_tokens) {
  const int64_t total = static_cast<int64_t>(num_tokens) * kv_heads * pieces;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t pc = static_cast<int32_t>(idx % pieces);
    const int64_t th = idx / pieces;  // token * kv_heads + head
    const int32_t h = static_cast<int32_t>(th % kv_heads);
    const int64_t t = th / kv_heads;
    const int32_t s = slot[t];
    const int32_t off = offset[t];
    if (s < 0 || s >= num_slots || off < 0 || off >= chunk) continue;
    const int64_t dst = ((static_cast<int64_t>(s) * kv_heads + h) * chunk + off) * pieces + pc;
    k[dst] = k_new[idx];
    v[dst] = v_new[idx];
  }
}

__global__ void KvCopyKernel(uint4* k, uint4* v, int32_t kv_heads, int32_t chunk, int32_t pieces,
                             int32_t src_slot, int32_t dst_slot, int32_t num_tokens) {
  const int64_t total = static_cast<int64_t>(kv_heads) * num_tokens * pieces;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t pc = static_cast<int32_t>(idx % pieces);
    const int64_t ht = idx / pieces;
    const int32_t t = static_cast<int32_t>(ht % num_tokens);
    const int32_t h = static_cast<int32_t>(ht / num_tokens);
    const int64_t row = static_cast<int64_t>(h) * chunk + t;
    const int64_t slot_stride = static_cast<int64_t>(kv_heads) * chunk * pieces;
    k[dst_slot * slot_stride + row * pieces + pc] = k[src_slot * slot_stride + row * pieces + pc];
    v[dst_slot * slot_stride + row * pieces + pc] = v[src_slot * slot_stride + row * pieces + pc];
  }
}

bool Is16Bit(DType t) { return t == DType::kF16 || t == DType::kBF16; }

const char* CheckArena(const KvArenaLayerDevice& kv) {
  if (const char* e =
          CheckKvArenaShape(kv.dtype, kv.num_slots, kv.num_kv_heads, kv.chunk_size, kv.head_dim)) {
    return e;
  }
  if (kv.k == nullptr || kv.v == nullptr || !Aligned16(kv.k) || !Aligned16(kv.v)) {
    return "arena pointers must be non-null and 16-byte aligned";
  }
  return nullptr;
}

}  // namespace

cudaError_t RmsNorm(DType x_dtype, DType dtype, const void* x, const void* weight, void* y,
                    int64_t rows, int32_t dim, float eps, cudaStream_t stream) {
  if (!Is16Bit(dtype) || (x_dtype != dtype && x_dtype != DType::kF32) ||
      CheckRmsNormShape(rows, dim) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows > 0x7fffffff || !(eps >= 0.0f)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (x == nullptr || weight == nullptr || y == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows));
  auto launch = [&](auto tx, auto t) {
    using TX = decltype(tx);
    using T = decltype(t);
    RmsNormKernel<TX, T><<<grid, kNormThreads, 0, stream>>>(
        static_cast<const TX*>(x), static_cast<const T*>(weight), static_cast<T*>(y), dim, eps);
  };
  if (dtype == DType::kF16) {
    x_dtype == DType::kF32 ? launch(float{}, __half{}) : launch(__half{}, __half{});
  } else {
    x_dtype == DType::kF32 ? launch(float{}, __nv_bfloat16{})
                           : launch(__nv_bfloat16{}, __nv_bfloat16{});
  }
  return cudaGetLastError();
}

cudaError_t ApplyRope(DType dtype, void* x, const int32_t* positions, int64_t rows,
                      int32_t num_heads, int32_t head_dim, const float* inv_freq,
                      cudaStream_t stream) {
  if (!Is16Bit(dtype) || CheckRopeShape(rows, num_heads, head_dim) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) return cudaErrorInvalidValue;
  const int64_t total = rows * num_heads * (head_dim / 2);
  if (dtype == DType::kF16) {
    RopeKernel<__half><<<GridFor(total, 256), 256, 0, stream>>>(
        static_cast<__half*>(x), positions, rows, num_heads, head_dim, inv_freq);
  } else {
    RopeKernel<__nv_bfloat16><<<GridFor(total, 256), 256, 0, stream>>>(
        static_cast<__nv_bfloat16*>(x), positions, rows, num_heads, head_dim, inv_freq);
  }
  return cudaGetLastError();
}

cudaError_t SiluMul(DType dtype, const void* gate, const void* up, void* out, int64_t n,
                    cudaStream_t stream) {
  if (!Is16Bit(dtype) || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (gate == nullptr || up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (dtype == DType::kF16) {
    SiluMulKernel<__half><<<GridFor(n, 256), 256, 0, stream>>>(static_cast<const __half*>(gate),
                                                               static_cast<const __half*>(up),
                                                               static_cast<__half*>(out), n);
  } else {
    SiluMulKernel<__nv_bfloat16><<<GridFor(n, 256), 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up),
        static_cast<__nv_bfloat16*>(out), n);
  }
  return cudaGetLastError();
}

cudaError_t EmbeddingGather(DType table_dtype, DType out_dtype, const void* table, int32_t vocab,
                            int32_t dim, const int32_t* ids, int64_t n, void* out,
                            cudaStream_t stream) {
  // Same dtype (16-bit or fp32), or 16-bit widened to fp32.
  if (!(table_dtype == out_dtype || out_dtype == DType::kF32) || vocab < 1 || dim < 1 || n < 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (table == nullptr || ids == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const unsigned grid = GridFor(n * dim, 256);
  auto launch = [&](auto tin, auto tout) {
    using TIn = decltype(tin);
    using TOut = decltype(tout);
    EmbeddingKernel<TIn, TOut><<<grid, 256, 0, stream>>>(static_cast<const TIn*>(table), vocab, dim,
                                                         ids, n, static_cast<TOut*>(out));
  };
  if (table_dtype == DType::kF32) {
    launch(float{}, float{});
  } else if (table_dtype == DType::kF16) {
    out_dtype == DType::kF32 ? launch(__half{}, float{}) : launch(__half{}, __half{});
  } else {
    out_dtype == DType::kF32 ? launch(__nv_bfloat16{}, float{})
                             : launch(__nv_bfloat16{}, __nv_bfloat16{});
  }
  return cudaGetLastError();
}

cudaError_t KvAppend(const KvArenaLayerDevice& kv, const void* k_new, const void* v_new,
                     const int32_t* slot, const int32_t* offset, int32_t num_tokens,
                     cudaStream_t stream) {
  if (CheckArena(kv) != nullptr || num_tokens < 0) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  if (k_new == nullptr || v_new == nullptr || slot == nullptr || offset == nullptr ||
      !Aligned16(k_new) || !Aligned16(v_new)) {
    return cudaErrorInvalidValue;
  }
  const int32_t pieces = kv.head_dim / 8;
  const int64_t total = int64_t{num_tokens} * kv.num_kv_heads * pieces;
  KvAppendKernel<<<GridFor(total, 256), 256, 0, stream>>>(
      static_cast<uint4*>(kv.k), static_cast<uint4*>(kv.v), kv.num_slots, kv.num_kv_heads,
      kv.chunk_size, pieces, static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new),
      slot, offset, num_tokens);
  return cudaGetLastError();
}

cudaError_t KvCopy(const KvArenaLayerDevice& kv, int32_t src_slot, int32_t dst_slot,
                   int32_t num_tokens, cudaStream_t stream) {
  if (CheckArena(kv) != nullptr) return cudaErrorInvalidValue;
  if (src_slot < 0 || src_slot >= kv.num_slots || dst_slot < 0 || dst_slot >= kv.num_slots ||
      src_slot == dst_slot || num_tokens < 0 || num_tokens > kv.chunk_size) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const int32_t pieces = kv.head_dim / 8;
  const int64_t total = int64_t{kv.num_kv_heads} * num_tokens * pieces;
  KvCopyKernel<<<GridFor(total, 256), 256, 0, stream>>>(
      static_cast<uint4*>(kv.k), static_cast<uint4*>(kv.v), kv.num_kv_heads, kv.chunk_size, pieces,
      src_slot, dst_slot, num_tokens);
  return cudaGetLastError();
}

}  // namespace chunkserve::kernels::cuda
