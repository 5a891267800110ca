// fp16 instantiations of the attend and merge kernels (head_dim 64 and 128).
#include "kernels/cuda/attention_impl.cuh"

namespace chunkserve::kernels::cuda::detail {

cudaError_t LaunchAttendF16(const AttendArgs& args, int32_t head_dim, dim3 grid, size_t smem,
                            cudaStream_t stream) {
  return LaunchAttendT<__half>(args, head_dim, grid, smem, stream);
}

cudaError_t LaunchMergeF16(const MergeArgs& args, int32_t head_dim, cudaStream_t stream) {
  return LaunchMergeT<__half>(args, head_dim, stream);
}

}  // namespace chunkserve::kernels::cuda::detail
