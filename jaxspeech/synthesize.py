"""Speak text with a trained synthesizer:
`python -m jaxspeech.synthesize --workdir TTS_RUN [--vocoder_workdir VOCODER_RUN]
(--text "..." | --text_file FILE) --speaker NAME_OR_ID --output out.wav|DIR
[--duration_scale F] [--step N]`, or `--artifact DIR` (an export of a synthesizer's run,
`python -m jaxspeech.export`) in place of --workdir.

The text is written out and phonemized as the corpus was (espeak-ng in the speaker's
voice, `jaxspeech.tts.frontend`; `--front_end phonemes`: the text is space-separated
phonemes of the run's table), spoken by the run's FastSpeech2 (or the artifact's
exported acoustic model) and vocoded by Griffin-Lim, or by a neural vocoder: the vocoder
run's (`--vocoder_workdir`) or the artifact's own (`--vocoder griffin_lim`: Griffin-Lim
anyway). `--text` with a .wav `--output` writes that file; `--text_file` (one sentence
per line; blank lines skipped) writes DIR/0001.wav, ... (numbered by line) and
DIR/manifest.jsonl naming each file's sentence, with a progress line on stderr for ten
sentences or more. An unknown speaker, empty text, a character or phoneme the front end
cannot give, or a sentence too long for the model's max_frames is one line, exit 2,
before anything is written (`jaxspeech.tts.synthesis`). The last stdout line is JSON
{"files", "manifest", "sentences", "seconds", "vocoder"}.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags, logging

from jaxspeech.common import cli
from jaxspeech.tts import frontend, synthesis

FLAGS = flags.FLAGS
VOCODERS = ("auto", "griffin_lim")


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
    """This command's flags (on `fv`: tests parse a fresh set)."""
    define = dict(flag_values=fv)
    flags.DEFINE_string(
        "workdir", None, "A synthesizer's run directory (config.task=tts).", **define
    )
    flags.DEFINE_string(
        "artifact",
        None,
        "An exported synthesizer (jaxspeech.export) instead of --workdir.",
        **define,
    )
    flags.DEFINE_integer("step", None, "--workdir's checkpoint step (default: latest).", **define)
    flags.DEFINE_string(
        "vocoder_workdir",
        None,
        "A vocoder run (configs/vocoder.py) on the synthesizer's front end (default: "
        "Griffin-Lim, or the artifact's own vocoder).",
        **define,
    )
    flags.DEFINE_enum(
        "vocoder", "auto", VOCODERS, "auto: the neural vocoder when there is one.", **define
    )
    flags.DEFINE_string("text", None, "One sentence to speak.", **define)
    flags.DEFINE_string("text_file", None, "A UTF-8 file of sentences, one per line.", **define)
    flags.DEFINE_string(
        "speaker", None, "A speaker of the run's table: its name or id (row).", **define
    )
    flags.DEFINE_string(
        "output", None, "A .wav file (one sentence) or a directory for the files.", **define
    )
    flags.DEFINE_float(
        "duration_scale", 1.0, "Multiplies the predicted durations (> 1: slower).", **define
    )
    flags.DEFINE_enum(
        "front_end",
        "espeak",
        list(frontend.FRONT_ENDS),
        "espeak: text phonemized as the demo corpus (espeak-ng); phonemes: the text is "
        "space-separated phonemes of the run's table.",
        **define,
    )
    flags.DEFINE_string(
        "voice",
        None,
        "espeak-ng voice to phonemize with (default: the speaker's own in the demo corpus, "
        f"else {frontend.DEFAULT_VOICE}).",
        **define,
    )
    flags.DEFINE_bool("progress", True, "A progress line on stderr for many sentences.", **define)


def main(argv: list[str], fv: flags.FlagValues = FLAGS) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if (fv.workdir is None) == (fv.artifact is None):
        cli.usage_error("give --workdir TTS_RUN or --artifact DIR (one of them)")
    if fv.artifact is not None and (fv.vocoder_workdir is not None or fv.step is not None):
        cli.usage_error("--vocoder_workdir and --step go with --workdir, not --artifact")
    for name in ("speaker", "output"):
        if fv[name].value is None:
            cli.usage_error(f"--{name} is required")

    def job() -> None:
        lines, blank = synthesis.read_lines(fv.text, fv.text_file)
        if fv.artifact is not None:
            synth = synthesis.from_artifact(fv.artifact)
        else:
            synth = synthesis.from_run(fv.workdir, fv.step)
            if fv.vocoder_workdir is not None:
                synth = synthesis.with_vocoder_run(synth, fv.vocoder_workdir)
        result = synthesis.synthesize_to_files(
            synth,
            lines,
            fv.speaker,
            fv.output,
            duration_scale=fv.duration_scale,
            front_end=fv.front_end,
            voice=fv.voice,
            vocoder=fv.vocoder,
            progress=sys.stderr if fv.progress else None,
            tty=sys.stderr.isatty(),
        )
        where = result["manifest"] or result["files"][0]
        note = f"; {blank} blank line(s) skipped" if blank else ""
        print(
            f"synthesized {result['sentences']} sentence(s), {result['seconds']:.1f} s of "
            f"speech ({result['vocoder']}): {where}{note}",
            file=sys.stderr,
        )
        print(json.dumps(result | {"blank_lines": blank}), flush=True)

    cli.run_job(job)


if __name__ == "__main__":
    define_flags()
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
