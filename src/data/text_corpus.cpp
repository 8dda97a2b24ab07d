#include "dtrain/data.h"

#include "common/file_tree.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string_view>

namespace dtrain::data {

namespace fs = std::filesystem;

namespace {

const std::string kCorpusHint = std::string("pass a text file or a folder of text files; the default corpus (") +
                                kFortunesDir +
                                ") comes with the Debian package fortunes (apt-get install fortunes, or run scripts/setup)";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("text corpus: cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Why `bytes` is not text, or "" when it is. Text may be in any 8-bit
// encoding, so bytes >= 0x80 count as text; what marks a binary file (such as
// the .dat offset tables of fortune) is NUL bytes or many control characters.
std::string why_not_text(std::string_view bytes) {
  if (bytes.find('\0') != std::string_view::npos) return "it contains NUL bytes";
  const auto control = std::count_if(bytes.begin(), bytes.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    const bool whitespace = b == '\t' || b == '\n' || b == '\v' || b == '\f' || b == '\r';
    // Backspace and escape occur in real text (overstrike, terminal art).
    return (b < 0x20 && !whitespace && b != '\b' && b != 0x1b) || b == 0x7f;
  });
  if (control * 20 > static_cast<std::ptrdiff_t>(bytes.size()))
    return "more than 5% of its bytes are control characters";
  return "";
}

torch::Tensor to_tensor(const std::string& bytes) {
  auto tensor = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(tensor.data_ptr<uint8_t>()));
  return tensor;
}

}  // namespace

TextCorpus read_text_corpus(const std::string& path) {
  std::error_code error;
  const auto status = fs::status(path, error);
  if (!fs::exists(status)) throw std::runtime_error("text corpus " + path + " does not exist: " + kCorpusHint);

  TextCorpus corpus;
  std::string bytes;
  if (!fs::is_directory(status)) {
    bytes = read_file(path);
    if (auto why = why_not_text(bytes); !why.empty())
      throw std::runtime_error("text corpus " + path + " is not a text file: " + why);
    corpus.files.push_back(path);
  } else {
    // Not std::filesystem's iterator: Note [filesystem symbols from LibTorch].
    std::vector<fs::path> paths;
    for (const auto& file : detail::regular_files_under(path)) paths.emplace_back(file);  // links to files count
    // Sorted, so that the corpus (and every dataset index) is the same on every
    // machine whatever order the file system lists the folder in.
    std::sort(paths.begin(), paths.end());
    std::set<fs::path> seen;  // canonical paths: fortune's foo.u8 is a link to foo
    for (const auto& file : paths) {
      if (!seen.insert(fs::canonical(file)).second) continue;
      if (file.extension() == ".dat") {
        corpus.skipped.push_back(file.string());
        continue;
      }
      auto content = read_file(file);
      if (!why_not_text(content).empty()) {
        corpus.skipped.push_back(file.string());
        continue;
      }
      bytes += content;
      corpus.files.push_back(file.string());
    }
    if (corpus.files.empty())
      throw std::runtime_error("text corpus folder " + path + " has no text files (" +
                               std::to_string(corpus.skipped.size()) + " skipped as binary or .dat): " + kCorpusHint);
  }
  if (bytes.empty()) throw std::runtime_error("text corpus " + path + " is empty: " + kCorpusHint);
  corpus.bytes = to_tensor(bytes);
  return corpus;
}

}  // namespace dtrain::data
