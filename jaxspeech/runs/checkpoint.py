"""Orbax checkpoints that survive kills, preemptions and corruption.

Items of one checkpoint step (`RUN/checkpoints/<step>/`):
  model      {"params": ..., "model_vars": ...}      (all evaluation and export need)
  train      {"opt_state": ..., "step": int32, "rng": uint32[2]}
  data_iter  the Grain iterator state of every process
  meta       JSON: the resolved config, the parameters' content fingerprint, step, time
RNG state is the base key (`rng`) and the step: every random stream of a step is that key
folded with the step, so the pair is the whole state. Arrays are restored straight into
the current mesh's shardings (abstract targets carry them), whatever mesh saved them.

What makes it robust:
- Orbax writes a step into a temporary directory and renames it when complete, so a
  process killed mid-save leaves no half checkpoint among the steps (leftovers are
  removed at start-up).
- Each save stores a fingerprint of the parameters' bits that does not depend on how
  they are sharded; a restore recomputes and compares it. A latest checkpoint that fails
  to read or to match is reported, moved to `RUN/checkpoints_corrupt/`, and the previous
  committed one is used (`restore_latest`).
- Saves are decided the same way on every process: every N steps, when process 0's
  clock says M minutes passed since the last save, at the end, and at the step all
  processes agree on after a preemption notice (`Preemption`).
No pickle anywhere: arrays in OCDBT/Zarr, everything else JSON.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from jaxspeech.common import storage
from jaxspeech.runs import remote

MODEL, TRAIN, DATA_ITER, META = "model", "train", "data_iter", "meta"
CORRUPT_DIR = "checkpoints_corrupt"
# `save(metrics=...)` key the best checkpoint is chosen by (lower): the recognizer's dev
# WER; a synthesizer's run ranks by its dev mel loss ("eval_mel_l1", `Checkpointer(best=)`).
BEST_METRIC = "eval_wer"


class CheckpointError(Exception):
    """A checkpoint this run cannot use: an incompatible model, or none readable."""


# ---------------------------------------------------------------- content fingerprint
def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finalizer: every input bit flips about half the output bits."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    """(2,) uint32: two differently seeded sums over elements of mix(bits, position).

    A sum modulo 2^32 is exact and order-free, so any sharding and any reduction order
    give the same value, and a restore on another mesh can be checked against the save.
    """
    x = jnp.asarray(x)
    if x.dtype.itemsize == 4:
        bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif x.dtype.itemsize == 2:
        bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    elif x.dtype.itemsize == 1:
        bits = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    else:
        raise TypeError(f"no fingerprint for dtype {x.dtype}")
    bits = bits.reshape(-1)
    pos = jax.lax.broadcasted_iota(jnp.uint32, bits.shape, 0)
    lanes = [
        jnp.sum(_fmix32(bits ^ _fmix32(pos * jnp.uint32(2) + jnp.uint32(seed))), dtype=jnp.uint32)
        for seed in (0x9E3779B9, 0x7F4A7C15)
    ]
    return jnp.stack(lanes)


_leaf_fingerprints = jax.jit(lambda tree: jax.tree.map(_leaf_fingerprint, tree))


def fingerprint(tree: Any) -> str:
    """Hex digest of a tree of (possibly sharded, multi-host) arrays' paths, shapes,
    dtypes and bits; equal for equal values on any mesh. Every process must call it."""
    lanes = jax.device_get(_leaf_fingerprints(tree))  # scalars, replicated on every device
    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for (path, x), lane in zip(leaves, jax.tree.leaves(lanes)):
        h.update(f"{jax.tree_util.keystr(path)}:{x.shape}:{x.dtype}:".encode())
        h.update(np.asarray(lane, np.uint32).tobytes())
    return h.hexdigest()[:32]


def _leaf_specs(tree: Any) -> dict[str, tuple[tuple, np.dtype]]:
    """{"a/0/mu/w": (shape, dtype)} of a tree of arrays, ShapeDtypeStructs or Orbax
    ArrayMetadata; dict keys, attribute names and sequence indices all become path parts,
    so an optax state matches its stored form (Orbax stores named tuples as dicts)."""

    def name(k) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)

    return {
        "/".join(name(k) for k in path): (tuple(x.shape), np.dtype(x.dtype))
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def shape_mismatches(expected: Any, stored: Any) -> list[str]:
    """Array paths where a stored tree differs from `expected` (missing, extra, other
    shape or dtype); [] when it fits."""
    want, have = _leaf_specs(expected), _leaf_specs(stored)
    out = [f"{k}: not in the checkpoint" for k in want if k not in have]
    out += [f"{k}: only in the checkpoint" for k in have if k not in want]
    for k in want.keys() & have.keys():
        (ws, wd), (hs, hd) = want[k], have[k]
        if ws != hs or wd != hd:
            out.append(f"{k}: checkpoint {hd}{list(hs)}, this run {wd}{list(ws)}")
    return sorted(out)


# ---------------------------------------------------------------- preemption
class Preemption:
    """Whether this step is the one to save at and stop, the same on every process.

    Multi-process runs use JAX's preemption notifier (it catches SIGTERM and the TPU
    maintenance notice on any host and the processes agree on the next safe step through
    `multihost_utils.reached_preemption_sync_point`). A single process has no notifier:
    it catches SIGTERM itself and stops after the step in flight. `reached` must be
    called once per step, by every process, from the same start step.

    Ctrl-C (SIGINT) asks for the same stop (a multi-process run's process passes it to
    the notifier as a SIGTERM of its own), with one line saying so, and `interrupted`
    tells the trainer to end the run as `stopped`, not `preempted`. A second Ctrl-C, or
    the first once `all_saved` is set (nothing left to lose), stops at once: `on_abort()`
    returns the line to print (and records what it must), and the process exits with
    code 130 without unwinding (no traceback, no thread pool left half shut down).
    """

    def __init__(self, on_abort: Callable[[], str] | None = None):
        self._signal: int | None = None
        self._previous: dict[int, Any] = {}
        self.interrupted = False
        self.all_saved = False
        self.on_abort = on_abort
        if jax.process_count() == 1:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum

    def _on_interrupt(self, signum, frame) -> None:
        if self.interrupted or self.all_saved:
            line = self.on_abort() if self.on_abort else "interrupted"
            print(line, file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(130)
        self.interrupted = True
        print(
            "train: interrupted (Ctrl-C): stopping once the step in flight is saved; "
            "Ctrl-C again stops at once",
            flush=True,
        )
        if jax.process_count() > 1:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier: all agree on a step
        else:
            self._signal = signum

    def reached(self, step: int) -> bool:
        if jax.process_count() > 1:
            return bool(multihost_utils.reached_preemption_sync_point(step))
        return self._signal is not None

    def close(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


def stop_line(step: int, interrupted: bool) -> str:
    """What a run stopped by SIGTERM (`preempted`) or Ctrl-C after saving `step` prints."""
    if interrupted:
        return (
            f"train: interrupted: stopped after step {step} and saved checkpoint {step}; "
            "rerun the same command to resume"
        )
    return (
        f"preempted: all processes stopped after step {step} and saved checkpoint {step}; "
        "rerun the same command to resume"
    )


def abort_line(committed: int, all_saved: bool) -> str:
    """What a run stopped at once by Ctrl-C prints (`committed`: where it resumes)."""
    if all_saved:
        return (
            f"train: interrupted during the final evaluation; checkpoint {committed} is "
            "saved: rerun the same command to evaluate it"
        )
    if not committed:
        return "train: stopped at once (second Ctrl-C) before any checkpoint: rerun to start"
    return (
        "train: stopped at once (second Ctrl-C); the run resumes from checkpoint "
        f"{committed}: rerun the same command"
    )


def all_processes(ok: bool) -> bool:
    """True only if `ok` on every process (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.min(multihost_utils.process_allgather(np.int32(ok))) == 1)


# ---------------------------------------------------------------- manager
class Checkpointer:
    """`ocp.CheckpointManager` with the items above, the save schedule and safe restore.

    Keeps the last `keep` steps plus the `keep_best` with the lowest `best` metric
    (steps saved with `metrics={best: ...}`; default "eval_wer").
    """

    def __init__(
        self,
        workdir: str,
        *,
        keep: int = 3,
        keep_best: int = 1,
        every_steps: int = 0,
        every_minutes: float = 0.0,
        async_save: bool = True,
        read_only: bool = False,
        best: str = BEST_METRIC,
    ):
        """read_only: for readers of a run another process may be writing (evaluation,
        init_from): no directory is created and no temporary save is cleaned up."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
        self.workdir = storage.absolute(workdir)
        self.directory = storage.join(self.workdir, "checkpoints")
        self.remote = storage.is_remote(self.workdir)
        if self.workdir.startswith("s3://"):
            remote.install_orbax_s3()
        elif self.remote:
            remote.configure_gcs()
        self.every_steps, self.every_minutes = int(every_steps), float(every_minutes)
        keep_policies = [policies.LatestN(n=keep)]
        if keep_best:
            keep_policies.append(
                policies.BestN(
                    get_metric_fn=lambda m: m[best],
                    reverse=True,  # keeps the last n of the sorted list: the lowest values
                    n=keep_best,
                    keep_checkpoints_without_metrics=False,
                )
            )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=async_save and not read_only,
                create=not read_only,
                read_only=read_only,
                # What a process killed mid-save left; a reader must not touch the
                # temporary directory of a save in flight.
                cleanup_tmp_directories=not read_only,
                preservation_policy=policies.AnyPreservationPolicy(keep_policies),
                # Object stores have no rename: a step is committed by its commit file.
                temporary_path_class=(
                    ocp.path.atomicity.CommitFileTemporaryPath if self.remote else None
                ),
            ),
            item_names=(MODEL, TRAIN, DATA_ITER, META),
            item_handlers={
                MODEL: ocp.StandardCheckpointHandler(),
                TRAIN: ocp.StandardCheckpointHandler(),
                DATA_ITER: grain.checkpoint.CheckpointHandler(),
                META: ocp.JsonCheckpointHandler(),
            },
        )
        self._last_save = time.time()  # a restart counts from its own start
        self._in_flight: int | None = None  # the asynchronous save not yet committed
        self._committed: list[int] = []  # committed since the last `committed()` call

    # ------------------------------------------------------------ steps
    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def due(self, step: int) -> str | None:
        """Why `step` should be saved on the regular schedule ("every N steps",
        "M minutes since the last save"), or None. Same answer on every process: the
        clock read is process 0's, broadcast (a collective when minutes are set)."""
        if self.every_steps and step % self.every_steps == 0:
            return f"every {self.every_steps} steps"
        if self.every_minutes > 0:
            late = time.time() - self._last_save >= 60 * self.every_minutes
            if jax.process_count() > 1:
                late = bool(multihost_utils.broadcast_one_to_all(np.int32(late)))
            if late:
                return f"{self.every_minutes:g} minutes since the last save"
        return None

    # ------------------------------------------------------------ save
    def save(
        self,
        step: int,
        *,
        model: dict,
        train: dict,
        data_iter: grain.DatasetIterator,
        meta: dict | None = None,
        metrics: dict | None = None,
    ) -> None:
        """Start an asynchronous save of `step` (the arrays are copied off the devices
        before it returns, so they may be donated right after). `meta` (JSON) is stored
        with the parameters' fingerprint added; `metrics` ({"eval_wer": x}) rank steps
        for `keep_best`."""
        self.check_space(step, (model, train))
        meta = dict(meta or {})
        meta.update(
            step=int(step),
            params_fingerprint=fingerprint(model["params"]),
            time=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            process_count=jax.process_count(),
        )
        previous = self._in_flight
        self.manager.save(  # waits for the previous save to commit first
            step,
            args=ocp.args.Composite(
                **{
                    MODEL: ocp.args.StandardSave(model),
                    TRAIN: ocp.args.StandardSave(train),
                    DATA_ITER: grain.checkpoint.CheckpointSave(data_iter),
                    META: ocp.args.JsonSave(meta),
                }
            ),
            metrics=metrics,
            force=True,  # the schedule is decided by `due`/`Preemption`, not by Orbax
        )
        if previous is not None:
            self._committed.append(previous)
        self._in_flight = step
        self._last_save = time.time()

    def check_space(self, step: int, trees: Any) -> None:
        """Raises ENOSPC before a save that cannot fit: the arrays' bytes (plus 5% and
        1 MiB for metadata) against the free space of the checkpoint directory's disk, on
        every process (a collective, so all stop together). Orbax would otherwise fail in
        its writer threads, midway, with a traceback per thread."""
        needed = sum(int(x.nbytes) for x in jax.tree.leaves(trees) if hasattr(x, "nbytes"))
        needed = int(needed * 1.05) + 2**20
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:  # not a local path: the store reports its own errors
            free = needed
        if not all_processes(free >= needed):
            raise OSError(
                errno.ENOSPC,
                f"No space left on device: checkpoint {step} needs about "
                f"{needed / 2**20:.1f} MiB, {free / 2**20:.1f} MiB free here "
                "(or on another process)",
                self.directory,
            )

    def committed(self) -> list[int]:
        """Steps whose save has committed since the last call, oldest first (a cheap
        poll: no waiting)."""
        if self._in_flight is not None and not self.manager.is_saving_in_progress():
            # A save that failed (a full disk) also ends: only a step Orbax finalized, i.e.
            # renamed from its temporary directory, counts (the error surfaces at the next
            # save or wait).
            if self.finalized(self._in_flight):
                self._committed.append(self._in_flight)
            self._in_flight = None
        out, self._committed = self._committed, []
        return out

    def finalized(self, step: int) -> bool:
        """Whether Orbax finalized `step`: renamed from its temporary directory on a disk,
        its commit file written on an object store."""
        if not self.remote:
            return os.path.isdir(os.path.join(self.directory, str(step)))
        commit = ocp.path.atomicity.COMMIT_SUCCESS_FILE
        return storage.exists(storage.join(self.directory, str(step), commit))

    # ------------------------------------------------------------ restore
    def meta(self, step: int) -> dict:
        """The JSON item of `step` ({} for a checkpoint saved without one)."""
        if not storage.exists(storage.join(self.directory, str(step), META)):
            return {}
        out = self.manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
        return dict(out[META] or {})

    def check_compatible(self, step: int, abstract: dict[str, Any]) -> None:
        """Raise CheckpointError naming every array of `step` whose structure, shape or
        dtype differs from `abstract` ({item: abstract tree}).

        Reading the metadata fails only for a damaged checkpoint: that is left to
        `restore`, which reports it as corrupt.
        """
        try:
            md = self.manager.item_metadata(step)
        except Exception:  # noqa: BLE001 - damaged metadata: restore reports it
            return
        problems = []
        for item, tree in abstract.items():
            stored = md[item] if item in md.keys() else None
            stored = getattr(stored, "tree", stored)
            if stored is None:
                continue
            problems += [f"{item}/{p}" for p in shape_mismatches(tree, stored)]
        if problems:
            shown = "\n  ".join(problems[:12]) + (
                f"\n  ... and {len(problems) - 12} more" if len(problems) > 12 else ""
            )
            raise CheckpointError(
                f"checkpoint {step} in {self.directory} was written by a different model or "
                f"optimizer ({len(problems)} arrays differ):\n  {shown}"
            )

    def restore(
        self,
        step: int,
        *,
        abstract_model: dict,
        abstract_train: dict | None = None,
        data_iter: grain.DatasetIterator | None = None,
        verify: bool = True,
    ) -> dict:
        """Restore the requested items of `step` (the data iterator in place); with
        `verify`, raise CheckpointError if the parameters' fingerprint differs from the
        stored one."""
        args = {MODEL: ocp.args.StandardRestore(abstract_model)}
        if abstract_train is not None:
            args[TRAIN] = ocp.args.StandardRestore(abstract_train)
        if data_iter is not None:
            args[DATA_ITER] = grain.checkpoint.CheckpointRestore(data_iter)
        out = dict(self.manager.restore(step, args=ocp.args.Composite(**args)).items())
        if verify and (problem := self.verify(step, out[MODEL]["params"])):
            raise CheckpointError(problem)
        return out

    def verify(self, step: int, params: Any) -> str | None:
        """Why `params` are not what `step` saved (fingerprint or metadata), or None.

        The fingerprint is a collective: every process computes it, whatever its own read
        of the metadata gave, so a failure on one process cannot leave the others waiting.
        """
        try:
            expected = self.meta(step).get("params_fingerprint")
            problem = None
        except Exception as e:  # noqa: BLE001 - unreadable metadata is corruption
            expected, problem = None, f"unreadable metadata: {type(e).__name__}: {e}"
        got = fingerprint(params)
        if problem is None and expected is not None and got != expected:
            problem = f"parameter fingerprint {got} differs from the saved {expected}"
        return problem

    def restore_latest(
        self, *, warn: Callable[[int, str], None], **restore_kwargs
    ) -> tuple[int, dict] | None:
        """Restore the latest step that reads and verifies; (step, items), or None when
        the workdir has no checkpoint.

        A step that fails (on any process) is reported through `warn(step, message)`, moved to
        RUN/checkpoints_corrupt/, and the step before it is tried. An incompatible model
        is not corruption: it raises CheckpointError at once.
        """
        while (step := self.latest_step()) is not None:
            abstract = {MODEL: restore_kwargs["abstract_model"]}
            if restore_kwargs.get("abstract_train") is not None:
                abstract[TRAIN] = restore_kwargs["abstract_train"]
            self.check_compatible(step, abstract)
            # Read everywhere, agree, then verify everywhere: a process whose read failed
            # must not skip a collective (the fingerprint) the others are in.
            error = None
            try:
                restored = self.restore(step, verify=False, **restore_kwargs)
            except Exception as e:  # noqa: BLE001 - any failure to read is corruption here
                error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            if all_processes(error is None):
                error = self.verify(step, restored[MODEL]["params"])
                if all_processes(error is None):
                    return step, restored
            previous = [s for s in self.all_steps() if s < step]
            warn(
                step,
                f"WARNING: checkpoint {step} is corrupt or incomplete ("
                f"{error or 'failed on another process'}); moving it to {CORRUPT_DIR}/ and "
                + (f"restoring step {previous[-1]}" if previous else "starting from scratch"),
            )
            self.quarantine(step)
        return None

    def quarantine(self, step: int) -> None:
        """Move `step` out of the manager's sight (process 0; everyone waits for it)."""
        if jax.process_index() == 0 and self.remote:
            self._quarantine_object_store(step)
        elif jax.process_index() == 0:
            dst_root = os.path.join(self.workdir, CORRUPT_DIR)
            os.makedirs(dst_root, exist_ok=True)
            dst = os.path.join(dst_root, f"{step}-{int(time.time())}")
            while os.path.exists(dst):  # the same step set aside twice in one second
                dst += "x"
            shutil.move(os.path.join(self.directory, str(step)), dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"jaxspeech quarantine {step}")
        self.manager.reload()

    def _quarantine_object_store(self, step: int) -> None:
        """A store has no rename: the step's objects are copied aside, then its commit
        file is deleted (a kill after that leaves no step that looks committed), then
        the rest."""
        fs, path = storage.filesystem(self.directory)
        src = f"{path}/{step}"
        dst = storage.join(self.workdir, CORRUPT_DIR, f"{step}-{int(time.time())}")
        _, dst_path = storage.filesystem(dst)
        storage.retrying(dst, lambda: fs.copy(src, dst_path, recursive=True))
        commit = f"{src}/{ocp.path.atomicity.COMMIT_SUCCESS_FILE}"
        storage.retrying(dst, lambda: fs.rm(commit))
        storage.retrying(dst, lambda: fs.rm(src, recursive=True))

    # ------------------------------------------------------------ lifetime
    def wait(self) -> None:
        """Block until pending asynchronous saves are committed."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def load_model(path: str, abstract_model: dict, step: int | None = None) -> tuple[int, dict]:
    """(step, {"params", "model_vars"}) from a run directory (its latest step unless
    `step`) or a step directory `RUN/checkpoints/<step>`, read-only and verified.

    Raises:
      CheckpointError: no such run or step, an incompatible model, or a corrupt step.
    """
    path = storage.absolute(path).rstrip("/")
    name, parent = path.rsplit("/", 1)[-1], path.rsplit("/", 1)[0]
    if name.isdigit() and parent.rsplit("/", 1)[-1] == "checkpoints":
        step, path = int(name), parent.rsplit("/", 1)[0]
    if not storage.exists(storage.join(path, "checkpoints")):
        raise CheckpointError(
            f"{path} is neither a run directory (with checkpoints/) nor RUN/checkpoints/<step>"
        )
    ckpt = Checkpointer(path, read_only=True)
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None or step not in ckpt.all_steps():
            raise CheckpointError(
                f"no committed checkpoint{'' if step is None else f' {step}'} in {ckpt.directory}"
            )
        ckpt.check_compatible(step, {MODEL: abstract_model})
        try:
            return step, ckpt.restore(step, abstract_model=abstract_model)[MODEL]
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - a read failure names the step
            raise CheckpointError(
                f"checkpoint {step} in {ckpt.directory} is unreadable: {e}"
            ) from e
    finally:
        ckpt.close()
