// Note [filesystem symbols from LibTorch] (src/common/file_tree.h), tested on
// the machine at hand: std::filesystem::remove_all on a small tree, built
// by gpu_check.sh plain, linked against libtorch_cpu.so alone, and linked
// against LibTorch's libraries in dtrain's order ahead of libstdc++, so that
// the calls bind to the wheels' exported copies as dtrain's did. Prints one
// line; exits 0 when the tree is gone (on 2026-12-04's H200 machine the last
// died of SIGSEGV).
#include <filesystem>
#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path dir = argc > 1 ? argv[1] : "filesystem-probe-tree";
  fs::create_directories(dir / "a" / "b");
  std::ofstream(dir / "a" / "b" / "file") << "x";
  std::ofstream(dir / "top") << "y";
  std::error_code error;
  const auto removed = fs::remove_all(dir, error);
  std::cout << "remove_all: " << removed << " entries removed, error '" << error.message() << "', tree left: "
            << (fs::exists(dir) ? "yes" : "no") << std::endl;
  return fs::exists(dir) ? 1 : 0;
}
