// DevicePlan: the TPP work lists of one decode batch, resident in device memory, re-uploaded only
// when the plan changes (the paper's "lazy context copy", section 3.3).
//
// Each step the engine calls Update(plan view, shape, stream). TppPlanCache (tpp_schedule.h, CPU
// tested) compares the plan with the last one exactly and says what to copy: nothing (same plan),
// the chunk lengths only (a decode step that did not fill a chunk: a few hundred bytes), or the
// whole packed buffer (a sequence joined or left, a chunk filled, a different shape). One plan
// serves every layer of a step: call Update once per step, then TppDecode per layer.
//
// Stream order: the copy is enqueued on `stream` with cudaMemcpyAsync from pageable host memory
// (the call returns once the source has been staged, so the host buffer may change right after).
// Kernels that read the plan must run on the same stream (or after it). Growing the device buffer
// frees the old one with cudaFree, which waits for the device: it happens only when a plan
// outgrows every earlier one (capacity doubles).
//
// Thread safety: none. Not copyable; movable.
#ifndef CHUNKSERVE_KERNELS_CUDA_DEVICE_PLAN_H_
#define CHUNKSERVE_KERNELS_CUDA_DEVICE_PLAN_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/tpp_schedule.h"

namespace chunkserve::kernels::cuda {

// Device pointers into a DevicePlan's buffer plus the counts and shape the launcher needs.
struct TppDeviceSchedule {
  const TppTask* tasks = nullptr;
  int32_t num_tasks = 0;
  const int32_t* chunk_slot = nullptr;
  const int32_t* chunk_len = nullptr;
  const int32_t* merge_seq = nullptr;
  const int32_t* merge_indptr = nullptr;
  const int32_t* merge_entry = nullptr;
  int32_t num_merge = 0;
  int32_t num_partial_entries = 0;
  int32_t num_seqs = 0;
  TppScheduleShape shape;
};

class DevicePlan {
 public:
  DevicePlan() = default;
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;
  DevicePlan(DevicePlan&& other) noexcept;
  DevicePlan& operator=(DevicePlan&& other) noexcept;

  // Validates `plan` (cudaErrorInvalidValue when it is malformed or does not fit `shape`) and
  // brings the device copy up to date. `options.num_sms` 0 means: read it from the current
  // device once. On error the device copy is marked stale (the next Update uploads everything).
  cudaError_t Update(const TppPlanView& plan, const TppScheduleShape& shape, cudaStream_t stream,
                     TppScheduleOptions options = TppScheduleOptions{0, 4, 0});

  // What the last successful Update copied.
  PlanUpload last_upload() const { return last_upload_; }
  // Bytes copied host-to-device by the last Update (0 for kNone).
  size_t last_upload_bytes() const { return last_upload_bytes_; }
  // Partial storage TppDecode needs for this plan: pass at least this much workspace.
  size_t WorkspaceBytes(int32_t head_dim) const;
  bool ready() const { return cache_.valid() && device_ != nullptr; }
  TppDeviceSchedule view() const;
  const TppPlanCache& cache() const { return cache_; }

 private:
  void Release();

  TppPlanCache cache_;
  int32_t* device_ = nullptr;
  size_t capacity_words_ = 0;
  int32_t num_sms_ = 0;
  PlanUpload last_upload_ = PlanUpload::kNone;
  size_t last_upload_bytes_ = 0;
};

}  // namespace chunkserve::kernels::cuda

#endif  // CHUNKSERVE_KERNELS_CUDA_DEVICE_PLAN_H_
