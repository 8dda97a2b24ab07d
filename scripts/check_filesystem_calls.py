#!/usr/bin/env python3
"""Fails if the library or the CLI calls std::filesystem's tree walkers directly.

check_filesystem_calls.py [REPO]

std::filesystem::remove_all and (recursive_)directory_iterator's tree walk
bind, in a program linked against the PyPI torch wheel, to the wheel's own
exported copy of libstdc++'s <filesystem>; on the H200 machine that copy
crashed every resumed run when it pruned a checkpoint. The library removes
and lists trees through src/common/file_tree.h instead (Note [filesystem
symbols from LibTorch]).
"""
import pathlib
import re
import sys

FORBIDDEN = re.compile(r"\b(remove_all|recursive_directory_iterator)\s*\(")

repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
problems = []
for path in sorted([*(repo / "src").rglob("*.[ch]*"), *(repo / "apps").rglob("*.[ch]*")]):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        code = line.split("//", 1)[0]
        if FORBIDDEN.search(code):
            problems.append(f"{path.relative_to(repo)}:{number}: {line.strip()}")
if problems:
    print("check_filesystem_calls: use dtrain::detail::remove_tree / regular_files_under "
          "(src/common/file_tree.h; Note [filesystem symbols from LibTorch]) instead of:", file=sys.stderr)
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print("check_filesystem_calls: no std::filesystem tree walks in src/ or apps/")
