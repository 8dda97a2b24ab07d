"""What the `dtrain train` test scripts share: running a bounded command with its
output printed, failing with the script's name, and reading a metrics file."""
import json
import os
import shlex
import subprocess
import sys

# Long runs (make check-long) raise it with DTRAIN_TEST_RUN_TIMEOUT_S.
TIMEOUT_S = int(os.environ.get("DTRAIN_TEST_RUN_TIMEOUT_S", "240"))
SCRIPT = os.path.splitext(os.path.basename(sys.argv[0]))[0]


def fail(message):
    print("%s: FAIL: %s" % (SCRIPT, message), flush=True)
    sys.exit(1)


def say(message):
    print("%s: %s" % (SCRIPT, message), flush=True)


def run(command, expect_code=0, env=None):
    """Runs `command` (at most TIMEOUT_S) with `env` added to the environment, prints its
    output, fails unless it exits `expect_code` (None: any); returns (exit code, output)."""
    say("running: " + "".join("%s=%s " % item for item in (env or {}).items()) +
        " ".join(shlex.quote(a) for a in command))
    try:
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=TIMEOUT_S, env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        fail("still running after %d s" % TIMEOUT_S)
    output = result.stdout.decode("utf-8", errors="replace")
    print(output.rstrip("\n"), flush=True)
    if expect_code is not None and result.returncode != expect_code:
        fail("%s exited with code %d, expected %d" % (os.path.basename(command[0]), result.returncode, expect_code))
    return result.returncode, output


def read_metrics(path):
    """The records of a JSON Lines metrics file; fails naming a line that is not JSON, or an empty file."""
    records = []
    with open(path) as metrics:
        for number, line in enumerate(metrics, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                fail("%s line %d is not JSON: %s" % (path, number, error))
    if not records:
        fail(path + " is empty")
    return records
