// Note [filesystem symbols from LibTorch] (src/common/file_tree.h), tested on
// the machine at hand: std::filesystem::remove_all on a small tree, built
// twice by gpu_check.sh, once plain and once linked against libtorch_cpu.so
// ahead of libstdc++ (as dtrain is), so that the call binds to the wheel's
// exported copy. Prints one line; exits 0 when the tree is gone.
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
