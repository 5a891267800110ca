// NcclCommunicator: the Communicator of GPU ranks (one CUDA device per rank), on NCCL.
//
// Creation: rank 0 makes an ncclUniqueId (NewNcclUniqueId) and the group exchanges it over the
// worker's control channel (ExchangeNcclUniqueId: rank 0 publishes it in the rendezvous
// TcpStore, the others read it); then every rank calls ncclCommInitRankConfig with a
// non-blocking config and polls ncclCommGetAsyncError until the communicator is ready or the
// deadline passes (then ncclCommAbort). Operations are enqueued on the communicator's own stream
// and polled (cudaStreamQuery + ncclCommGetAsyncError) until done, an asynchronous error, Abort(),
// or the deadline: on any of those the communicator is aborted with ncclCommAbort, which is what
// unblocks the peers' kernels too. NCCL and CUDA error codes become Status here, once.
//
// AllReduceSumOnStream takes device memory and runs ncclAllReduce on the caller's stream (the CUDA
// backend's), after the work queued there, then polls that stream as above: activations never
// touch the host. The other operations carry control data (step descriptors, failure counts):
// host buffers are staged through a device buffer on the communicator's stream, device buffers
// are used in place.
//
// Thread safety: as Communicator. Only built when the CUDA toolkit ships NCCL
// (CHUNKSERVE_HAVE_NCCL).
#ifndef CHUNKSERVE_RUNTIME_PARALLEL_NCCL_COMMUNICATOR_H_
#define CHUNKSERVE_RUNTIME_PARALLEL_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/parallel/communicator.h"
#include "runtime/parallel/tcp_store.h"

namespace chunkserve::parallel {

// The opaque ncclUniqueId as bytes (NCCL_UNIQUE_ID_BYTES). Internal when NCCL fails.
Result<std::vector<char>> NewNcclUniqueId();

// Rank 0 creates the id and publishes it under `key`; other ranks wait for it (deadline).
Result<std::vector<char>> ExchangeNcclUniqueId(TcpStoreClient* store, int32_t rank,
                                               const std::string& key, Deadline deadline);

struct NcclOptions {
  int32_t rank = 0;
  int32_t size = 1;
  int32_t device = 0;                        // CUDA device of this rank
  std::vector<char> unique_id;               // the same bytes on every rank
  std::chrono::milliseconds timeout{60000};  // for ncclCommInitRankConfig
};

class NcclCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<NcclCommunicator>> Create(const NcclOptions& options);
  ~NcclCommunicator() override;  // ncclCommFinalize + destroy when healthy, abort otherwise

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  Status AllReduceSum(std::span<float> data, Deadline deadline) override;
  Status AllReduceSumOnStream(std::span<float> data, void* cuda_stream, Deadline deadline) override;
  Status Broadcast(std::span<std::byte> data, int32_t root, Deadline deadline) override;
  Status Barrier(Deadline deadline) override;
  void Abort(const Status& reason) override;
  Status health() const override;

 private:
  struct Impl;
  NcclCommunicator(int32_t rank, int32_t size, std::unique_ptr<Impl> impl);

  const int32_t rank_;
  const int32_t size_;
  std::unique_ptr<Impl> impl_;
};

// Number of CUDA devices visible to this process (0 without a driver or device).
int32_t CudaDeviceCount();

}  // namespace chunkserve::parallel

#endif  // CHUNKSERVE_RUNTIME_PARALLEL_NCCL_COMMUNICATOR_H_
