// Layering check: enforces README.md's dependency table on #include lines.
//
// Every source file under the fixed top-level folders is scanned; each #include is classified
// (a project folder such as "runtime/kvcache", or a third-party family such as "cuda" or "capnp")
// and checked against the rule of the folder holding the file. Examples of what fails:
//   router/index.cc   #include "kernels/cpu/tpp_decode.h"     (router never depends on kernels)
//   router/index.cc   #include <cuda_runtime.h>                (router never sees CUDA)
//   kernels/cpu/x.cc  #include "runtime/base/status.h"        (kernels hold no runtime types)
//   runtime/plan/p.cc #include <capnp/message.h>              (capnp only in runtime/wire)
//
// The rules are data (Rules()), so the table in README.md and this code can be compared line by
// line.
#ifndef CHUNKSERVE_TESTS_LAYERING_LAYERING_H_
#define CHUNKSERVE_TESTS_LAYERING_LAYERING_H_

#include <filesystem>
#include <string>
#include <vector>

namespace chunkserve::layering {

struct Rule {
  std::string folder;                      // path prefix the rule applies to, e.g. "router/"
  std::vector<std::string> allowed_project;  // project prefixes it may include, e.g. "runtime/base/"
  std::vector<std::string> forbidden_families;  // third-party families it may not include
};

struct Violation {
  std::string file;  // repo-relative path
  int line = 0;
  std::string include;  // the included path as written
  std::string reason;
};

// The dependency table. The most specific (longest) folder prefix wins.
const std::vector<Rule>& Rules();

// Classifies a third-party include into a family ("cuda", "nccl", "gloo", "capnp", "asio", "glog",
// "blas", "openssl"), or returns "" for the standard library, system headers and project headers.
std::string IncludeFamily(const std::string& include);

// Scans every C, C++ and CUDA source under `root`'s top-level project folders.
std::vector<Violation> CheckTree(const std::filesystem::path& root);

// Checks one file's contents as if it lived at `relative_path`.
std::vector<Violation> CheckFile(const std::string& relative_path, const std::string& contents);

}  // namespace chunkserve::layering

#endif  // CHUNKSERVE_TESTS_LAYERING_LAYERING_H_
