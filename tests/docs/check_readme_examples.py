#!/usr/bin/env python3
"""Every README code block marked <!-- example: PATH --> equals the file PATH,
so the example the README shows is the one make test compiles and runs."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
blocks = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", readme, flags=re.S)
if not blocks:
    sys.exit("README.md: no <!-- example: PATH --> blocks found")
failed = False
for path, shown in blocks:
    actual = (root / path).read_text()
    if shown != actual:
        print(f"README.md shows an outdated copy of {path}; paste the file into the README again")
        failed = True
    else:
        print(f"README.md shows {path} as it is")
sys.exit(1 if failed else 0)
