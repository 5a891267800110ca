#include "tests/layering/layering.h"

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

namespace chunkserve::layering {
namespace {

namespace fs = std::filesystem;

const char* const kTopLevelFolders[] = {"capi", "runtime", "router", "worker",
                                        "kernels", "bindings", "examples", "tests"};
const char* const kProjectPrefixes[] = {"capi/", "runtime/", "router/", "worker/",
                                        "kernels/", "bindings/", "examples/", "tests/"};

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsSourceFile(const fs::path& p) {
  static const char* const kExt[] = {".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh"};
  const std::string ext = p.extension().string();
  return std::any_of(std::begin(kExt), std::end(kExt), [&](const char* e) { return ext == e; });
}

bool IsProjectInclude(const std::string& include) {
  return std::any_of(std::begin(kProjectPrefixes), std::end(kProjectPrefixes),
                     [&](const char* p) { return StartsWith(include, p); });
}

const Rule* RuleFor(const std::string& file) {
  const Rule* best = nullptr;
  for (const Rule& r : Rules()) {
    if (StartsWith(file, r.folder) && (best == nullptr || r.folder.size() > best->folder.size())) {
      best = &r;
    }
  }
  return best;
}

}  // namespace

const std::vector<Rule>& Rules() {
  // Third-party families every folder outside kernels/ may not use unless listed as allowed.
  static const std::vector<Rule> rules = {
      // Compute only: plain params structs, no runtime types, no logging, no networking.
      {"kernels/", {"kernels/"}, {"glog", "capnp", "asio", "gloo", "nccl", "openssl"}},
      // Runtime: kernels' host headers and itself. CUDA only in the CUDA backend; Cap'n Proto,
      // Asio and OpenSSL only in the wire layer; collectives only in parallel/.
      {"runtime/", {"kernels/", "runtime/"}, {"cuda", "capnp", "asio", "gloo", "nccl", "openssl"}},
      {"runtime/backend/", {"kernels/", "runtime/"}, {"capnp", "asio", "gloo", "nccl", "openssl"}},
      {"runtime/wire/", {"kernels/", "runtime/"}, {"cuda", "gloo", "nccl"}},
      // HTTP (Boost.Beast on the wire layer's Asio) and the OpenAI API on top of it.
      {"runtime/http/", {"runtime/"}, {"cuda", "capnp", "gloo", "nccl", "openssl"}},
      {"runtime/openai/", {"runtime/"}, {"cuda", "capnp", "gloo", "nccl", "openssl"}},
      // Tensor parallelism: the communicators are the one place for Gloo and NCCL.
      {"runtime/parallel/", {"kernels/", "runtime/"}, {"capnp", "asio", "openssl"}},
      // Router: never CUDA, never kernels; only the runtime pieces that describe prefixes,
      // workloads
      // and the wire.
      {"router/",
       {"router/", "runtime/base/", "runtime/kvcache/", "runtime/workload/", "runtime/wire/",
        "runtime/http/", "runtime/openai/", "runtime/tokenizer/"},
       {"cuda", "nccl", "gloo", "blas", "openssl"}},
      {"worker/", {"worker/", "runtime/"}, {"openssl"}},
      {"capi/", {"capi/", "runtime/", "router/"}, {"cuda", "nccl", "gloo", "openssl"}},
      // Bindings and examples see the C header only.
      {"bindings/", {}, {"cuda", "nccl", "gloo", "capnp", "asio", "glog", "blas", "openssl"}},
      {"examples/", {}, {"cuda", "nccl", "gloo", "capnp", "asio", "glog", "blas", "openssl"}},
      {"tests/", {"capi/", "runtime/", "router/", "worker/", "kernels/", "tests/"}, {}},
  };
  return rules;
}

std::string IncludeFamily(const std::string& inc) {
  if (IsProjectInclude(inc)) return "";
  if (StartsWith(inc, "cuda") || StartsWith(inc, "cublas") || StartsWith(inc, "cub/") ||
      StartsWith(inc, "thrust/") || StartsWith(inc, "curand") || StartsWith(inc, "cute/") ||
      StartsWith(inc, "cutlass/") || inc == "mma.h" || StartsWith(inc, "device_launch_parameters")) {
    return "cuda";
  }
  if (StartsWith(inc, "nccl")) return "nccl";
  if (StartsWith(inc, "gloo/")) return "gloo";
  if (StartsWith(inc, "capnp/") || StartsWith(inc, "kj/")) return "capnp";
  if (inc == "asio.hpp" || StartsWith(inc, "asio/") || StartsWith(inc, "boost/asio") ||
      StartsWith(inc, "boost/beast") || StartsWith(inc, "boost/system")) {
    return "asio";
  }
  if (StartsWith(inc, "glog/")) return "glog";
  if (StartsWith(inc, "openssl/")) return "openssl";
  if (inc == "cblas.h" || StartsWith(inc, "openblas")) return "blas";
  return "";
}

std::vector<Violation> CheckFile(const std::string& relative_path, const std::string& contents) {
  std::vector<Violation> out;
  const Rule* rule = RuleFor(relative_path);
  if (rule == nullptr) return out;
  static const std::regex kInclude(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::istringstream in(contents);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::smatch m;
    if (!std::regex_search(line, m, kInclude)) continue;
    const std::string inc = m[2].str();
    if (IsProjectInclude(inc)) {
      const bool ok = std::any_of(rule->allowed_project.begin(), rule->allowed_project.end(),
                                  [&](const std::string& p) { return StartsWith(inc, p); });
      if (!ok) {
        out.push_back({relative_path, line_no, inc, rule->folder + " may not include " + inc});
      } else if (!StartsWith(relative_path, "kernels/") && !StartsWith(relative_path, "tests/") &&
                 EndsWith(inc, ".cuh")) {
        out.push_back({relative_path, line_no, inc,
                       "device headers (.cuh) are for kernels/ only; include the host header"});
      }
      continue;
    }
    const std::string family = IncludeFamily(inc);
    if (family.empty()) continue;
    if (std::find(rule->forbidden_families.begin(), rule->forbidden_families.end(), family) !=
        rule->forbidden_families.end()) {
      out.push_back(
          {relative_path, line_no, inc, rule->folder + " may not use " + family + " headers"});
    }
  }
  return out;
}

std::vector<Violation> CheckTree(const fs::path& root) {
  std::vector<Violation> out;
  for (const char* top : kTopLevelFolders) {
    const fs::path dir = root / top;
    if (!fs::is_directory(dir)) continue;
    for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
         ++it) {
      // Rust's and Go's build outputs may sit inside bindings/; they are not our sources.
      if (it->is_directory() && (it->path().filename() == "target" ||
                                 it->path().filename().string().starts_with("."))) {
        it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file() || !IsSourceFile(it->path())) continue;
      std::ifstream f(it->path(), std::ios::binary);
      std::stringstream buf;
      buf << f.rdbuf();
      const std::string rel = fs::relative(it->path(), root).generic_string();
      std::vector<Violation> v = CheckFile(rel, buf.str());
      out.insert(out.end(), v.begin(), v.end());
    }
  }
  std::sort(out.begin(), out.end(), [](const Violation& a, const Violation& b) {
    return std::tie(a.file, a.line) < std::tie(b.file, b.line);
  });
  return out;
}

}  // namespace chunkserve::layering
