#!/usr/bin/env bash
# Compiles (-fsyntax-only, one at a time) dtrain translation units against
# another LibTorch's headers, with the flags CMake recorded for this build.
#
#   scripts/device/check_torch_headers.sh BUILD_DIR TORCH_INCLUDE FILE...
#
# BUILD_DIR has compile_commands.json (any configured dtrain build);
# TORCH_INCLUDE is the other wheel's torch/include (e.g. unzip a wheel's
# 'torch/include/*'). Prints one line per file and exits non-zero if any fails.
set -uo pipefail
build=$1 new_include=$2
shift 2
failed=0
for file in "$@"; do
  path=$(readlink -f "$file")
  command=$(python3 - "$build/compile_commands.json" "$path" "$new_include" <<'EOF'
import json, re, shlex, sys
db, path, new = sys.argv[1:]
for entry in json.load(open(db)):
    if entry["file"] == path:
        args = shlex.split(entry["command"])
        break
else:
    sys.exit(f"{path} is not in {db}")
out, skip = [], False
for a in args:
    if skip:
        skip = False
        continue
    if a in ("-o", "-c"):
        skip = True
        continue
    out.append(a)
# Swap the torch include directories (plain and csrc/api) for the other wheel's.
old = None
for i, a in enumerate(out):
    if a.endswith("/torch/include") and i > 0 and out[i - 1] == "-isystem":
        old = a
if old is None:
    sys.exit("no torch include directory in the command")
out = [a.replace(old, new) if a.startswith(old) else a for a in out]
print(shlex.join(out + ["-fsyntax-only", path]))
EOF
) || { failed=1; continue; }
  start=$SECONDS
  if log=$(cd "$build" && eval "$command" 2>&1); then
    echo "ok    $file ($((SECONDS - start))s)"
  else
    echo "FAIL  $file ($((SECONDS - start))s)"
    echo "$log" | grep -E "error|note: candidate" | head -n 20
    failed=1
  fi
done
exit $failed
