#include "kernels/cuda/device_plan.h"

#include <utility>

namespace chunkserve::kernels::cuda {

DevicePlan::~DevicePlan() { Release(); }

DevicePlan::DevicePlan(DevicePlan&& other) noexcept { *this = std::move(other); }

DevicePlan& DevicePlan::operator=(DevicePlan&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::move(other.cache_);
    device_ = std::exchange(other.device_, nullptr);
    capacity_words_ = std::exchange(other.capacity_words_, 0);
    num_sms_ = other.num_sms_;
    last_upload_ = other.last_upload_;
    last_upload_bytes_ = other.last_upload_bytes_;
    other.cache_.Invalidate();
  }
  return *this;
}

void DevicePlan::Release() {
  if (device_ != nullptr) cudaFree(device_);
  device_ = nullptr;
  capacity_words_ = 0;
}

cudaError_t DevicePlan::Update(const TppPlanView& plan, const TppScheduleShape& shape,
                               cudaStream_t stream, TppScheduleOptions options) {
  last_upload_ = PlanUpload::kNone;
  last_upload_bytes_ = 0;
  if (options.num_sms == 0) {
    if (num_sms_ == 0) {
      int device = 0;
      cudaError_t err = cudaGetDevice(&device);
      if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device);
      }
      if (err != cudaSuccess) return err;
    }
    options.num_sms = num_sms_;
  }
  PlanUpload upload = PlanUpload::kNone;
  size_t begin = 0, end = 0;
  if (cache_.Prepare(plan, shape, options, &upload, &begin, &end) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (upload == PlanUpload::kNone) return cudaSuccess;
  const size_t total = cache_.layout().total;
  if (total > capacity_words_) {
    Release();
    size_t capacity = 1024;
    while (capacity < total) capacity *= 2;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&device_), capacity * 4);
    if (err != cudaSuccess) {
      device_ = nullptr;
      cache_.Invalidate();
      return err;
    }
    capacity_words_ = capacity;
    begin = 0;  // a new buffer holds nothing yet
    end = total;
    upload = PlanUpload::kFull;
  }
  const cudaError_t err = cudaMemcpyAsync(device_ + begin, cache_.packed().data() + begin,
                                          (end - begin) * 4, cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) {
    cache_.Invalidate();
    return err;
  }
  last_upload_ = upload;
  last_upload_bytes_ = (end - begin) * 4;
  return cudaSuccess;
}

size_t DevicePlan::WorkspaceBytes(int32_t head_dim) const {
  return cache_.valid() ? TppWorkspaceBytes(cache_.schedule(), head_dim) : 0;
}

TppDeviceSchedule DevicePlan::view() const {
  TppDeviceSchedule v;
  if (!ready()) return v;
  const TppPlanCache::Layout& l = cache_.layout();
  const TppSchedule& s = cache_.schedule();
  v.tasks = reinterpret_cast<const TppTask*>(device_ + l.tasks);
  v.num_tasks = static_cast<int32_t>(s.tasks.size());
  v.chunk_slot = device_ + l.chunk_slot;
  v.chunk_len = device_ + l.chunk_len;
  v.merge_seq = device_ + l.merge_seq;
  v.merge_indptr = device_ + l.merge_indptr;
  v.merge_entry = device_ + l.merge_entry;
  v.num_merge = static_cast<int32_t>(s.merge_seq.size());
  v.num_partial_entries = s.num_partial_entries;
  v.num_seqs = cache_.num_seqs();
  v.shape = cache_.shape();
  return v;
}

}  // namespace chunkserve::kernels::cuda
