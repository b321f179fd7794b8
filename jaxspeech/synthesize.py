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

`--gta_split SPLIT --output FILE.npz [--data DIR] [--gta_max_utterances N]` (with
--workdir): instead of text, the run's teacher-forced log-mel of a prepared split, aligned
frame for frame with its recordings, for a vocoder to learn from (`config.vocoder.gta_mels`;
`jaxspeech.tts.gta`). The last stdout line is then the store's manifest as JSON.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags, logging

from jaxspeech.common import cli
from jaxspeech.tts import frontend, gta, synthesis

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
    flags.DEFINE_string(
        "gta_split",
        None,
        "Write the run's ground-truth-aligned (teacher-forced) log-mel of this prepared "
        "split to --output FILE.npz, for config.vocoder.gta_mels, instead of speaking text.",
        **define,
    )
    flags.DEFINE_string(
        "data", None, "--gta_split's prepared data directory (default: the run's).", **define
    )
    flags.DEFINE_integer(
        "gta_max_utterances",
        0,
        "--gta_split: N of its utterances, spread evenly (0: all).",
        **define,
    )


def main(argv: list[str], fv: flags.FlagValues = FLAGS) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if (fv.workdir is None) == (fv.artifact is None):
        cli.usage_error("give --workdir TTS_RUN or --artifact DIR (one of them)")
    if fv.gta_split is not None:
        return gta_main(fv)
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


def gta_main(fv: flags.FlagValues) -> None:
    """--gta_split: the run's ground-truth-aligned frames of a split into --output."""
    if fv.workdir is None or fv.output is None:
        cli.usage_error("--gta_split needs --workdir TTS_RUN and --output FILE.npz")
    given = [f"--{n}" for n in ("text", "text_file", "speaker", "vocoder_workdir") if fv[n].value]
    if given:
        cli.usage_error(f"--gta_split writes a split's frames: drop {', '.join(given)}")

    def job() -> None:
        manifest = gta.write_gta_mels(
            fv.workdir,
            fv.gta_split,
            fv.output,
            data_dir=fv.data,
            step=fv.step,
            max_utterances=fv.gta_max_utterances,
            progress=sys.stderr if fv.progress else None,
        )
        print(
            f"wrote the ground-truth-aligned log-mel of {manifest['utterances']} utterances "
            f"of {manifest['split']} ({len(manifest['skipped'])} left out) in "
            f"{manifest['seconds']:.0f} s: {fv.output}",
            file=sys.stderr,
        )
        print(json.dumps(manifest), flush=True)

    cli.run_job(job)


if __name__ == "__main__":
    define_flags()
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
