"""A stand-in for `python -m jaxspeech.train` on a fake TPU slice or SLURM job
(tests/test_launch_tpu.py, tests/test_launch_cluster.py).

    python -m tests.fakes.fake_train --workdir RUN --scenario preempt|maintenance|user_error

Writes RUN/events.jsonl the way training does (worker 0 only). The first attempt ends as
the scenario says: `preempt` saves at step 4 and the slice is preempted (the fake gcloud
sees $FAKE_GCLOUD_DIR/preempt); `maintenance` is killed (exit 137) while running;
`user_error` exits 2. A later attempt resumes at step 4 and finishes at step 8.
"""

import argparse
import json
import os
import sys
import time


def event(workdir: str, name: str, step: int) -> None:
    with open(os.path.join(workdir, "events.jsonl"), "a") as f:
        f.write(json.dumps({"event": name, "time": round(time.time(), 3), "step": step}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--scenario", required=True)
    args, _ = parser.parse_known_args()  # the quoting test passes arguments of its own
    # A TPU worker (the fake gcloud) or a SLURM task (launch/slurm.sbatch).
    worker = int(os.environ.get("TPU_WORKER_ID") or os.environ["JAXSPEECH_PROCESS_ID"])
    counter = os.path.join(args.workdir, "attempts")
    if worker == 0:
        os.makedirs(args.workdir, exist_ok=True)
        attempt = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
        with open(counter, "w") as f:
            f.write(str(attempt))
    else:
        attempt = int(open(counter).read())
    print(f"fake_train: worker {worker} attempt {attempt}", flush=True)
    print("argv " + json.dumps(sys.argv[1:]), flush=True)
    if attempt > 1:
        if worker == 0:
            event(args.workdir, "resumed", 4)
            event(args.workdir, "finished", 8)
        return 0
    if worker == 0:
        event(args.workdir, "started", 0)
    if args.scenario == "preempt":
        if worker == 0:
            event(args.workdir, "preempted", 4)
        open(os.path.join(os.environ["FAKE_GCLOUD_DIR"], "preempt"), "w").close()
        return 0
    if args.scenario == "maintenance":
        return 137
    return 2


if __name__ == "__main__":
    sys.exit(main())
