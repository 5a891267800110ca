// Membership: the router's table of registered worker generations, with leases.
//
// A worker process connects to the router and sends Register (wire); Membership decides whether
// it may join (same model fingerprint, chunk size and chunk-hash version as the cluster) and
// admits it. A member's WorkerId is a hash of its operator-chosen name (IdFor), so every router
// in front of the same workers uses the same ids and rendezvous placement (RendezvousPick over
// ids) agrees across routers without them talking. A generation stays a member while it renews its
// lease (every LoadReport renews it); one whose lease passes is returned by Expired() and the
// caller drops it (index entries, load, links) at once.
//
// The cluster's model is fixed by options, or adopted from the first worker that registers when
// the options leave it open (fingerprint 0 / chunk size 0); once adopted it never changes, so the
// chain seed of the router's prompt hashes stays valid for the life of the process.
//
// A registration with a name already present (a restarted worker, or a reconnect of the same
// process) replaces the old member: the caller drops the old one (index entries, requests) after
// Validate and before Admit. The new member starts clean; its KV snapshot rebuilds the index.
//
// Thread safety: none; used on the router's event loop only.
#ifndef CHUNKSERVE_ROUTER_MEMBERSHIP_H_
#define CHUNKSERVE_ROUTER_MEMBERSHIP_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "router/routing.h"
#include "runtime/base/ids.h"
#include "runtime/base/status.h"

namespace chunkserve::router {

// The model every member must serve. 0 = adopt from the first registration.
struct ClusterModel {
  uint64_t model_fingerprint = 0;
  int32_t chunk_size = 0;
  uint32_t chunk_hash_version = 0;  // 0: kv::kHashVersion (never adopted from workers)
};

// A Register message, decoded.
struct Registration {
  std::string name;  // operator-chosen worker id
  uint64_t model_fingerprint = 0;
  int32_t chunk_size = 0;
  uint32_t chunk_hash_version = 0;
  uint64_t capacity_kv_bytes = 0;
  int32_t capacity_slots = 0;
  int32_t max_batch_size = 0;
  int32_t max_queued = 0;
  uint64_t generation = 0;
  std::string host;  // from the advertised address
  uint16_t port = 0;
};

// Splits "host:port" (IPv6 as [addr]:port). InvalidArgument otherwise.
Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port);

struct Member {
  WorkerId id;
  Registration registration;
  uint64_t control_link = 0;  // wire connection id of the worker's router link
  RouterTime lease_expiry{0};
  bool draining = false;
  uint64_t load_reports = 0;
  uint64_t free_kv_bytes = 0;  // last reported
  int32_t reported_in_flight = 0;
};

class Membership {
 public:
  Membership(ClusterModel model, RouterTime lease);

  // The stable WorkerId of a worker name (32-bit FNV-1a; never Invalid()).
  static WorkerId IdFor(const std::string& name);

  // Checks a registration against the cluster model (adopting it from the first valid one).
  // FailedPrecondition (with the reason a RegisterAck carries) for a model, chunk size or hash
  // version other than the cluster's, or an id hash that collides with another member's name;
  // InvalidArgument for a malformed one (empty name, no address, chunk size < 1).
  Status Validate(const Registration& registration);

  // Adds a validated registration as member IdFor(name), replacing any member with that id
  // (the caller has dropped it). Returns the id.
  WorkerId Admit(const Registration& registration, uint64_t control_link, RouterTime now);

  // A load report (or other sign of life) arrived: lease extended. NotFound for a non-member.
  Status Renew(WorkerId id, RouterTime now);

  // Members whose lease has passed (not removed: the caller calls Remove after cleanup).
  std::vector<WorkerId> Expired(RouterTime now) const;

  void Remove(WorkerId id);

  Member* Find(WorkerId id);
  Member* FindByLink(uint64_t control_link);
  const std::map<WorkerId, Member>& members() const { return members_; }
  size_t size() const { return members_.size(); }

  // The cluster's model; fingerprint / chunk size are 0 until fixed or adopted.
  const ClusterModel& model() const { return model_; }
  bool model_known() const { return model_.model_fingerprint != 0 && model_.chunk_size > 0; }
  // kv::ChunkHashSeed of the cluster model (0 until known).
  uint64_t chain_seed() const { return chain_seed_; }
  RouterTime lease() const { return lease_; }

 private:
  ClusterModel model_;
  RouterTime lease_;
  uint64_t chain_seed_ = 0;
  std::map<WorkerId, Member> members_;
};

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_MEMBERSHIP_H_
