#pragma once
// Removing and listing directory trees with POSIX calls (nftw), not
// std::filesystem. Note [filesystem symbols from LibTorch]:
// the PyPI torch wheels export their own statically linked copy of parts of
// libstdc++'s <filesystem> (std::filesystem::remove_all and the
// (recursive_)directory_iterator members among them; `nm -D --defined-only
// libtorch_cpu.so | c++filt | grep filesystem`), built by an older GCC. A
// program linked against libtorch binds those calls to the wheel's copy,
// which may not match the libstdc++ of the machine's compiler. On the H200
// machine (Ubuntu 24.04's GCC, torch 2.11.0+cu130) every `dtrain train
// --resume` run died of SIGSEGV the first time a checkpoint was pruned, the
// first std::filesystem::remove_all of a non-empty directory in a run. So
// the trees dtrain deletes or walks go through these; scripts/device
// records the wheel's exported filesystem symbols, and
// the build.filesystem_calls test (scripts/check_filesystem_calls.py) keeps
// the calls out.

#include <string>
#include <vector>

namespace dtrain::detail {

// Removes `path` and everything under it without following symbolic links.
// A missing path is nothing to remove (true). On failure returns false and
// says why in *error.
bool remove_tree(const std::string& path, std::string* error = nullptr);

// The regular files under `dir`, at any depth, sorted; symbolic links to
// regular files count, directories behind symbolic links are not entered,
// unreadable directories are skipped. Throws std::runtime_error when `dir`
// itself cannot be read.
std::vector<std::string> regular_files_under(const std::string& dir);

}  // namespace dtrain::detail
