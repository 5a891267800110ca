// The repository carries its own documentation: every relative link in a Markdown file must
// resolve to a file or folder inside the repository (and an #anchor into a Markdown file to one
// of its headings), and no document may point outside the repository.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace chunkserve {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::weakly_canonical(CHUNKSERVE_SOURCE_DIR);

// Markdown files of the repository: not build trees, not dot folders, not vendored bindings output.
std::vector<fs::path> MarkdownFiles() {
  std::vector<fs::path> out;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() &&
        (name.starts_with(".") || name.starts_with("build") || name == "target")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".md") out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// GitHub's anchor for a heading: lower case, spaces to '-', other punctuation dropped.
std::string Slug(const std::string& heading) {
  std::string out;
  for (unsigned char c : heading) {
    if (std::isalnum(c) || c == '-' || c == '_') {
      out += static_cast<char>(std::tolower(c));
    } else if (c == ' ') {
      out += '-';
    } else if (c >= 0x80) {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::set<std::string> Anchors(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (line.starts_with("```")) fenced = !fenced;
    if (fenced || !line.starts_with("#")) continue;
    const size_t start = line.find_first_not_of('#');
    if (start == std::string::npos || line[start] != ' ') continue;
    std::string heading = line.substr(start + 1);
    heading.erase(std::remove(heading.begin(), heading.end(), '`'), heading.end());
    out.insert(Slug(heading));
  }
  return out;
}

// Links outside code spans and fenced blocks.
std::vector<std::string> Links(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex kLink(R"(\]\(([^)\s]+)\))");
  std::istringstream in(text);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (line.starts_with("```")) fenced = !fenced;
    if (fenced) continue;
    // Drop inline code spans.
    std::string plain;
    bool code = false;
    for (char c : line) {
      if (c == '`') {
        code = !code;
        continue;
      }
      if (!code) plain += c;
    }
    for (std::sregex_iterator it(plain.begin(), plain.end(), kLink), end; it != end; ++it) {
      out.push_back((*it)[1]);
    }
  }
  return out;
}

TEST(ReadmeLinksTest, EveryRelativeLinkResolvesInsideTheRepository) {
  const std::vector<fs::path> docs = MarkdownFiles();
  ASSERT_GE(docs.size(), 8u) << "found too few Markdown files under " << kRoot;
  int checked = 0;
  for (const fs::path& doc : docs) {
    const std::string text = Read(doc);
    const std::string where = fs::relative(doc, kRoot).string();
    EXPECT_EQ(text.find("../shared/"), std::string::npos)
        << where << " points outside the repository (../shared/)";
    EXPECT_EQ(text.find("DESIGN.md"), std::string::npos)
        << where << " points at a DESIGN.md, which is not in the repository";
    for (const std::string& link : Links(text)) {
      if (link.find("://") != std::string::npos || link.starts_with("mailto:")) continue;
      ++checked;
      const size_t hash = link.find('#');
      const std::string path = link.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : link.substr(hash + 1);
      const fs::path target =
          path.empty() ? doc : fs::weakly_canonical(doc.parent_path() / path);
      const std::string rel = fs::relative(target, kRoot).string();
      EXPECT_FALSE(rel.starts_with("..")) << where << ": " << link << " leaves the repository";
      if (!fs::exists(target)) {
        ADD_FAILURE() << where << ": " << link << " does not exist";
        continue;
      }
      if (!anchor.empty() && target.extension() == ".md") {
        EXPECT_TRUE(Anchors(Read(target)).count(anchor))
            << where << ": " << link << ": no heading with that anchor in " << rel;
      }
    }
  }
  std::printf("checked %d relative links in %zu Markdown files\n", checked, docs.size());
}

TEST(ReadmeLinksTest, SlugsFollowGitHubsRule) {
  EXPECT_EQ(Slug("wire/"), "wire");
  EXPECT_EQ(Slug("On an H100"), "on-an-h100");
  EXPECT_EQ(Slug("The ABI guard (ctest -L capi)"), "the-abi-guard-ctest--l-capi");
}

}  // namespace
}  // namespace chunkserve
