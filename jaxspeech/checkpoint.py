"""Orbax checkpoints: model variables, optimizer state, step and each process's data iterator.

Items of one checkpoint step:
  model      {"params": ..., "model_vars": ...}   (all evaluation and export need)
  train      {"opt_state": ..., "step": int}
  data_iter  the Grain iterator state of every process
The resolved config is written next to the checkpoints (`<workdir>/config.json`).
Arrays are restored straight into the shardings of the current mesh by giving
Orbax abstract targets that carry them.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

MODEL, TRAIN, DATA_ITER = "model", "train", "data_iter"


def abstract_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of `tree`'s leaves carrying `shardings` (a matching tree)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` with the item layout above."""

    def __init__(self, workdir: str, *, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
            ),
            item_names=(MODEL, TRAIN, DATA_ITER),
            item_handlers={
                MODEL: ocp.StandardCheckpointHandler(),
                TRAIN: ocp.StandardCheckpointHandler(),
                DATA_ITER: grain.checkpoint.CheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(
        self,
        step: int,
        *,
        model: dict,
        train: dict,
        data_iter: grain.DatasetIterator,
        force: bool = False,
    ) -> bool:
        """Start an (asynchronous) save of step; returns whether a save was started."""
        return self.manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    MODEL: ocp.args.StandardSave(model),
                    TRAIN: ocp.args.StandardSave(train),
                    DATA_ITER: grain.checkpoint.CheckpointSave(data_iter),
                }
            ),
            force=force,
        )

    def restore(
        self,
        step: int,
        *,
        abstract_model: dict,
        abstract_train: dict | None = None,
        data_iter: grain.DatasetIterator | None = None,
    ) -> dict:
        """Restore the requested items of `step` (the data iterator is restored in place)."""
        args = {MODEL: ocp.args.StandardRestore(abstract_model)}
        if abstract_train is not None:
            args[TRAIN] = ocp.args.StandardRestore(abstract_train)
        if data_iter is not None:
            args[DATA_ITER] = grain.checkpoint.CheckpointRestore(data_iter)
        return dict(self.manager.restore(step, args=ocp.args.Composite(**args)).items())

    def wait(self) -> None:
        """Block until pending asynchronous saves are committed."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
