#!/usr/bin/env python3
"""Ends `make test` with what ctest's own summary leaves out: which tests were
skipped and why, and one closing line with the three counts.

    python3 tests/ctest_summary.py JUNIT_XML

JUNIT_XML is what `ctest --output-junit` wrote. A test is skipped when it
cannot run on this machine (no GPU, not root): its program exits with the
test's SKIP_RETURN_CODE and prints a line with "SKIP" saying why, which is
shown here. Prints, last:

    tests: P passed, F failed, S skipped

Exit code 0 (the verdict is ctest's own exit code); 1 if the file is missing
or unreadable.
"""

import re
import sys
import xml.etree.ElementTree as ElementTree

# GoogleTest's GTEST_SKIP() prints "FILE:LINE: Skipped" and then its message;
# dtrain's scripts print "SKIP: reason".
GTEST_SKIP_MESSAGE = re.compile(r": Skipped\n(.+)$", re.MULTILINE)
SKIP_LINE = re.compile(r"\bSKIP: (.+)$", re.MULTILINE)


def skip_reason(testcase):
    output = testcase.findtext("system-out") or ""
    for pattern in (GTEST_SKIP_MESSAGE, SKIP_LINE):
        match = pattern.search(output)
        if match:
            return match.group(1).strip()
    skipped = testcase.find("skipped")
    if skipped is not None and skipped.get("message"):
        return skipped.get("message")
    return "no reason printed"


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        root = ElementTree.parse(sys.argv[1]).getroot()
    except (OSError, ElementTree.ParseError) as error:
        print("ctest_summary: cannot read %s: %s" % (sys.argv[1], error), file=sys.stderr)
        return 1
    passed, failed, skipped = 0, 0, []
    for testcase in root.iter("testcase"):
        status = testcase.get("status", "")
        if testcase.find("failure") is not None or status == "fail":
            failed += 1
        elif testcase.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped.append((testcase.get("name", "?"), skip_reason(testcase)))
        else:
            passed += 1
    for name, reason in skipped:
        print("skipped: %s: %s" % (name, reason))
    print("tests: %d passed, %d failed, %d skipped" % (passed, failed, len(skipped)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
