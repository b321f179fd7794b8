"""What every entry point does the same way: parse flags with config mistakes as one
line, answer `--help` with the tool's own flags (exit 0), keep known library warnings off
the console, join a multi-host job, turn failures into messages and exit codes, and the
decoding flags of the commands that decode a run. Only entry points import this module.

Exit codes: 2 a user mistake (`UserError`, bad command line), 3 training diverged,
4 a process of a multi-process job stopped (usually because a peer died), 5 storage
failed (disk full, quota, read-only or missing directory, I/O error: `jaxspeech.common.files`),
130 interrupted by Ctrl-C (one line, no traceback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterator

import jax
from absl import flags
from ml_collections import config_flags

from jaxspeech.common import files
from jaxspeech.common.errors import TrainingDiverged, UserError
from jaxspeech.config import sections
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import crash


def parse_flags(
    argv: list[str], fv: flags.FlagValues = flags.FLAGS, doc: str | None = None
) -> list[str]:
    """absl flag parsing with config mistakes (unknown key, bad value) as one clear line,
    `--help` answered by `exit_if_help` (usage `doc`, default: the __main__ module's
    docstring), and the known library warnings silenced (`quiet_library_warnings`)."""
    exit_if_help(argv, fv, doc)
    quiet_library_warnings()
    try:
        rest = fv(argv)
        if "config" in fv and fv.config is not None:
            fv.config.to_dict()  # the config file loads lazily: load it now
        return rest
    except (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
        # ml_collections nests the cause's traceback in the message: keep its last line.
        lines = [ln.strip() for ln in str(e).replace("\\n", "\n").splitlines() if ln.strip()]
        msg = " ".join(lines) if len(lines) <= 3 else lines[-1]
        msg = msg.replace("\\'", "'")
        if len(msg) > 1 and msg[0] == msg[-1] == "'":  # ml_collections quotes the whole
            msg = msg[1:-1]
        if isinstance(e, AttributeError | KeyError):
            msg = _unknown_config_key(str(e), argv) or msg
        print(f"error: bad command line: {msg}", file=sys.stderr)
        sys.exit(2)


def _unknown_config_key(error: str, argv: list[str]) -> str | None:
    """ml_collections names only the unknown part of a `--config.a.b` key, in quotes,
    maybe with a "Did you mean" line: name the override the user gave instead, or None
    when no `--config.` argument has that part (another cause)."""
    text = error.replace("\\n", "\n").replace("\\'", "'")
    name = re.search(r"'(\w+)'", text)
    if name is None:
        return None
    given = [
        a.split("=")[0].removeprefix("--config.")
        for a in argv
        if a.startswith("--config.") and name.group(1) in a.split("=")[0].split(".")[1:]
    ]
    if not given:
        return None
    task = _config_task(argv)
    section = given[0].partition(".")[0]
    if task in sections.TASKS and sections.foreign(task, [section]):
        return f"--config.{given[0]}: " + sections.not_read(task, [section])
    if sections.old_key_hint(given[0]):  # the flat layout's vocoder optimizer
        return f"--config.{given[0]}: " + sections.old_key_hint(given[0])
    hint = re.search(r'Did you mean "(\w+)"', text)
    return (
        f"unknown config key {given[0]}"
        + (f" (did you mean {hint.group(1)}?)" if hint else "")
        + "; python -m jaxspeech.train --config_help lists every key"
    )


def _config_task(argv: list[str]) -> str | None:
    """The config.task of the `--config FILE[:variant]` in `argv`, its overrides left
    out (None when there is none or it does not load: its own error says why)."""
    path = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
    if not path:
        return None
    try:
        config = config_flags.config_flags.ConfigFileFlagParser(name="config").parse(path)
        return str(config.task)
    except Exception:  # noqa: BLE001 - any failure: the caller's plain message stands
        return None


# ---------------------------------------------------------------- --help
HELP_ARGS = ("-h", "--help", "-?", "--helpshort")
# The project's modules: their flags are a tool's own (absl, grain, orbax, array_record
# define flags of their own in every process that imports them).
PROJECT_MODULES = ("jaxspeech.", "data_prep.")
# Titles of the shared flag sets a tool's --help lists after its own flags.
SHARED_FLAG_TITLES = {
    "jaxspeech.parallel.mesh": "multi-host flags",
    "jaxspeech.common.cli": "decoding flags",
}


def exit_if_help(
    argv: list[str], fv: flags.FlagValues = flags.FLAGS, doc: str | None = None
) -> None:
    """`--help` (-h, -?, --helpshort) prints `tool_help`, `--helpfull` the same plus the
    libraries' flags; both exit 0. absl's own `--help` exits 1 and lists only the flags
    defined in the __main__ module (not the multi-host or decoding ones); its --helpfull
    buries the tool's flags among absl's, grain's and orbax's. Arguments after `--` are not
    looked at (launch_local passes them to its children)."""
    args = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    full = "--helpfull" in args
    if full or any(a in HELP_ARGS for a in args):
        print(tool_help(fv, doc, full=full), flush=True)
        sys.exit(0)


def tool_help(
    fv: flags.FlagValues = flags.FLAGS, doc: str | None = None, full: bool = False
) -> str:
    """The usage `doc` (default: the __main__ module's docstring), the flags of the tool's
    own module, then the project's shared ones it defines (multi-host, decoding); `full`
    adds every library's flags."""
    if doc is None:
        doc = getattr(sys.modules.get("__main__"), "__doc__", None) or ""
    by_module = fv.flags_by_module_dict()
    main = sys.argv[0]  # absl files the __main__ module's flags under its path
    own = sorted(
        (m for m in by_module if m == main or m.startswith(PROJECT_MODULES)),
        key=lambda m: (m != main, m),
    )
    parts = [textwrap.dedent(doc).strip()]
    for module in own:
        title = "flags" if module == main else SHARED_FLAG_TITLES.get(module, module + " flags")
        parts.append(_flag_section(title, by_module[module], fv))
    libraries = sorted(set(by_module) - set(own))
    if full:
        parts += [_flag_section(f"{m} flags", by_module[m], fv) for m in libraries]
    elif libraries:
        parts.append("--helpfull also lists the flags of the libraries (absl, grain, orbax).")
    return "\n\n".join(p for p in parts if p)


def _flag_section(title: str, module_flags: list, fv: flags.FlagValues) -> str:
    lines, seen = [f"{title}:"], set()
    for flag in sorted(module_flags, key=lambda f: f.name):
        if flag.name in seen or flag.name not in fv or fv[flag.name] is not flag:
            continue  # listed twice (its short name), or deleted or redefined since
        seen.add(flag.name)
        name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
        text = f"{name}: {flag.help or ''}"
        if flag.default is not None and flag.default_as_str:
            default = flag.default_as_str.strip("'")  # absl quotes every default
            text += f" (default: {default})"
        lines.append(textwrap.fill(text, 92, initial_indent="  ", subsequent_indent="      "))
    return "\n".join(lines) if len(lines) > 1 else ""


# ---------------------------------------------------------------- library warnings
class _KnownLibraryNoise(logging.Filter):
    """Drops, by their text, the warnings libraries log on the normal path: Orbax says a
    checkpoint directory opened to read is read-only, which is how evaluate, transcribe,
    export and distill.targets open a run on purpose. Anything else passes."""

    ORBAX = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname or record.levelno > logging.WARNING:
            return True
        return not str(record.msg).startswith(self.ORBAX)


def quiet_library_warnings() -> None:
    """Install `_KnownLibraryNoise` on absl's logger (Orbax logs through absl), once."""
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _KnownLibraryNoise) for f in absl_logger.filters):
        absl_logger.addFilter(_KnownLibraryNoise())


def usage_error(message: str) -> None:
    """A command line that parsed but cannot run (missing or extra arguments): exit 2."""
    print(f"error: bad command line: {message}", file=sys.stderr)
    sys.exit(2)


class _OrbaxStorageErrors(logging.Filter):
    """Drops Orbax's logs of a storage failure in its background save threads (each with a
    traceback, once per thread and again when the save is finalized): the same exception
    reaches the main thread, where `run_job` reports it once, as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname or record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and files.storage_error(exc):
            return False
        return not files.storage_error(RuntimeError(record.getMessage()))


def quiet_background_errors() -> None:
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxStorageErrors) for f in absl_logger.filters):
        absl_logger.addFilter(_OrbaxStorageErrors())


def tool_name() -> str:
    """The running command's short name ("train", "evaluate", "prepare"): its module's."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or sys.argv[0] or "jaxspeech"
    return crash.command_name() or os.path.splitext(os.path.basename(path))[0]


@contextlib.contextmanager
def interrupt_as_one_line(tool: str | None = None) -> Iterator[None]:
    """Ctrl-C (KeyboardInterrupt) inside ends the process with one line, `<tool>:
    interrupted`, and exit code 130, without a traceback. It leaves at once (`os._exit`):
    an orderly interpreter shutdown would let background thread pools (Orbax's, Grain's)
    print their own tracebacks. For commands that write nothing a later run needs; the
    trainer saves first (`jaxspeech.runs.checkpoint.Preemption`)."""
    try:
        yield
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"{tool or tool_name()}: interrupted", file=sys.stderr, flush=True)
        os._exit(130)


def run_job(fn: Callable[[], object]) -> None:
    """Join the multi-host job (flags or cluster detection), then run `fn`; failures end
    the process with one clear message and the exit codes above, a Ctrl-C with one line
    (`interrupt_as_one_line`)."""
    quiet_background_errors()
    with interrupt_as_one_line():
        _run_job(fn)


def _run_job(fn: Callable[[], object]) -> None:
    try:
        try:
            how = mesh_lib.initialize()  # before anything touches a device
        except mesh_lib.DistributedConfigError as e:
            raise UserError(str(e)) from e
        if how != "single":  # every process says it joined
            print(
                f"jax.distributed: process {jax.process_index()} of {jax.process_count()} "
                f"({how}), pid {os.getpid()}",
                flush=True,
            )
        fn()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except TrainingDiverged as e:
        print(f"error: training diverged: {e}", file=sys.stderr)
        sys.exit(3)
    except Exception as e:
        storage = files.storage_error(e)
        if storage:  # a full disk, a read-only or vanished directory: not a bug to trace
            print(
                f"error: storage: {storage} (files are written whole or not at all: a "
                "run resumes from its last committed checkpoint once this is fixed)",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            if jax.process_count() > 1:
                os._exit(5)  # peers may wait in a collective: skip the shutdown barrier
            sys.exit(5)
        if jax.process_count() == 1:
            raise
        # In a multi-process job the usual cause is a peer that died: its collectives fail
        # here (or the heartbeat times out). Say so, and leave at once: JAX's shutdown
        # barrier would otherwise wait for the dead peer until the heartbeat timeout.
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:400]
        print(
            f"error: process {jax.process_index()} of {jax.process_count()} stopped: "
            f"{type(e).__name__}: {first}\n(if another process died or was killed, this is "
            "how the others stop: see its log; the job resumes from the last checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(4)


def define_decoding_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """The decoding flags of the commands that decode a run (evaluate, transcribe); each
    defaults to the run's config.decoding."""
    from jaxspeech.decoding import search  # here: status and launch_local need no decoders

    flags.DEFINE_enum(
        "method",
        None,
        list(search.DECODERS),
        "Decoder (default: the run's decoding.method).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "beam",
        None,
        "Beam size of ctc_beam / rnnt_beam / aed_beam / aed_rescore (default: the run's).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "ctc_weight",
        None,
        "aed_beam / aed_rescore: the CTC score's weight beside the attention decoder's "
        "(-1: 0.3 with a CTC head, 0 without; default: the run's decoding.ctc_weight).",
        flag_values=fv,
    )
    flags.DEFINE_bool(
        "length_norm",
        None,
        "aed_beam: rank ended hypotheses by score / (labels + 1) (default: the run's).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "eos_threshold",
        None,
        "aed_beam: <eos> only where its log-prob >= this x the best other label's; 0 = "
        "always (default: the run's decoding.eos_threshold).",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "lm",
        None,
        "ARPA/KenLM n-gram LM fused into the beam searches (python -m data_prep.lm); "
        "'' for none (default: the run's decoding.lm_path).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "lm_weight", None, "LM weight (default: the run's decoding.lm_weight).", flag_values=fv
    )
    flags.DEFINE_float(
        "word_bonus",
        None,
        "Score added per word with an LM (default: the run's decoding.word_bonus).",
        flag_values=fv,
    )
    flags.DEFINE_bool(
        "streaming",
        None,
        "Decode chunk by chunk through the model's stream functions (a streaming "
        "Conformer; default: the run's decoding.streaming).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "chunk_size",
        None,
        "Attention chunk (encoder frames) to decode a chunked Conformer with, e.g. one "
        "trained with dynamic chunks (0: full context; default: the run's).",
        flag_values=fv,
    )


def decoding_overrides(fv: flags.FlagValues = flags.FLAGS) -> dict:
    """The decoding flags as `jaxspeech.evaluation.run.run_eval_config`'s `decoding`
    overrides (None: the run's)."""
    return {
        "lm_path": fv.lm,
        "lm_weight": fv.lm_weight,
        "word_bonus": fv.word_bonus,
        "streaming": fv.streaming,
        "chunk_size": fv.chunk_size,
        "ctc_weight": fv.ctc_weight,
        "length_norm": fv.length_norm,
        "eos_threshold": fv.eos_threshold,
    }
