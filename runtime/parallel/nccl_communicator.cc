#include "runtime/parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <utility>

namespace chunkserve::parallel {
namespace {

Status FromNccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  const std::string msg = std::string("nccl ") + what + ": " + ncclGetErrorString(r);
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return Status::InvalidArgument(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return Status::Unavailable(msg);
    default:
      return Status::Internal(msg);
  }
}

Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("cuda ") + what + ": " + cudaGetErrorString(e));
}

// A short pause between polls: NCCL kernels finish in microseconds to milliseconds, and a tight
// spin would steal the core the proxy thread needs.
void PollPause() { std::this_thread::sleep_for(std::chrono::microseconds(20)); }

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  int32_t device = 0;
  cudaStream_t stream = nullptr;
  void* staging = nullptr;  // device buffer for host data
  size_t staging_bytes = 0;
  std::mutex op_mu;
  mutable std::mutex state_mu;
  Status broken;
  std::atomic<bool> abort_requested{false};
  bool aborted = false;  // ncclCommAbort ran (op_mu held)

  // Under op_mu: abort the communicator once.
  void AbortLocked() {
    if (!aborted && comm != nullptr) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }
  void Break(const Status& s) {
    std::lock_guard<std::mutex> lock(state_mu);
    if (broken.ok()) broken = s;
  }
  Status Health() const {
    std::lock_guard<std::mutex> lock(state_mu);
    return broken;
  }

  // Polls until the work on `on` (default: the communicator's stream) is done; errors, Abort()
  // and the deadline abort the comm.
  Status Wait(const char* what, Deadline deadline, cudaStream_t on = nullptr) {
    if (on == nullptr) on = stream;
    for (;;) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        const Status s = FromNccl(r != ncclSuccess ? r : async, what);
        Break(s);
        AbortLocked();
        return s;
      }
      if (async == ncclSuccess) {
        const cudaError_t q = cudaStreamQuery(on);
        if (q == cudaSuccess) return Status::Ok();
        if (q != cudaErrorNotReady) {
          const Status s = FromCuda(q, what);
          Break(s);
          AbortLocked();
          return s;
        }
      }
      if (abort_requested.load()) {
        AbortLocked();
        return Health();
      }
      if (deadline.Passed()) {
        const Status s = Status::DeadlineExceeded(std::string("nccl ") + what +
                                                  ": a peer did not arrive before the deadline");
        Break(s);
        AbortLocked();
        return s;
      }
      PollPause();
    }
  }

  Result<void*> Staging(size_t bytes) {
    if (bytes <= staging_bytes) return staging;
    if (staging != nullptr) cudaFree(staging);
    staging = nullptr;
    staging_bytes = 0;
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaMalloc(&staging, bytes), "cudaMalloc"));
    staging_bytes = bytes;
    return staging;
  }

  // Runs `enqueue(device_ptr)` on data that may be host or device memory.
  template <typename Enqueue>
  Status Run(const char* what, void* data, size_t bytes, bool copy_in, Deadline deadline,
             Enqueue&& enqueue) {
    std::lock_guard<std::mutex> lock(op_mu);
    CHUNKSERVE_RETURN_IF_ERROR(Health());
    CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "cudaSetDevice"));
    cudaPointerAttributes attr{};
    const bool on_device =
        cudaPointerGetAttributes(&attr, data) == cudaSuccess &&
        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
    cudaGetLastError();  // a host pointer may leave a sticky "invalid value" behind
    void* dev = data;
    if (!on_device) {
      CHUNKSERVE_ASSIGN_OR_RETURN(dev, Staging(bytes));
      if (copy_in) {
        CHUNKSERVE_RETURN_IF_ERROR(
            FromCuda(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, stream), "copy in"));
      }
    }
    ncclResult_t r = enqueue(dev);
    if (r != ncclSuccess && r != ncclInProgress) {
      const Status s = FromNccl(r, what);
      Break(s);
      AbortLocked();
      return s;
    }
    if (!on_device) {
      CHUNKSERVE_RETURN_IF_ERROR(
          FromCuda(cudaMemcpyAsync(data, dev, bytes, cudaMemcpyDeviceToHost, stream), "copy out"));
    }
    return Wait(what, deadline);
  }
};

Result<std::vector<char>> NewNcclUniqueId() {
  ncclUniqueId id;
  CHUNKSERVE_RETURN_IF_ERROR(FromNccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  std::vector<char> bytes(sizeof(id.internal));
  std::memcpy(bytes.data(), id.internal, bytes.size());
  return bytes;
}

Result<std::vector<char>> ExchangeNcclUniqueId(TcpStoreClient* store, int32_t rank,
                                               const std::string& key, Deadline deadline) {
  if (rank == 0) {
    CHUNKSERVE_ASSIGN_OR_RETURN(std::vector<char> id, NewNcclUniqueId());
    CHUNKSERVE_RETURN_IF_ERROR(store->Set(key, id, deadline));
    return id;
  }
  return store->Get(key, deadline);
}

int32_t CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

NcclCommunicator::NcclCommunicator(int32_t rank, int32_t size, std::unique_ptr<Impl> impl)
    : rank_(rank), size_(size), impl_(std::move(impl)) {}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(const NcclOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("nccl: rank " + std::to_string(options.rank) +
                                   " outside a group of " + std::to_string(options.size));
  }
  ncclUniqueId id;
  if (options.unique_id.size() != sizeof(id.internal)) {
    return Status::InvalidArgument("nccl: the unique id must be " +
                                   std::to_string(sizeof(id.internal)) + " bytes");
  }
  std::memcpy(id.internal, options.unique_id.data(), sizeof(id.internal));
  if (options.device < 0 || options.device >= CudaDeviceCount()) {
    return Status::Unavailable("nccl: CUDA device " + std::to_string(options.device) +
                               " is not available");
  }
  auto impl = std::make_unique<Impl>();
  impl->device = options.device;
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaSetDevice(options.device), "cudaSetDevice"));
  CHUNKSERVE_RETURN_IF_ERROR(
      FromCuda(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "stream"));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with a deadline
  const Deadline deadline = Deadline::After(options.timeout);
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    const Status s = FromNccl(r, "ncclCommInitRankConfig");
    if (impl->comm != nullptr) ncclCommAbort(impl->comm);
    cudaStreamDestroy(impl->stream);
    return s;
  }
  for (;;) {
    ncclResult_t state = ncclInProgress;
    r = ncclCommGetAsyncError(impl->comm, &state);
    if (r == ncclSuccess && state == ncclSuccess) break;
    if (r != ncclSuccess || state != ncclInProgress || deadline.Passed()) {
      const Status s = r != ncclSuccess          ? FromNccl(r, "ncclCommGetAsyncError")
                       : state != ncclInProgress ? FromNccl(state, "ncclCommInitRankConfig")
                                                 : Status::DeadlineExceeded(
                                                       "nccl: not every rank joined before the "
                                                       "deadline");
      ncclCommAbort(impl->comm);
      cudaStreamDestroy(impl->stream);
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(options.rank, options.size, std::move(impl)));
}

NcclCommunicator::~NcclCommunicator() {
  std::lock_guard<std::mutex> lock(impl_->op_mu);
  cudaSetDevice(impl_->device);
  if (!impl_->aborted) {
    bool clean = impl_->Health().ok();
    if (clean && ncclCommFinalize(impl_->comm) == ncclInProgress) {
      // Finalize flushes outstanding work; bounded, then abort.
      const Deadline d = Deadline::After(std::chrono::seconds(10));
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(impl_->comm, &state) == ncclSuccess && state == ncclInProgress &&
             !d.Passed()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(impl_->comm);
    } else {
      ncclCommAbort(impl_->comm);
    }
  }
  if (impl_->staging != nullptr) cudaFree(impl_->staging);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

Status NcclCommunicator::AllReduceSum(std::span<float> data, Deadline deadline) {
  if (data.empty()) return health();
  return impl_->Run("all-reduce", data.data(), data.size_bytes(), true, deadline, [&](void* dev) {
    return ncclAllReduce(dev, dev, data.size(), ncclFloat, ncclSum, impl_->comm, impl_->stream);
  });
}

Status NcclCommunicator::AllReduceSumOnStream(std::span<float> data, void* cuda_stream,
                                              Deadline deadline) {
  if (data.empty()) return health();
  std::lock_guard<std::mutex> lock(impl_->op_mu);
  CHUNKSERVE_RETURN_IF_ERROR(impl_->Health());
  CHUNKSERVE_RETURN_IF_ERROR(FromCuda(cudaSetDevice(impl_->device), "cudaSetDevice"));
  auto* s = static_cast<cudaStream_t>(cuda_stream);
  const ncclResult_t r =
      ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, impl_->comm, s);
  if (r != ncclSuccess && r != ncclInProgress) {
    const Status st = FromNccl(r, "all-reduce");
    impl_->Break(st);
    impl_->AbortLocked();
    return st;
  }
  return impl_->Wait("all-reduce", deadline, s);
}

Status NcclCommunicator::Broadcast(std::span<std::byte> data, int32_t root, Deadline deadline) {
  if (root < 0 || root >= size_) return Status::InvalidArgument("nccl broadcast: bad root");
  if (data.empty()) return health();
  return impl_->Run("broadcast", data.data(), data.size(), rank_ == root, deadline, [&](void* dev) {
    return ncclBroadcast(dev, dev, data.size(), ncclUint8, root, impl_->comm, impl_->stream);
  });
}

Status NcclCommunicator::Barrier(Deadline deadline) {
  float one = 1.0f;  // an all-reduce of one value: every rank must arrive
  return AllReduceSum(std::span<float>(&one, 1), deadline);
}

void NcclCommunicator::Abort(const Status& reason) {
  impl_->Break(reason.ok() ? Status::Aborted("nccl communicator aborted") : reason);
  impl_->abort_requested = true;
  // No operation in flight: abort now. Otherwise the operation's poll loop aborts.
  std::unique_lock<std::mutex> lock(impl_->op_mu, std::try_to_lock);
  if (lock.owns_lock()) impl_->AbortLocked();
}

Status NcclCommunicator::health() const { return impl_->Health(); }

}  // namespace chunkserve::parallel
