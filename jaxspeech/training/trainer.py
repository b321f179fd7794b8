"""The trainer: one invocation of a training run, from a config and a run directory.

`train_and_evaluate` builds a `Trainer` and runs it; the trainer reads top to bottom:
setup -> assets -> data -> model & optimizer -> restore -> the loop (step, log,
evaluate, checkpoint, preemption) -> final evaluation. What the run learns is its task's
(a `jaxspeech.training.task.Task` the caller's factory builds: `jaxspeech.tasks` passes
the recognizer's, the synthesizer's or the vocoder's): its assets, loader, model, step,
evaluation and samples; everything else here is shared by every task. The model, its
sharded state and the step come from the library (`jaxspeech.training.state`,
`jaxspeech.training.step`); this module only drives them.
Rerunning in the same RUN resumes from the latest checkpoint. Lifecycle events go to
RUN/events.jsonl (`jaxspeech.runs.events`).
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from ml_collections import ConfigDict

from jaxspeech.common import files, storage
from jaxspeech.common.errors import TrainingDiverged, UserError
from jaxspeech.config import build, defaults
from jaxspeech.config.validate import validate
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.evaluation import scoring as eval_lib
from jaxspeech.metrics import perf
from jaxspeech.metrics import trackers as trackers_lib
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules, sync
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import crash, events, faults, remote
from jaxspeech.runs import lease as lease_lib
from jaxspeech.runs.events import log
from jaxspeech.training import compile_cache, monitor
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib
from jaxspeech.training import task as task_lib
from jaxspeech.training.update import micro_batch_key, step_key


def train_and_evaluate(config: ConfigDict, workdir: str, make_task: task_lib.TaskFactory) -> dict:
    """Trains `config` in `workdir` (resuming if it holds checkpoints) with the task
    `make_task(config, mesh)` builds (`jaxspeech.tasks.train_and_evaluate` passes the
    registry's); returns the final evaluation ({} when train.run_steps stopped early,
    {"preempted_at_step"} on preemption, {"interrupted_at_step"} after a Ctrl-C)."""
    validate(config, devices=jax.device_count())  # every mistake at once, before any work
    if storage.is_remote(config.data.dir):
        storage.check_bucket(config.data.dir)  # one line now, not after the model is built
    elif not os.path.isdir(config.data.dir):
        raise UserError(
            f"data directory {config.data.dir!r} does not exist; prepare it with "
            "`python -m data_prep.prepare` or set --config.data.dir"
        )
    try:
        mesh = build.mesh_from_config(config)
        table = build.rules_from_config(config)
    except ValueError as e:  # a mesh the devices do not fit, a bad rules table
        raise UserError(str(e)) from e
    # Models are built outside the mesh context (Flax would read their logical axis names
    # as mesh axes); every jitted function is traced inside it (`jax.set_mesh`), so the
    # layers' logical-axis constraints apply, by the run's table. The run's lease comes
    # before anything is written to it: one training job per run directory.
    timeout = config.train.lease_timeout_s
    with lease_lib.hold_for_job(workdir, "train", timeout, warn=log) as held:
        with rules.axis_rules(table):
            trainer = None
            try:
                trainer = Trainer(config, workdir, mesh, held, make_task)
                return trainer.run()
            except lease_lib.LeaseLost:
                raise  # the run is another job's now: write nothing more to it
            except BaseException as e:
                # A failure while training ends the run's invocation; one refused at
                # start-up (a config or data mistake) leaves the run's state as it was.
                if trainer is not None:
                    trainer.writer.close_trackers(ok=False, timeout=5.0)
                    events.record_failure(trainer.workdir, e, trainer.committed)
                    trainer.push(final=True)
                raise


class Trainer:
    """One invocation of a training run: built ready to step, then `run()`.

    `self.state` is the `TrainState` (arrays the step takes and returns), `self.setup`
    its static parts (optimizer, schedule, strategy, shardings).
    """

    def __init__(
        self,
        config: ConfigDict,
        workdir: str,
        mesh,
        lease: lease_lib.Lease | None,
        make_task: task_lib.TaskFactory,
    ):
        # ---------------------------------------------------------- setup
        # A run on an object store is written in a local working copy and pushed
        # (runs/remote.py); its checkpoints are written to the store directly.
        self.copy = remote.RunCopy(workdir)
        workdir = self.copy.pull()
        self.copy.compact(jax.process_index())  # the lease's holder: no other writer
        self.config, self.workdir, self.mesh, self.lease = config, workdir, mesh, lease
        tr = config.train
        os.makedirs(workdir, exist_ok=True)  # the lease made it on process 0's file system
        if tr.compile_cache_dir:
            compile_cache.use(tr.compile_cache_dir, workdir)
        self.events = events.EventLog(workdir)
        log(
            f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}, "
            f"{jax.process_count()} process(es); mesh {dict(mesh.shape)}"
        )
        self.task = make_task(config, mesh)
        crash.note_run(workdir)  # a native crash's log goes there; each phase names a step
        crash.phase("installing assets")
        self.task.install_assets(workdir, self.copy.remote)
        crash.phase("reading the data and building the model")
        self.init_data()
        self.init_model()
        self.ckpt = ckpt_lib.Checkpointer(
            self.copy.url,
            keep=tr.keep_checkpoints,
            keep_best=tr.keep_best,
            every_steps=tr.checkpoint_every,
            every_minutes=tr.checkpoint_minutes,
            best=self.task.best_metric_name,
        )
        self.rng = np.asarray(jax.random.key_data(step_key(config.seed)))
        crash.phase("restoring the checkpoint")
        self.start = self.restore()
        if jax.process_index() == 0:  # after the restore: a refused config must not replace it
            files.atomic_write(
                os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=1)
            )
        self.committed = self.start  # where a restart would resume (Ctrl-C's line)
        self.preemption = ckpt_lib.Preemption(on_abort=self.abort)
        self.train_step = step_lib.jit_train_step(
            self.setup, self.task.train_step(self.setup), self.task.batch_shardings(), donate=True
        )
        self.compiled: dict[tuple, tuple] = {}  # batch shape -> (executable, model FLOPs)
        self.init_monitoring()
        self.push()  # the config and assets reach the store before any checkpoint

    def init_data(self) -> None:
        """The task's training loader, its fault budget, and the evaluation splits, all
        checked before any work."""
        config = self.config
        self.train_pipe = self.task.train_pipeline()
        self.train_iter = self.train_pipe.iterator()
        self.faults = faults.TrainingFaults(
            self.workdir, self.train_pipe.index, config.data.max_corrupt_fraction, self.events
        )
        self.eval_faults = faults.FaultLog(None, what=f"evaluating {config.data.eval_split}")
        # Mistakes in the evaluation settings stop the run now, not at its first evaluation.
        self.task.check_eval_settings()
        self.eval_splits = self.task.eval_splits

    def init_model(self) -> None:
        """The task's model, its optimizer and sync strategy, laid out on the mesh at step 0."""
        self.state, self.setup = self.task.init_state()
        spec = self.setup.spec
        log(
            self.task.describe_model(self.setup)
            + "\n"
            + rules.describe_shardings(
                spec.params, spec.param_shardings, self.mesh, spec.param_axes
            )
        )
        log(describe_strategy(self.setup))
        self.num_steps = int(self.config.train.num_steps)

    def init_monitoring(self) -> None:
        """The metric writers, the task's samples and evaluation, MFU and goodput."""
        config, mon = self.config, self.config.monitor
        names = trackers_lib.parse(mon.trackers)
        trackers = None
        if jax.process_index() == 0 and set(names) - {"tensorboard"}:
            trackers = trackers_lib.open_trackers(mon.trackers, self.workdir, config.to_dict())
            trackers.file(self.start, os.path.join(self.workdir, "config.json"), "config.json")
        self.writer = MetricWriter(
            os.path.join(self.workdir, "tensorboard"),
            jsonl_path=os.path.join(self.workdir, "metrics.jsonl"),
            trackers=trackers,
            tensorboard="tensorboard" in names,
        )
        self.task.init_monitoring(self.setup, self.writer)
        device_kind = jax.devices()[0].device_kind
        self.peak = perf.peak_flops_per_device(
            device_kind, build.compute_dtype(config), mon.peak_tflops
        )
        if not mon.count_flops:
            self.peak = None  # no model FLOPs, no MFU
            log("MFU: off (monitor.count_flops=False)")
        elif self.peak is None:
            log(f"MFU: no peak FLOP/s known for {device_kind!r}; set --config.monitor.peak_tflops")
        self.goodput = perf.Goodput()

    # ------------------------------------------------------------------ restore
    def restore(self) -> int:
        """Resume order: the latest committed checkpoint in RUN (a corrupt one is set aside
        and the one before used), else config.init_from (parameters only), else scratch.
        Returns the step training continues from."""
        config, setup = self.config, self.setup
        t0 = time.time()

        def warn(step: int, msg: str) -> None:
            log(msg)
            self.events.write("checkpoint_corrupt", step=step, message=msg)

        try:
            found = self.ckpt.restore_latest(
                warn=warn,
                abstract_model=setup.spec.abstract,
                abstract_train=setup.abstract_train(self.state),
                data_iter=self.train_iter,
            )
        except ckpt_lib.CheckpointError as e:
            raise UserError(
                f"{e}\n{self.strategy_change()}use a new --workdir, or the config that run "
                f"was trained with ({os.path.join(self.workdir, 'config.json')})"
            ) from e
        if found is not None:
            start, restored = found
            saved_rng = np.asarray(jax.device_get(restored[ckpt_lib.TRAIN]["rng"]))
            if not np.array_equal(saved_rng, self.rng):
                raise UserError(
                    f"checkpoint {start} was trained with another config.seed than "
                    f"{config.seed}: resuming would change every random stream; use that seed "
                    "or a new --workdir"
                )
            self.state = setup.restored(
                self.state, restored[ckpt_lib.MODEL], restored[ckpt_lib.TRAIN]
            )
            self.faults.budget.load(self.ckpt.meta(start).get("data_faults"))
            seconds = time.time() - t0
            log(f"resumed from step {start} in {seconds:.1f}s")
            self.events.write("resumed", step=start, seconds=round(seconds, 3))
            return start
        if config.init_from:
            try:
                src_step, src = ckpt_lib.load_model(config.init_from, setup.spec.abstract)
            except ckpt_lib.CheckpointError as e:
                raise UserError(f"config.init_from: {e}") from e
            # this run's own feature statistics stay
            self.state = self.state.replace(params=src["params"])
            log(
                f"initialized parameters from {config.init_from} (step {src_step}) in "
                f"{time.time() - t0:.1f}s"
            )
            self.events.write("initialized_from", path=config.init_from, step=src_step)
        return 0

    def strategy_change(self) -> str:
        """A sentence naming a sync strategy that differs from the latest checkpoint's
        ("" if it is the same or unknown): its state has another layout."""
        latest = self.ckpt.latest_step()
        keys = ("strategy", "outer")  # the defaults' where a config predates the key
        try:
            saved = self.ckpt.meta(latest).get("config", {}) if latest else {}
            before = {k: defaults.lookup(saved, f"sync.{k}") for k in keys}
        except Exception:  # noqa: BLE001 - unreadable metadata: the error above says enough
            return ""
        now = {k: defaults.lookup(self.config, f"sync.{k}") for k in keys}
        if before == now:
            return ""
        return (
            f"checkpoint {latest} was trained with sync.strategy={before['strategy']} "
            f"(outer {before['outer']}), this config asks for {now['strategy']} (outer "
            f"{now['outer']}): a strategy's state (learners, momentum, residuals) does not "
            "carry over to another; "
        )

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Train from the restored step to num_steps (or train.run_steps of them), then
        evaluate. Returns the final evaluation, {} when stopped early, or
        {"preempted_at_step"} / {"interrupted_at_step"}."""
        tr, start, num_steps = self.config.train, self.start, self.num_steps
        spec, grad_accum = self.train_pipe.plan.spec, int(tr.grad_accum)
        log(
            f"training steps {start} -> {num_steps}; {len(spec.boundaries)} batch shapes: "
            f"{spec.shapes()}"
            + (f"; {grad_accum} micro-batches per step" if grad_accum > 1 else "")
        )
        # train.run_steps > 0 ends this invocation early (job queues with wall-time limits:
        # resubmit the same command and it resumes); the schedule still spans num_steps.
        stop = min(num_steps, start + tr.run_steps) if tr.run_steps else num_steps
        self.events.write(
            "started", step=start, stop=stop, num_steps=num_steps, processes=jax.process_count()
        )
        self.ids_log = (
            events.BatchIdLog(self.workdir) if self.config.monitor.log_batch_ids else None
        )
        self.pending, self.window_flops = [], 0.0
        self.nonfinite_run = self.nonfinite_total = 0
        t_start = time.time()
        for step in range(start, stop):
            if self.lease is not None:
                self.lease.check(step)  # taken over by another job: stop before writing more
            done, local, eval_result = self.train_one(step, stop)
            if self.preemption.reached(done):  # every process, every step
                why = "interrupted" if self.preemption.interrupted else "preemption"
                self.save(done, why, eval_result)
                self.note_committed()
                return self.stop_preempted(done)
            why = "end of this run" if done in (num_steps, stop) else self.ckpt.due(done)
            if why:
                self.save(done, why, eval_result)
            self.note_committed()
            mon = self.config.monitor
            if mon.samples_every and done % mon.samples_every == 0:
                with self.goodput.phase("eval"):
                    self.task.samples(done, self.model_params(), self.state.model_vars, local)
        with self.goodput.phase("checkpoint"):
            self.ckpt.wait()
        self.note_committed()
        if stop > start:
            self.log_totals(start, stop, t_start)
        return self.finish(stop)

    def train_one(self, step: int, stop: int) -> tuple[int, dict, task_lib.EvalResult | None]:
        """One step: read the batch, run the compiled step, account faults and skipped
        steps, log, evaluate when due (before saving, so the checkpoint carries its WER
        for best-checkpoint keeping). Returns (steps done, the host batch, evaluation)."""
        tr, sr = self.config.train, self.config.features.sample_rate
        crash.phase(f"step {step + 1}")
        with self.goodput.phase("data"):
            local = next(self.train_iter)
            host = pipeline_lib.pop_host_values(local)
            ids = host.get("id")
            audio_s = float(np.sum(local["audio_len"] * local["weight"])) / sr
            batch = mesh_lib.host_to_global(self.mesh, local)
        if self.ids_log is not None:
            self.ids_log.write(step + 1, [i for i, w in zip(ids, local["weight"]) if w])
        exe, flops = self.compiled_step(batch, step)
        with self.goodput.phase("compute"):
            self.state, metrics = exe(self.state, batch)
            # Waiting here splits data wait from compute; the loader's threads and
            # workers keep reading ahead meanwhile.
            nonfinite, corrupt = jax.device_get((metrics["nonfinite"], metrics["skipped_corrupt"]))
        done = step + 1
        try:
            self.faults.step(done, self.train_pipe.plan.epoch_of(step)[0], host, int(corrupt))
        except faults.CorpusDamaged:
            self.ckpt.wait()  # a save in flight completes: the run resumes after a fix
            raise
        self.check_nonfinite(bool(nonfinite), done, metrics, batch, local)
        host_values = {"audio_seconds": audio_s, "read_retries": host["read_retries"]}
        if "stream" in host:  # scheduled learning: which stream this step read
            host_values["labeled_batch"] = float(host["stream"] == 0)
        self.pending.append(metrics | host_values)
        self.window_flops += flops or 0.0
        if done % tr.log_every == 0 or done in (self.num_steps, stop):
            self.log_window(done, step)
        eval_result = None
        if tr.eval_every and done % tr.eval_every == 0 and done < self.num_steps:
            eval_result = self.evaluate(done)
        return done, local, eval_result

    def finish(self, stop: int) -> dict:
        """End of this invocation: stopped early ({}), or finished (the final evaluation,
        after the last checkpoint committed: a Ctrl-C in it loses no step)."""
        num_steps = self.num_steps
        if stop < num_steps:
            log(f"stopping at step {stop} of {num_steps} (train.run_steps); rerun to resume")
            self.events.write("stopped", step=stop, num_steps=num_steps)
            self.close()
            return {}
        result = None
        if self.config.train.eval_at_end:
            if self.preemption.interrupted:  # Ctrl-C while the last save committed
                return self.stop_preempted(num_steps)
            self.preemption.all_saved = True  # a Ctrl-C now stops at once, losing nothing
            result = self.evaluate(num_steps)
        self.events.write(
            "finished",
            step=num_steps,
            **({"split": result.split, **result.headline} if result else {}),
        )
        self.close()
        return result.raw if result else {}

    # ------------------------------------------------------------------ step pieces
    def compiled_step(self, batch: dict, step: int) -> tuple:
        """The step's executable for this batch shape, compiled (and its FLOPs counted) once."""
        key = tuple(batch["audio"].shape)
        if key not in self.compiled:
            config = self.config
            crash.phase(f"compiling the step (step {step + 1})")
            with self.goodput.phase("compile"):
                shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
                with jax.set_mesh(self.mesh):
                    lowered = self.train_step.lower(self.state, batch)
                exe = lowered.compile()
                flops = self.task.step_flops(shapes) if config.monitor.count_flops else None
                self.compiled[key] = (exe, flops)
                log(monitor.describe_compiled(exe, shapes, flops, config.features.sample_rate))
        return self.compiled[key]

    def check_nonfinite(self, skipped: bool, done: int, metrics, batch, local) -> None:
        """Count a skipped (non-finite) step; after train.max_nonfinite_steps in a row,
        write diagnostics and stop with TrainingDiverged."""
        if not skipped:
            self.nonfinite_run = 0
            return
        tr = self.config.train
        self.nonfinite_run, self.nonfinite_total = self.nonfinite_run + 1, self.nonfinite_total + 1
        log(
            f"step {done}: non-finite loss or gradient (loss {float(metrics['loss'])}, "
            f"grad norm {float(metrics['grad_norm'])}): update skipped, state unchanged "
            f"({self.nonfinite_run} in a row, {self.nonfinite_total} in this run)"
        )
        self.events.write("nonfinite_skip", step=done, in_a_row=self.nonfinite_run)
        if self.nonfinite_run < tr.max_nonfinite_steps:
            return
        report = monitor.write_nonfinite_diagnostics(
            self.workdir,
            done,
            self.task.diagnostic_grads_fn(self.setup),
            micro_batch_key(self.config.seed, done - 1, 0),
            self.state.params,
            self.state.model_vars,
            batch,
            local,
            metrics,
        )
        self.ckpt.wait()
        raise TrainingDiverged(
            f"{self.nonfinite_run} steps in a row ({done - self.nonfinite_run + 1}..{done}) "
            f"had a non-finite loss or gradient (train.max_nonfinite_steps="
            f"{tr.max_nonfinite_steps}); diagnostics in {report}. The last checkpoint "
            f"is step {self.ckpt.latest_step()}: lower optim.peak_lr, check the data named "
            "there, or raise the limit."
        )

    def log_window(self, done: int, step: int) -> None:
        """Scalars and the console progress line of the steps since the last one."""
        scalars, figures = monitor.window_summary(
            jax.device_get(self.pending),
            self.goodput.window(),
            flops=self.window_flops,
            lr=float(self.setup.schedule(step)),
            peak_flops=self.peak,
            goodput=self.goodput.goodput(),
            device_hour_price=self.config.monitor.device_hour_price,
        )
        self.writer.scalars(done, scalars)
        log(monitor.progress_line(done, self.num_steps, figures))
        self.pending, self.window_flops = [], 0.0

    def log_totals(self, start: int, stop: int, t_start: float) -> None:
        totals = self.goodput.totals()
        log(
            f"trained steps {start} -> {stop} in {(time.time() - t_start) / 60:.1f} min; "
            f"goodput {self.goodput.goodput():.0%} ("
            + ", ".join(f"{k} {v:.0f}s" for k, v in totals.items() if k != "wall" and v >= 0.5)
            + ")"
            + (f"; {self.nonfinite_total} non-finite steps skipped" if self.nonfinite_total else "")
        )
        if self.faults.summary():
            print(self.faults.summary(), flush=True)

    def model_params(self) -> dict:
        """The model to evaluate, sample from and save (under gossip, the learners' mean,
        refreshed here: the step itself never averages all learners)."""
        self.state = self.state.replace(params=self.setup.model_params(self.state))
        return self.state.params

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, step: int) -> task_lib.EvalResult:
        """The task's scores of each split of config.data.eval_split (WER/CER, or the
        synthesizer's losses and MCD), to RUN/eval/, TensorBoard and the console. Returns
        the first split's result: its `best` ranks the checkpoints."""
        crash.phase(f"evaluating step {step}")
        params = self.model_params()
        results = []
        for split in self.eval_splits:
            with self.goodput.phase("eval"), jax.set_mesh(self.mesh):
                result = self.task.evaluate_split(
                    split, step, params, self.state.model_vars, self.eval_faults
                )
            path = eval_lib.write_result(self.workdir, result.raw, step)
            if self.writer.trackers is not None:
                self.writer.trackers.file(step, path, f"eval/{os.path.basename(path)}")
            self.push()
            self.writer.scalars(step, result.scalars)
            log(result.description)
            self.events.write("evaluated", step=step, split=split, **result.headline)
            results.append(result)
        return results[0]

    # ------------------------------------------------------------------ checkpoints
    def save(self, done: int, why: str, eval_result: task_lib.EvalResult | None) -> None:
        """Start an asynchronous save of everything a resume needs."""
        # On an object store: the logs up to this step are there before the checkpoint
        # can commit, so a kill after the commit loses none (a resume logs only later steps).
        self.push()
        t0 = time.time()
        with self.goodput.phase("checkpoint"):
            train = self.setup.train_item(self.state, self.rng)
            self.ckpt.save(
                done,
                model={"params": self.model_params(), "model_vars": self.state.model_vars},
                train=train,
                data_iter=self.train_iter,
                meta={
                    "config": json.loads(self.config.to_json_best_effort()),
                    "reason": why,
                    "data_faults": self.faults.budget.state(),
                },
                metrics=({self.task.best_metric_name: eval_result.best} if eval_result else None),
            )
        log(f"checkpoint {done} ({why}): saving in the background ({time.time() - t0:.1f}s)")
        self.events.write("checkpoint_saved", step=done, reason=why)

    def note_committed(self) -> None:
        committed = self.ckpt.committed()
        self.committed = max([self.committed, *committed])
        for step in committed:
            self.events.write("checkpoint_committed", step=step)
        if committed:
            self.push()
        elif self.copy.remote:
            self.copy.push_due()

    def push(self, final: bool = False) -> None:
        """Uploads the run's changed files when it lives on an object store. `final`: the
        job is ending with an error of its own, which a failed upload must not hide."""
        try:
            self.copy.push()
        except Exception as e:
            if not final:
                raise
            log(f"WARNING: could not upload the run's last files to {self.copy.url}: {e}")

    def stop_preempted(self, done: int) -> dict:
        with self.goodput.phase("checkpoint"):
            self.ckpt.wait()
        self.note_committed()
        ctrl_c = self.preemption.interrupted  # the user's stop: `stopped`, not restarted
        reason = {"reason": "interrupted"} if ctrl_c else {}
        self.events.write("stopped" if ctrl_c else "preempted", step=done, **reason)
        self.close()
        print(ckpt_lib.stop_line(done, ctrl_c), flush=True)  # every process says where
        return {"interrupted_at_step" if ctrl_c else "preempted_at_step": done}

    def abort(self) -> str:
        """A second Ctrl-C (the first in the final evaluation): its event and line."""
        self.events.write("stopped", step=self.committed, reason="interrupted")
        return ckpt_lib.abort_line(self.committed, self.preemption.all_saved)

    def close(self) -> None:
        self.preemption.close()
        self.faults.log.close()
        dropped = self.writer.close_trackers(ok=True)
        if dropped:  # what `status` and tools read: the trackers miss these
            self.events.write("tracker_drops", trackers=dropped)
        self.writer.close()
        self.ckpt.close()
        self.note_committed()
        self.events.close()
        self.push()


def describe_strategy(setup: state_lib.TrainSetup) -> str:
    """The start-up line of the sync strategy: learners and bytes per device per step."""
    spec = setup.spec
    payload = sync.payload_bytes(setup.strategy, spec.params, spec.param_shardings, spec.mesh)
    return sync.describe(setup.strategy, payload)
