"""The experiment trackers a run can write to besides TensorBoard: MLflow and Weights &
Biases, each behind the same small interface (`Backend`), called only from the
background thread of `jaxspeech.metrics.trackers.TrackerQueue`.

Endpoints and credentials come from the environment, as each library reads them
(MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN, MLFLOW_EXPERIMENT_NAME;
WANDB_API_KEY, WANDB_MODE, WANDB_PROJECT, WANDB_ENTITY, WANDB_DIR); nothing here reads or
writes them, so they never reach the run directory.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from typing import Protocol

# Names of monitor.trackers -> the package that provides each (TensorBoard is built in).
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}
EXPERIMENT = "jaxspeech"  # MLflow experiment / W&B project when the environment names none


class Backend(Protocol):
    """One tracker's run. Every call may raise (a server down): the queue counts it."""

    name: str

    def open(self, run_id: str | None, run_name: str, params: Mapping[str, str]) -> str:
        """Starts a new tracker run (`run_id` None; `params` logged) or continues the run
        `run_id` (params already there). Returns the run's id."""
        ...

    def last_steps(self, keys: list[str]) -> dict[str, int]:
        """The last step of each metric of `keys` the tracker run already holds ({} when
        it cannot tell): a kill between a delivery and its note in RUN/trackers.json
        must not make the resume send that step again."""
        ...

    def metrics(self, step: int, values: Mapping[str, float]) -> None: ...

    def artifact(self, name: str, data: bytes) -> None:
        """Uploads `data` as the run's file `name` ("samples/x.png": folders by "/")."""
        ...

    def close(self, ok: bool) -> None: ...


class MlflowBackend:
    """MLflow through its REST client (`mlflow-skinny` is enough): the server at
    MLFLOW_TRACKING_URI. Requests are retried at most twice with a 10 s timeout unless
    the environment says otherwise (MLflow's own default retries for minutes)."""

    name = "mlflow"

    def __init__(self):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow import MlflowClient

        self._client = MlflowClient()
        self._run_id = ""

    def open(self, run_id: str | None, run_name: str, params: Mapping[str, str]) -> str:
        from mlflow.entities import Param

        client = self._client
        if run_id:
            client.update_run(run_id, status="RUNNING")
            self._run_id = run_id
            return run_id
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        exp_id = experiment.experiment_id if experiment else client.create_experiment(name)
        self._run_id = client.create_run(exp_id, run_name=run_name).info.run_id
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 params
            client.log_batch(self._run_id, params=items[i : i + 100])
        return self._run_id

    def last_steps(self, keys: list[str]) -> dict[str, int]:
        out = {}
        for key in keys:  # one request per metric, once per resume
            history = self._client.get_metric_history(self._run_id, key)
            if history:
                out[key] = max(m.step for m in history)
        return out

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, int(step)) for k, v in values.items()]
        for i in range(0, len(rows), 1000):  # and at most 1000 metrics
            self._client.log_batch(self._run_id, metrics=rows[i : i + 1000])

    def artifact(self, name: str, data: bytes) -> None:
        with tempfile.TemporaryDirectory(prefix="jaxspeech-mlflow-") as tmp:
            path = os.path.join(tmp, os.path.basename(name))
            with open(path, "wb") as f:
                f.write(data)
            folder = os.path.dirname(name)
            self._client.log_artifact(self._run_id, path, artifact_path=folder or None)

    def close(self, ok: bool) -> None:
        if self._run_id:
            self._client.set_terminated(self._run_id, "FINISHED" if ok else "KILLED")


class WandbBackend:
    """Weights & Biases (`wandb`): online with WANDB_API_KEY, or WANDB_MODE=offline (files
    under WANDB_DIR, else the run directory's wandb/, for `wandb sync`). No console
    capture, system statistics or code saving: only what the run reports."""

    name = "wandb"

    def __init__(self, workdir: str):
        import wandb

        self._wandb = wandb
        self._dir = os.environ.get("WANDB_DIR") or workdir
        self._run = None

    def open(self, run_id: str | None, run_name: str, params: Mapping[str, str]) -> str:
        wandb = self._wandb
        settings = wandb.Settings(
            console="off",
            x_disable_stats=True,
            x_save_requirements=False,
            save_code=False,
            disable_git=True,
            silent=True,
        )
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or EXPERIMENT,
            id=run_id or None,
            resume="allow",
            name=run_name,
            config=None if run_id else dict(params),
            dir=self._dir,
            settings=settings,
            reinit="create_new",
        )
        return self._run.id

    def last_steps(self, keys: list[str]) -> dict[str, int]:
        return {}  # the W&B SDK itself refuses a step below the resumed run's current one

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log({k: float(v) for k, v in values.items()}, step=int(step))

    def artifact(self, name: str, data: bytes) -> None:
        # A file written into the run's own folder is uploaded as it is (no link to a
        # file that could change or go away before the upload).
        path = os.path.join(self._run.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        self._run.save(path, base_path=self._run.dir, policy="now")

    def close(self, ok: bool) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if ok else 1)
            self._run = None


def make_backend(name: str, workdir: str) -> Backend:
    """The backend called `name` (one of PACKAGES)."""
    if name == "mlflow":
        return MlflowBackend()
    if name == "wandb":
        return WandbBackend(workdir)
    raise ValueError(f"unknown tracker {name!r}")
