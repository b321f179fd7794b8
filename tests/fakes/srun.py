"""A fake `srun` for launch/slurm.sbatch's tests (tests/fakes/slurm/srun runs it): runs
SLURM_NTASKS copies of its command on this machine as the tasks of one job step, through
jaxspeech.launch_local's process supervision (output prefixed [p<rank>], a failed task
stops the others).

Each task gets SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID and SLURM_STEP_* as SLURM sets
them for a one-node allocation, and $FAKE_SRUN_DEVICES (2) simulated CPU devices. srun's
own options (before the command) are accepted and ignored.
"""

import os
import sys

from jaxspeech import launch_local


def main(argv):
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1
    command = argv[i:]
    tasks = int(os.environ["SLURM_NTASKS"])
    env = launch_local.child_env(os.environ, int(os.environ.get("FAKE_SRUN_DEVICES", "2")))
    env |= {
        "SLURM_STEP_NODELIST": os.environ["SLURM_JOB_NODELIST"],
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_NODEID": "0",
    }
    commands = [["env", f"SLURM_PROCID={r}", f"SLURM_LOCALID={r}", *command] for r in range(tasks)]
    children = launch_local.start_children(commands, env)
    procs = [p for p, _ in children]
    order = launch_local.supervise(procs, grace_s=30.0, pending_signals=[])
    for _, pair in children:
        for thread in pair:
            thread.join(timeout=5)
    return launch_local.launcher_exit_code([procs[r].returncode for r in order])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
