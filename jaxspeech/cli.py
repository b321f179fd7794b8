"""What every entry point does the same way: parse flags with config mistakes as one
line, join a multi-host job, turn failures into messages and exit codes, and the decoding
flags of the commands that decode a run. Only entry points import this module.

Exit codes: 2 a user mistake (`UserError`, bad command line), 3 training diverged,
4 a process of a multi-process job stopped (usually because a peer died).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import jax
from absl import flags

from jaxspeech.decoding import search
from jaxspeech.errors import TrainingDiverged, UserError
from jaxspeech.parallel import mesh as mesh_lib


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with config mistakes (unknown key, bad value) as one clear line."""
    try:
        rest = flags.FLAGS(argv)
        if "config" in flags.FLAGS and flags.FLAGS.config is not None:
            flags.FLAGS.config.to_dict()  # the config file loads lazily: load it now
        return rest
    except (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
        # ml_collections nests the cause's traceback in the message: keep its last line.
        lines = [ln.strip() for ln in str(e).replace("\\n", "\n").splitlines() if ln.strip()]
        msg = " ".join(lines) if len(lines) <= 3 else lines[-1]
        msg = msg.replace("\\'", "'").strip("'")
        print(f"error: bad command line: {msg}", file=sys.stderr)
        sys.exit(2)


def usage_error(message: str) -> None:
    """A command line that parsed but cannot run (missing or extra arguments): exit 2."""
    print(f"error: bad command line: {message}", file=sys.stderr)
    sys.exit(2)


def run_job(fn: Callable[[], object]) -> None:
    """Join the multi-host job (flags or cluster detection), then run `fn`; failures end
    the process with one clear message and the exit codes above."""
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
    flags.DEFINE_enum(
        "method",
        None,
        list(search.DECODERS),
        "Decoder (default: the run's decoding.method).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "beam", None, "Beam size of ctc_beam / rnnt_beam (default: the run's).", flag_values=fv
    )
    flags.DEFINE_string(
        "lm",
        None,
        "ARPA/KenLM n-gram LM fused into ctc_beam / rnnt_beam (python -m data_prep.lm); "
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
    }
