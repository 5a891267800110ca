// chunkserve-bench tokenizer: Encode throughput on the tokenizer test corpus.
//
// The corpus (tests/tokenizer/corpus.jsonl, multilingual text, code, emoji, whitespace runs) is
// repeated until it holds --mb megabytes; each line is one Encode call (no special tokens), on
// one thread. Tokenizers: the two committed test tokenizer.json files and, when the model cache
// has it, SmolLM2-135M-Instruct from its GGUF metadata. Reported per tokenizer: MB/s of input and
// tokens/s, the best of --reps repetitions. tests/tokenizer/bench_tokenizers.py measures HF
// tokenizers on the same text for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model/gguf.h"
#include "runtime/tokenizer/gguf_vocab.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/bench/bench.h"

namespace chunkserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  bool json = false;
  double mb = 10;
  int reps = 3;
};

std::vector<std::string> CorpusLines(const std::filesystem::path& source_dir) {
  std::ifstream in(source_dir / "tests" / "tokenizer" / "corpus.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  }
  return lines;
}

std::optional<tokenizer::Tokenizer> SmolLM2() {
  const char* env = std::getenv("CHUNKSERVE_MODEL_CACHE");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir =
      env != nullptr && *env != '\0'
          ? std::filesystem::path(env)
          : std::filesystem::path(home != nullptr ? home : "") / ".cache" / "chunkserve" / "models";
  auto gguf = model::GgufFile::Open(dir / "SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!gguf.ok()) return std::nullopt;
  auto spec = tokenizer::VocabSpecFromGguf(**gguf);
  if (!spec.ok()) return std::nullopt;
  auto t = tokenizer::Tokenizer::FromVocab(*spec);
  if (!t.ok()) return std::nullopt;
  return std::move(t).value();
}

int TokenizerMain(int argc, char** argv) {
  Config cfg;
  std::filesystem::path source_dir = ".";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      cfg.json = true;
    } else if (arg == "--mb" && i + 1 < argc) {
      cfg.mb = std::atof(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      cfg.reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--source-dir" && i + 1 < argc) {
      source_dir = argv[++i];
    } else {
      std::cout << "usage: chunkserve-bench tokenizer [--json] [--mb N] [--reps N] "
                   "[--source-dir DIR (repository root, default .)]\n";
      return arg == "--help" ? 0 : 2;
    }
  }
  const std::vector<std::string> corpus = CorpusLines(source_dir);
  if (corpus.empty()) {
    std::cerr << "tokenizer bench: no corpus under " << source_dir << " (use --source-dir)\n";
    return 2;
  }
  std::vector<std::string_view> lines;
  size_t bytes = 0;
  while (bytes < cfg.mb * 1e6) {
    for (const std::string& l : corpus) {
      lines.push_back(l);
      bytes += l.size();
    }
  }

  std::vector<std::pair<std::string, tokenizer::Tokenizer>> tokenizers;
  for (const char* name : {"bytelevel_bpe", "sentencepiece_bpe"}) {
    auto t = tokenizer::Tokenizer::FromJsonFile(source_dir / "tests" / "tokenizer" / "data" /
                                                (std::string(name) + ".tokenizer.json"));
    if (!t.ok()) {
      std::cerr << "tokenizer bench: " << t.status() << "\n";
      return 1;
    }
    tokenizers.emplace_back(name, std::move(t).value());
  }
  if (auto smol = SmolLM2()) tokenizers.emplace_back("smollm2_gguf", std::move(*smol));

  if (!cfg.json) {
    std::printf("tokenizer: %.1f MB in %zu Encode calls, 1 thread, best of %d\n", bytes / 1e6,
                lines.size(), cfg.reps);
    std::printf("%-20s %10s %14s %12s\n", "tokenizer", "MB/s", "tokens/s", "tokens");
  }
  for (const auto& [name, t] : tokenizers) {
    double best = 1e300;
    size_t tokens = 0;
    for (int r = 0; r < cfg.reps; ++r) {
      tokens = 0;
      const auto start = Clock::now();
      for (const std::string_view line : lines) {
        auto ids = t.Encode(line, /*add_special_tokens=*/false);
        if (!ids.ok()) {
          std::cerr << "tokenizer bench: " << ids.status() << "\n";
          return 1;
        }
        tokens += ids->size();
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double mb_s = bytes / 1e6 / best, tok_s = tokens / best;
    if (cfg.json) {
      nlohmann::json j = {{"bench", "tokenizer"}, {"tokenizer", name}, {"bytes", bytes},
                          {"tokens", tokens},     {"threads", 1},      {"mb_per_s", mb_s},
                          {"tokens_per_s", tok_s}};
      std::cout << j.dump() << "\n";
    } else {
      std::printf("%-20s %10.2f %14.0f %12zu\n", name.c_str(), mb_s, tok_s, tokens);
    }
  }
  return 0;
}

}  // namespace

CHUNKSERVE_REGISTER_BENCH(tokenizer, "tokenizer Encode MB/s and tokens/s on the test corpus",
                          TokenizerMain);

}  // namespace chunkserve::bench
