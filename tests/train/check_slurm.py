#!/usr/bin/env python3
"""A fake srun (src/comm/slurm.h): `dtrain train` started as the tasks of a
Slurm step, with only SLURM_* variables (no RANK, WORLD_SIZE, MASTER_*,
no PMI), must find its world by itself over c10d and train exactly as
`dtrain train --nproc 2 --backend c10d` does: every step's loss bitwise.

    check_slurm.py DTRAIN -- TRAIN_ARGS...

SLURM_NODELIST is "localhost,node[02-03]" (rank 0's host first, as srun's
block distribution puts it); SLURM_JOB_ID is chosen so that the derived
MASTER_PORT (15000 + job id mod 15000) is free now.
"""

import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import TIMEOUT_S, fail, read_metrics, run, say  # noqa: E402

RANKS = 2
# What a launcher may have left behind; a real srun task has none of them.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DTRAIN_RESTART_COUNT",
                      "TORCHELASTIC_RESTART_COUNT", "PMI_RANK", "PMIX_RANK")


def free_job_id():
    """A job id whose derived port is free; ids above 15000 show that only the remainder counts."""
    for offset in range(os.getpid() % 15000, os.getpid() % 15000 + 15000):
        port = 15000 + offset % 15000
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 3 * 15000 + offset % 15000, port
    fail("no free port from 15000 to 29999")


def srun_environment(rank, job_id):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARIABLES and not k.startswith(("OMPI_", "SLURM_"))}
    env.update(SLURM_JOB_ID=str(job_id), SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS=str(RANKS),
               SLURM_LOCALID=str(rank), SLURM_NODELIST="localhost,node[02-03]")
    return env


def main():
    split = sys.argv.index("--")
    dtrain, args = sys.argv[1], sys.argv[split + 1:] + ["--log-every", "1"]
    folder = tempfile.mkdtemp(prefix="dtrain-slurm-")
    reference = os.path.join(folder, "reference.jsonl")
    run([dtrain, "train", "--nproc", str(RANKS), "--backend", "c10d"] + args + ["--metrics", reference])

    metrics = os.path.join(folder, "slurm.jsonl")
    job_id, port = free_job_id()
    say("fake srun: %d tasks, SLURM_JOB_ID=%d (MASTER_PORT %d), SLURM_NODELIST=localhost,node[02-03]"
        % (RANKS, job_id, port))
    tasks = [subprocess.Popen([dtrain, "train"] + args + ["--metrics", metrics], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=srun_environment(rank, job_id))
             for rank in range(RANKS)]
    for rank, task in enumerate(tasks):
        try:
            output, _ = task.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for t in tasks:
                t.kill()
            fail("task %d still running after %d s" % (rank, TIMEOUT_S))
        print(output.decode("utf-8", errors="replace").rstrip("\n"), flush=True)
        if task.returncode != 0:
            fail("task %d exited with %d" % (rank, task.returncode))

    ref, got = read_metrics(reference), read_metrics(metrics)
    if [r.get("loss") for r in got] != [r.get("loss") for r in ref]:
        fail("the Slurm tasks' losses %s != dtrain train --nproc %d's %s"
             % ([r.get("loss") for r in got], RANKS, [r.get("loss") for r in ref]))
    final = got[-1]
    if not final.get("final") or final.get("world_size") != RANKS:
        fail("the last record %s is not the final line of a %d-rank run" % (final, RANKS))
    say("%d Slurm tasks trained as dtrain train --nproc %d: %d records, final loss %r bitwise equal"
        % (RANKS, RANKS, len(got), final["loss"]))


if __name__ == "__main__":
    main()
