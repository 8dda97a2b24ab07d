// Note [filesystem symbols from LibTorch] (file_tree.h).
#include "common/file_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace dtrain::detail {
namespace {

// nftw takes a plain function: the walk's state lives here, one walk per thread.
thread_local std::string* removal_error = nullptr;
thread_local std::vector<std::string>* listed = nullptr;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) == 0 || errno == ENOENT) return 0;
  if (removal_error) *removal_error = std::string("cannot remove ") + path + ": " + std::strerror(errno);
  return 1;
}

int list_entry(const char* path, const struct stat* status, int kind, struct FTW*) {
  struct stat target {};
  if (kind == FTW_F && S_ISREG(status->st_mode)) {
    listed->emplace_back(path);
  } else if (kind == FTW_SL && ::stat(path, &target) == 0 && S_ISREG(target.st_mode)) {
    listed->emplace_back(path);  // a link to a file (fortune's foo.u8 -> foo); to a directory: not entered
  }
  return 0;  // FTW_DNR (unreadable directory) and anything else: skipped
}

}  // namespace

bool remove_tree(const std::string& path, std::string* error) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) {
    if (errno == ENOENT) return true;
    if (error) *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::string why;
  removal_error = &why;
  const int walked = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  removal_error = nullptr;
  if (walked == 0) return true;
  if (error) *error = why.empty() ? "cannot remove " + path + ": " + std::strerror(errno) : why;
  return false;
}

std::vector<std::string> regular_files_under(const std::string& dir) {
  std::vector<std::string> files;
  // A symbolic link given as the folder is followed (its target is walked);
  // links inside it are not entered.
  std::string root = dir;
  struct stat status {};
  if (::lstat(dir.c_str(), &status) == 0 && S_ISLNK(status.st_mode)) {
    if (char* resolved = ::realpath(dir.c_str(), nullptr)) {
      root = resolved;
      std::free(resolved);
    }
  }
  listed = &files;
  const int walked = ::nftw(root.c_str(), list_entry, 16, FTW_PHYS);
  listed = nullptr;
  if (walked != 0) throw std::runtime_error("cannot list " + dir + ": " + std::strerror(errno));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace dtrain::detail
