#!/usr/bin/env python3
"""Runs a command that is expected to fail, promptly and with a given message.

    python3 tests/expect_failure.py --within SECONDS [--exit-code N | --success] [--expect REGEX]... \
        [--reject REGEX]... -- COMMAND [ARGS]...

Passes (exit 0) only if COMMAND exits non-zero (with code N, if given) within
SECONDS and its combined stdout+stderr matches every --expect REGEX
(re.search, multiline) and no --reject REGEX. With --success the command must
exit 0 instead: a test that checks what a command prints passes only when the
command also succeeded (ctest's PASS_REGULAR_EXPRESSION ignores the exit code). The command runs in its own
process group, which is killed if it is still running SECONDS + 10 s after the
start. What the command printed is echoed, and on failure the reasons are
listed.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import time

KILL_GRACE_S = 10


def kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--within", type=float, required=True, help="seconds the command may take to fail")
    parser.add_argument("--exit-code", type=int, metavar="N", help="the exit code the command must return")
    parser.add_argument("--success", action="store_true",
                        help="the command must exit 0 (and its output match) instead of failing")
    parser.add_argument("--expect", action="append", default=[], metavar="REGEX",
                        help="must match the combined output (repeatable)")
    parser.add_argument("--reject", action="append", default=[], metavar="REGEX",
                        help="must not match the combined output (repeatable)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS]...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.success and args.exit_code is not None:
        parser.error("--success and --exit-code exclude each other")
    if args.within <= 0:
        parser.error("--within must be positive")
    try:
        expects = [re.compile(pattern, re.MULTILINE) for pattern in args.expect]
        rejects = [re.compile(pattern, re.MULTILINE) for pattern in args.reject]
    except re.error as error:
        parser.error("bad regular expression: %s" % error)

    start = time.monotonic()
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as error:
        print("expect_failure: FAIL: cannot start %r: %s" % (command, error))
        return 1
    killed = False
    try:
        output, _ = process.communicate(timeout=args.within + KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        killed = True
        kill_group(process)
        output, _ = process.communicate()
    except BaseException:
        kill_group(process)
        raise
    elapsed = time.monotonic() - start
    # Leave no stray processes behind (ranks the launcher did not reap).
    kill_group(process)
    text = output.decode("utf-8", errors="replace")

    problems = []
    if killed:
        problems.append("still running after %.0f s: killed its process group" % (args.within + KILL_GRACE_S))
    elif args.success:
        if process.returncode != 0:
            problems.append("exited with code %d, expected 0" % process.returncode)
    elif process.returncode == 0:
        problems.append("exited with code 0, expected a failure")
    elif args.exit_code is not None and process.returncode != args.exit_code:
        problems.append("exited with code %d, expected %d" % (process.returncode, args.exit_code))
    if elapsed > args.within:
        problems.append("took %.1f s, more than the allowed %.1f s" % (elapsed, args.within))
    for pattern in expects:
        if not pattern.search(text):
            problems.append("output does not match /%s/" % pattern.pattern)
    for pattern in rejects:
        match = pattern.search(text)
        if match:
            problems.append("output matches rejected /%s/: %r" % (pattern.pattern, match.group(0)))

    status = "killed" if killed else "exit code %d" % process.returncode
    print("expect_failure: command: %s" % " ".join(command))
    print("expect_failure: %s after %.1f s (allowed %.1f s)" % (status, elapsed, args.within))
    print("expect_failure: ---- output ----")
    print(text.rstrip("\n"))
    print("expect_failure: ---- end of output ----")
    if problems:
        for problem in problems:
            print("expect_failure: FAIL: " + problem)
        return 1
    print("expect_failure: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
