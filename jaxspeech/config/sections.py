"""Which config sections each task reads, and runs saved in the older, flat layout.

A config holds the shared sections (`SHARED`: what the trainer, the loaders, the front
end, the optimizer, the mesh and the sync strategy read for every task) plus those of its
task (`TASK_SECTIONS`): a vocoder run carries no recognizer keys. `defaults.get_config(
task=...)` builds that layout; `jaxspeech.config.validate` and `--config_help` look at it
only.

Runs saved before this split carry every section (config.json, checkpoint metadata):
`per_task(config)` turns such a config into its task's layout (its foreign sections
dropped, the vocoder's optimizer keys moved into `optim` / `optim2`, the compute dtype of
a synthesizer or vocoder moved from `model.dtype` into its section), and everything that
reads a saved run's config does so through it (`jaxspeech.runs.loading.load_run_config`).
Everything that reads a key of a saved config with `defaults.lookup` tolerates a foreign
section as it is: it reads only the keys it needs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from ml_collections import ConfigDict

TASKS = ("asr", "tts", "vocoder")
# Top-level sections and keys every task reads (jaxspeech.training.trainer, .state, the
# loaders' settings in config.data, the front end, the optimizer, the mesh, sync).
SHARED = (
    "seed",
    "task",
    "init_from",
    "data",
    "features",
    "optim",
    "train",
    "monitor",
    "mesh",
    "sync",
)
# What each task reads besides: the recognizer its model, losses, decoding, augmentation,
# distillation and pipeline stages; the synthesizer config.tts; the vocoder config.vocoder
# and its discriminators' optimizer (`optim2`, shaped as `optim`: ESPnet's GAN tasks').
TASK_SECTIONS: dict[str, tuple[str, ...]] = {
    "asr": (
        "specaug",
        "waveform_aug",
        "model",
        "loss",
        "decoding",
        "scoring",
        "distill",
        "pipeline",
    ),
    "tts": ("tts",),
    "vocoder": ("vocoder", "optim2"),
}
# Where each task's compute dtype lives (float32 | bfloat16).
DTYPE_KEYS = {"asr": "model.dtype", "tts": "tts.dtype", "vocoder": "vocoder.dtype"}
# The flat layout's vocoder optimizer keys -> their key in optim and optim2.
OLD_VOCODER_OPTIM = {
    "learning_rate": "peak_lr",
    "b1": "b1",
    "b2": "b2",
    "weight_decay": "weight_decay",
    "lr_decay": "decay_rate",
    "lr_decay_steps": "decay_steps",
}
# What the flat layout's vocoder optimizers were besides those keys (and its defaults of
# them): optax.adamw with no warm-up, no clipping, weight decay on every parameter.
_OLD_VOCODER_OPTIMIZER = {
    "name": "adamw",
    "peak_lr": 2e-4,
    "warmup_steps": 0,
    "decay": "exponential",
    "end_lr_ratio": 0.02,  # (unused by an exponential decay)
    "decay_rate": 0.999,
    "decay_steps": 820,
    "b1": 0.8,
    "b2": 0.99,
    "eps": 1e-8,
    "weight_decay": 0.01,
    "weight_decay_mask": "all",
    "clip_norm": 0.0,
}


def sections(task: str) -> tuple[str, ...]:
    """The top-level sections and keys a run of `task` carries: the shared ones, then
    the task's own.

    Raises:
      ValueError: an unknown task.
    """
    if task not in TASK_SECTIONS:
        raise ValueError(f"unknown config.task {task!r}; choose one of {', '.join(TASKS)}")
    return SHARED + TASK_SECTIONS[task]


def owners(section: str) -> tuple[str, ...]:
    """The tasks that read the top-level `section` (every task for a shared one; none
    for a name no task reads)."""
    if section in SHARED:
        return TASKS
    return tuple(t for t in TASKS if section in TASK_SECTIONS[t])


def foreign(task: str, names) -> list[str]:
    """The top-level `names` that another task reads and `task` does not, in order."""
    own = set(sections(task))
    return [n for n in names if n not in own and owners(n)]


def not_read(task: str, names: list[str]) -> str:
    """The one line for sections of another task in a config (or an override) of `task`:
    "config.model is not read by a vocoder run (config.task=vocoder)"."""
    listed = ", ".join(f"config.{n}" for n in names)
    verb = "is" if len(names) == 1 else "are"
    extra = ""
    if "model" in names and task in ("tts", "vocoder"):  # model.dtype's place there
        extra = f"; its compute dtype is config.{DTYPE_KEYS[task]}"
    return f"{listed} {verb} not read by {_a(task)} run (config.task={task}){extra}"


def not_there(task: str, names: list[str]) -> str:
    """The one line for sections of `task` a config lacks."""
    listed = ", ".join(f"config.{n}" for n in names)
    verb = "is" if len(names) == 1 else "are"
    return f"{listed} {verb} missing ({_a(task)} run reads them)"


def _a(task: str) -> str:
    return ("an " if task[:1] in "aeiou" else "a ") + task


def old_key_hint(key: str) -> str | None:
    """Where a key of the flat layout's vocoder optimizer went ("vocoder.learning_rate"),
    or None for any other key."""
    section, _, name = key.partition(".")
    if section == "vocoder" and name in OLD_VOCODER_OPTIM:
        new = OLD_VOCODER_OPTIM[name]
        return (
            f"{key} is now optim.{new} and optim2.{new} (the generator's and the "
            "discriminators' optimizers)"
        )
    return None


def task_of(config: Mapping | None) -> str:
    """The task whose defaults `config` reads (the recognizer's for an unknown one)."""
    task = config.get("task", "asr") if config is not None else "asr"
    return task if task in TASK_SECTIONS else "asr"


def fill(node, default: Mapping) -> None:
    """Add to the ConfigDict `node`, in place, every key of `default` it lacks (nested)."""
    for key, value in default.items():
        if key not in node:
            node[key] = ConfigDict(value) if isinstance(value, Mapping) else copy.deepcopy(value)
        elif isinstance(value, Mapping) and isinstance(node[key], ConfigDict):
            fill(node[key], value)


def per_task(config: Mapping) -> dict:
    """`config` (a saved run's dict, of either layout) as a dict of its task's layout: the
    sections of other tasks dropped; a flat-layout vocoder's `vocoder.learning_rate`, `b1`,
    `b2`, `weight_decay`, `lr_decay`, `lr_decay_steps` become its `optim` and `optim2`
    (the optimizers it trained with); a synthesizer's or vocoder's `model.dtype` becomes
    `tts.dtype` / `vocoder.dtype`. A config already in its task's layout comes back
    equal; keys missing from it stay missing (`defaults.lookup` reads their defaults)."""
    out = copy.deepcopy(dict(config))
    task = out.get("task", "asr")
    if task not in TASK_SECTIONS:
        return out  # validation names the task; nothing to move
    dtype = (out.get("model") or {}).get("dtype")
    if task in ("tts", "vocoder") and dtype is not None and task in out:
        out[task] = dict(out[task])
        out[task].setdefault("dtype", dtype)
    if task == "vocoder" and "vocoder" in out:
        vocoder = dict(out["vocoder"])
        if any(k in vocoder for k in OLD_VOCODER_OPTIM):
            optimizer = dict(_OLD_VOCODER_OPTIMIZER)
            for old, new in OLD_VOCODER_OPTIM.items():
                if old in vocoder:
                    optimizer[new] = vocoder.pop(old)
            out["optim"], out["optim2"] = optimizer, dict(optimizer)
        out["vocoder"] = vocoder
    for name in foreign(task, list(out)):
        del out[name]
    return out
