// bf16 instantiations of the attend and merge kernels (head_dim 64 and 128).
#include "kernels/cuda/attention_impl.cuh"

namespace chunkserve::kernels::cuda::detail {

cudaError_t LaunchAttendBf16(const AttendArgs& args, int32_t head_dim, dim3 grid, size_t smem,
                             cudaStream_t stream) {
  return LaunchAttendT<__nv_bfloat16>(args, head_dim, grid, smem, stream);
}

cudaError_t LaunchMergeBf16(const MergeArgs& args, int32_t head_dim, cudaStream_t stream) {
  return LaunchMergeT<__nv_bfloat16>(args, head_dim, stream);
}

}  // namespace chunkserve::kernels::cuda::detail
