"""Commands that an input format names as audio sources, run without a shell.

Two formats define them: Kaldi's ``wav.scp`` (``command |``) and Lhotse's ``command``
source. Their readers give such an item's ``audio_path`` as ``pipe:<command>`` with
``Item.pipe`` set; any other ``pipe:`` path (a NeMo or JSON-lines manifest's, a wav.scp
path without ``|``) is a file name and refused (``pipe_not_in_format``), and a command
runs only with ``--allow_pipes``.

A command is parsed into argument lists (``shlex``: quotes and backslashes as a POSIX
shell reads them) and its ``a | b | c`` stages are connected process to process, so
nothing in it is read by a shell. What only a shell could do is refused
(``pipe_shell_syntax``): command lists and background jobs (``;``, ``&``, ``&&``,
``||``), redirections, subshells, substitutions (backticks, ``$(...)``, ``$VAR``), globs,
``~``, comments and variable assignments. Kaldi recipes' usual lines (``flac -c -d -s
x.flac |``, ``sox x.wav -t wav - |``, ``sph2pipe -f wav -p -c 1 x.sph |``) are plain
pipelines. The programs a command names still run: ``--allow_pipes`` is for data one
trusts.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import tempfile

PIPE_PREFIX = "pipe:"

# Skip reasons (keys of prep_report.json["skipped"]).
PIPE_NOT_IN_FORMAT = "pipe_not_in_format"  # a pipe: path where the format's paths are files
PIPE_SHELL_SYNTAX = "pipe_shell_syntax"  # a command only a shell could run

# Unquoted characters that mean shell syntax, and what they would do there.
_SHELL = {
    ";": "';' (a list of commands)",
    "&": "'&' (a background job or '&&')",
    "<": "a redirection '<'",
    ">": "a redirection '>'",
    "(": "a subshell '('",
    ")": "a subshell ')'",
    "`": "a command substitution '`'",
    "$": "a substitution '$' (a variable or '$(...)')",
    "\n": "a second line (a second command)",
    "\r": "a carriage return",
    "*": "a glob '*'",
    "?": "a glob '?'",
    "[": "a glob '['",
}
_WORD_START = {"#": "a comment '#'", "~": "a home directory '~'"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _stage_texts(command: str) -> list[str]:
    """``command`` cut at its unquoted ``|`` (quotes and backslashes read as sh does).

    Raises:
      ValueError: shell syntax outside single quotes (see _SHELL), or a NUL byte.
    """
    if "\x00" in command:
        raise ValueError("a NUL byte")
    stages, start, quote, i = [], 0, None, 0
    word_start = True
    while i < len(command):
        c = command[i]
        if quote == "'":  # nothing is special up to the closing quote
            quote = None if c == "'" else quote
        elif quote == '"':
            if c == "\\" and command[i + 1 : i + 2] not in ("$", "`"):  # those: refused next
                i += 1
            elif c == '"':
                quote = None
            elif c in "$`":  # a shell substitutes these inside double quotes too
                raise ValueError(f"{_SHELL[c]} inside double quotes")
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "|":
            if command[i + 1 : i + 2] == "|":
                raise ValueError("'||' (a list of commands)")
            stages.append(command[start:i])
            start = i + 1
        elif c in _SHELL:
            raise ValueError(_SHELL[c])
        elif word_start and c in _WORD_START:
            raise ValueError(_WORD_START[c])
        word_start = quote is None and c in " \t|"
        i += 1
    stages.append(command[start:])
    return stages


def parse_pipeline(command: str) -> list[list[str]]:
    """A command (``a x | b 'y z'``) -> the argument list of each stage
    (``[["a", "x"], ["b", "y z"]]``).

    Raises:
      ValueError: shell syntax an argument list cannot express, unbalanced quotes, or an
        empty stage; the message says which.
    """
    stages = []
    for text in _stage_texts(command):
        try:
            words = shlex.split(text, comments=False, posix=True)
        except ValueError as e:  # "No closing quotation", "No escaped character"
            raise ValueError(f"unbalanced quoting ({e})") from None
        if not words:
            raise ValueError("an empty command in the pipeline")
        if _ASSIGNMENT.match(words[0]):
            raise ValueError(f"a variable assignment {words[0]!r}")
        stages.append(words)
    return stages


class PipelineError(Exception):
    """A pipeline that did not run to a clean end: one line saying why."""


def run_pipeline(stages: list[list[str]], timeout_s: float) -> bytes:
    """Runs ``stages`` with each one's stdout the next one's stdin (stdin of the first:
    nothing) and returns the last one's stdout.

    The processes share one new process group, killed whole on timeout (a stage's own
    children too). A stage that a later one stopped reading from ends by SIGPIPE, as in a
    shell pipeline; that is not a failure.

    Raises:
      PipelineError: a program that cannot be started, a stage that exited non-zero or was
        killed (the stderr tail in the message), or the timeout.
    """
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryFile() as stderr:
        try:
            source = subprocess.DEVNULL
            for argv in stages:
                group = procs[0].pid if procs else 0
                proc = subprocess.Popen(
                    argv, stdin=source, stdout=subprocess.PIPE, stderr=stderr, process_group=group
                )
                if procs:
                    source.close()  # the next stage's copy is the reader: EOF, SIGPIPE work
                procs.append(proc)
                source = proc.stdout
        except OSError as e:
            _kill(procs)
            raise PipelineError(f"cannot run {argv[0]!r}: {e.strerror or e}") from e
        try:
            stdout, _ = procs[-1].communicate(timeout=timeout_s)
            for proc in procs[:-1]:
                proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            _kill(procs)
            raise PipelineError(f"timed out after {timeout_s} s") from e
        for i, (argv, proc) in enumerate(zip(stages, procs)):
            code = proc.returncode
            if code == 0 or (code == -signal.SIGPIPE and i < len(procs) - 1):
                continue
            stderr.seek(0)
            tail = stderr.read().decode("utf-8", "replace").strip()[-500:]
            status = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
            raise PipelineError(f"{shlex.join(argv)!r} {status}: {tail}")
    return stdout


def _kill(procs: list[subprocess.Popen]) -> None:
    """Kills the pipeline's process group and reaps its processes."""
    if procs:
        try:
            os.killpg(procs[0].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait()
