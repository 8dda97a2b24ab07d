#!/usr/bin/env python3
"""Keeps the committed fuzz corpus small (`make fuzz`).

    trim_fuzz_corpus.py CONTROL_FILE CORPUS_DIR MAX_FILES

CONTROL_FILE is libFuzzer's merge control file (-merge=1
-merge_control_file=...) over CORPUS_DIR and the fuzzer's working corpus: it
lists every input and the coverage features each one reaches. The hand-made
seeds in CORPUS_DIR (names that are not 40-hex-digit hashes) always stay; the
inputs the fuzzer found are chosen greedily, the one adding the most features
not yet covered first, until MAX_FILES files or until none adds any. Found
inputs no longer chosen are removed from CORPUS_DIR; chosen ones are copied in
under the SHA-1 of their bytes, as libFuzzer names them.
"""

import hashlib
import os
import re
import shutil
import sys

HASH_NAME = re.compile(r"^[0-9a-f]{40}$")


def read_control(path):
    with open(path) as control:
        lines = control.read().splitlines()
    count = int(lines[0])
    files = lines[2:2 + count]
    features = {index: set() for index in range(count)}
    for line in lines[2 + count:]:
        if line.startswith("FT "):
            parts = line.split()
            features[int(parts[1])] = set(int(f) for f in parts[2:])
    return files, features


def main():
    control, corpus, max_files = sys.argv[1], os.path.realpath(sys.argv[2]), int(sys.argv[3])
    files, features = read_control(control)
    is_seed = [os.path.dirname(os.path.realpath(f)) == corpus and not HASH_NAME.match(os.path.basename(f))
               for f in files]
    covered = set()
    for index, seed in enumerate(is_seed):
        if seed:
            covered |= features[index]
    seeds = sum(is_seed)
    chosen = {}
    candidates = [i for i, seed in enumerate(is_seed) if not seed]
    while seeds + len(chosen) < max_files and candidates:
        best = max(candidates, key=lambda i: (len(features[i] - covered), -os.path.getsize(files[i])))
        if not features[best] - covered:
            break
        covered |= features[best]
        with open(files[best], "rb") as found:
            data = found.read()
        chosen[hashlib.sha1(data).hexdigest()] = files[best]
        candidates.remove(best)
    for name in os.listdir(corpus):
        if HASH_NAME.match(name) and name not in chosen:
            os.remove(os.path.join(corpus, name))
    for name, source in chosen.items():
        target = os.path.join(corpus, name)
        if os.path.realpath(source) != target:
            shutil.copyfile(source, target)
    everything = set().union(*features.values()) if features else set()
    print("trim_fuzz_corpus: %s: %d seeds + %d found inputs cover %d of the %d features all %d inputs reach"
          % (sys.argv[2], seeds, len(chosen), len(covered), len(everything), len(files)))


if __name__ == "__main__":
    main()
