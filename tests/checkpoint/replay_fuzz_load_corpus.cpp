// Replays the load-path fuzzer's corpus (fuzz_load.cpp) through the target
// built without libFuzzer, so that `make test` runs every committed input:
// the target's promises are checked with std::abort (failing the test), an
// input named good-* must load and one named bad-* must be refused; inputs
// the fuzzer found (named by their hash) may do either.
//   replay_fuzz_load_corpus MIN_INPUTS DIR...
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" const char* dtrain_fuzz_load_last_error();

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " MIN_INPUTS CORPUS_DIR...\n";
    return 2;
  }
  LLVMFuzzerInitialize(&argc, &argv);
  long replayed = 0, wrong = 0;
  for (int i = 2; i < argc; ++i) {
    for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
      const std::string name = entry.path().filename().string(), error = dtrain_fuzz_load_last_error();
      const bool good = name.rfind("good-", 0) == 0, bad = name.rfind("bad-", 0) == 0;
      if (!good && !bad) continue;
      std::cout << name << ": " << (error.empty() ? "loaded" : "refused: " + error) << "\n";
      if (good != error.empty()) {
        std::cerr << "  WRONG: " << name << (good ? " must load" : " must be refused") << "\n";
        ++wrong;
      }
    }
  }
  std::cout << "replayed " << replayed << " inputs, " << wrong << " with the wrong outcome\n";
  if (replayed < std::atol(argv[1])) {
    std::cerr << "expected at least " << argv[1] << " inputs: is the corpus directory right?\n";
    return 1;
  }
  return wrong == 0 ? 0 : 1;
}
