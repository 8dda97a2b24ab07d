#pragma once
// Removing and listing directory trees with POSIX calls (nftw), not
// std::filesystem. Note [filesystem symbols from LibTorch]:
// the PyPI torch wheels export their own statically linked copies of parts
// of libstdc++'s <filesystem>: libtorch_cpu.so 142 symbols
// (std::filesystem::remove_all among them), and in torch 2.11 libtorch.so 64
// (`nm -D --defined-only LIB | c++filt | grep filesystem`), built by an older
// GCC. A program linked against LibTorch binds its own <filesystem> calls,
// and those the copies make, to whichever library the loader finds first, so
// one call can run in a mix of copies. On the H200 machine (torch
// 2.11.0+cu130, Ubuntu 24.04's GCC 13) every `dtrain train --resume` run died
// of SIGSEGV at the first prune of an old checkpoint, the first
// std::filesystem::remove_all of a non-empty folder in a run; a 20-line
// remove_all linked against libtorch.so, libtorch_cpu.so, libtorch_cuda.so,
// libc10_cuda.so and libc10.so in dtrain's order died the same way (linked
// against libtorch_cpu.so alone it did not; scripts/device/filesystem_probe.cpp,
// run by gpu_check.sh). Here (Debian 12's GCC 12, torch 2.15, whose
// libtorch.so exports none) it does not crash, so no CPU test can show it. The trees dtrain deletes or walks go
// through these, and the build.filesystem_calls test
// (scripts/check_filesystem_calls.py) keeps the calls out of src/ and apps/.

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
