#include "router/membership.h"

#include <cstdlib>
#include <sstream>
#include <utility>

#include "runtime/kvcache/chunk_hash.h"

namespace chunkserve::router {
namespace {

std::string Hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size()) {
    return Status::InvalidArgument("address must be host:port: '" + address + "'");
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  char* end = nullptr;
  const long p = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) {
    return Status::InvalidArgument("bad port in address '" + address + "'");
  }
  *host = h;
  *port = static_cast<uint16_t>(p);
  return Status::Ok();
}

Membership::Membership(ClusterModel model, RouterTime lease) : model_(model), lease_(lease) {
  if (model_.chunk_hash_version == 0) model_.chunk_hash_version = kv::kHashVersion;
  if (model_known()) {
    chain_seed_ =
        kv::ChunkHashSeed(model_.model_fingerprint, model_.chunk_size, model_.chunk_hash_version);
  }
}

WorkerId Membership::IdFor(const std::string& name) {
  uint32_t h = 2166136261u;
  for (unsigned char c : name) {
    h ^= c;
    h *= 16777619u;
  }
  if (h == WorkerId::Invalid().value()) h = 0;
  return WorkerId(h);
}

Status Membership::Validate(const Registration& r) {
  if (r.name.empty()) return Status::InvalidArgument("empty worker id");
  if (r.chunk_size < 1) return Status::InvalidArgument("chunk size must be >= 1");
  if (r.port == 0 || r.host.empty()) return Status::InvalidArgument("no worker address");
  if (r.chunk_hash_version != model_.chunk_hash_version) {
    return Status::FailedPrecondition("chunk hash version " + std::to_string(r.chunk_hash_version) +
                                      " differs from the router's " +
                                      std::to_string(model_.chunk_hash_version));
  }
  if (model_.model_fingerprint != 0 && r.model_fingerprint != model_.model_fingerprint) {
    return Status::FailedPrecondition("model fingerprint " + Hex(r.model_fingerprint) +
                                      " differs from the cluster's " +
                                      Hex(model_.model_fingerprint));
  }
  if (model_.chunk_size != 0 && r.chunk_size != model_.chunk_size) {
    return Status::FailedPrecondition("chunk size " + std::to_string(r.chunk_size) +
                                      " differs from the cluster's " +
                                      std::to_string(model_.chunk_size));
  }
  auto it = members_.find(IdFor(r.name));
  if (it != members_.end() && it->second.registration.name != r.name) {
    return Status::FailedPrecondition("worker id '" + r.name + "' hashes like member '" +
                                      it->second.registration.name + "'; choose another id");
  }
  if (!model_known()) {
    model_.model_fingerprint = r.model_fingerprint;
    model_.chunk_size = r.chunk_size;
    chain_seed_ =
        kv::ChunkHashSeed(model_.model_fingerprint, model_.chunk_size, model_.chunk_hash_version);
  }
  return Status::Ok();
}

WorkerId Membership::Admit(const Registration& r, uint64_t control_link, RouterTime now) {
  const WorkerId id = IdFor(r.name);
  Member member;
  member.id = id;
  member.registration = r;
  member.control_link = control_link;
  member.lease_expiry = now + lease_;
  members_[id] = std::move(member);
  return id;
}

Status Membership::Renew(WorkerId id, RouterTime now) {
  auto it = members_.find(id);
  if (it == members_.end()) return Status::NotFound("not a member");
  it->second.lease_expiry = now + lease_;
  return Status::Ok();
}

std::vector<WorkerId> Membership::Expired(RouterTime now) const {
  std::vector<WorkerId> out;
  for (const auto& [id, m] : members_) {
    if (m.lease_expiry < now) out.push_back(id);
  }
  return out;
}

void Membership::Remove(WorkerId id) { members_.erase(id); }

Member* Membership::Find(WorkerId id) {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

Member* Membership::FindByLink(uint64_t control_link) {
  for (auto& [id, m] : members_) {
    if (m.control_link == control_link) return &m;
  }
  return nullptr;
}

}  // namespace chunkserve::router
