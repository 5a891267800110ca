// chunkserve-layering-check ROOT: prints every include that breaks README.md's dependency table
// and exits 1 when there is one, 0 when the tree is clean, 2 on bad usage.
#include <filesystem>
#include <iostream>

#include "tests/layering/layering.h"

int main(int argc, char** argv) {
  if (argc != 2 || !std::filesystem::is_directory(argv[1])) {
    std::cerr << "usage: chunkserve-layering-check REPO_ROOT\n";
    return 2;
  }
  const auto violations = chunkserve::layering::CheckTree(argv[1]);
  for (const auto& v : violations) {
    std::cerr << v.file << ":" << v.line << ": #include " << v.include << ": " << v.reason << "\n";
  }
  std::cout << "layering: " << violations.size() << " violation(s)\n";
  return violations.empty() ? 0 : 1;
}
