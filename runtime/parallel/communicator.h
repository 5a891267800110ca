// Communicator: the collectives a tensor-parallel group needs (runtime/README.md "parallel/").
//
//   Status s = comm->AllReduceSum(hidden, Deadline::After(timeout));   // every rank, same order
//
// A group of `size()` ranks runs the same sequence of operations; each operation is a collective
// that every rank must enter. Every operation takes a deadline: a peer that died, or hangs past
// the deadline, gives an error Status (Unavailable for a lost or failed peer, DeadlineExceeded for
// a timeout) and never a hang. After any failed operation the group's state is unknown (a peer
// may have seen the operation complete), so the communicator is *broken*: every later operation
// fails at once with the first error. There is no recovery inside a communicator; a group is
// rebuilt from scratch.
//
// Implementations: GlooCommunicator (CPU ranks, TCP; host memory) and NcclCommunicator (GPU
// ranks; activations reduced in device memory on the backend's stream, control data staged).
//
// Thread safety: operations are serialized internally (one at a time per communicator); Abort()
// may be called from any thread, at any time, including while an operation runs.
#ifndef CHUNKSERVE_RUNTIME_PARALLEL_COMMUNICATOR_H_
#define CHUNKSERVE_RUNTIME_PARALLEL_COMMUNICATOR_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "runtime/base/status.h"

namespace chunkserve::parallel {

using Clock = std::chrono::steady_clock;

// An absolute point in time after which an operation gives up.
struct Deadline {
  Clock::time_point at;

  static Deadline After(std::chrono::milliseconds timeout) { return {Clock::now() + timeout}; }
  // Time left, at least 1 ms (libraries treat 0 as "no timeout").
  std::chrono::milliseconds Remaining() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }
  bool Passed() const { return Clock::now() >= at; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl"

  // Sums `data` element-wise across the group, in place; every rank receives bit-identical
  // results (each element is reduced in one place and copied), so ranks that start equal stay
  // equal.
  virtual Status AllReduceSum(std::span<float> data, Deadline deadline) = 0;

  // Copies `root`'s bytes into every rank's `data` (same size on every rank).
  // AllReduceSum of device memory (of this rank's GPU), ordered after the work already queued on
  // `cuda_stream` (a cudaStream_t) and run on it; returns once the sum is complete. GPU
  // communicators only: the default is Unimplemented.
  virtual Status AllReduceSumOnStream(std::span<float> data, void* cuda_stream, Deadline deadline) {
    (void)data;
    (void)cuda_stream;
    (void)deadline;
    return Status::Unimplemented(name() + " cannot reduce device memory");
  }

  virtual Status Broadcast(std::span<std::byte> data, int32_t root, Deadline deadline) = 0;

  virtual Status Barrier(Deadline deadline) = 0;

  // Breaks the communicator with `reason`: later operations fail at once; an operation in flight
  // fails no later than its deadline (sooner when the transport notices). Idempotent; the first
  // reason wins.
  virtual void Abort(const Status& reason) = 0;

  // OK, or the error that broke the communicator.
  virtual Status health() const = 0;
};

}  // namespace chunkserve::parallel

#endif  // CHUNKSERVE_RUNTIME_PARALLEL_COMMUNICATOR_H_
