"""A progress line for one long file being transcribed: a bar, audio seconds done of the
total, percent and speed (times real time), on a stream of its own (stderr), so that the
transcripts on stdout stay as they are.

On a terminal the line is redrawn in place (`\\r`); elsewhere (a log file, a pipe) it is
written as plain lines, one at every tenth of the file and at least every `every_s`
seconds, so a log shows that a long job is alive without filling up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

BAR = 20  # characters of the bar


class FileProgress:
    """The progress of transcribing `name`, `total_s` seconds of audio (from the file's
    header: known before decoding starts), written to `stream`.

    `update(done_s)` as the audio gets done, `close()` once at the end (also after a
    failure: a terminal's line is ended, so what follows starts on a line of its own).
    `unit` other than "s": a count of things instead (`tts.synthesis`: sentences).
    """

    def __init__(
        self,
        name: str,
        total_s: float,
        stream: TextIO,
        *,
        tty: bool,
        every_s: float = 10.0,
        redraw_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "s",
    ):
        self.name, self.total_s, self.stream, self.tty = name, max(total_s, 1e-9), stream, tty
        self.unit = unit  # "s": seconds of audio; else a count ("sentences") and its rate
        self.every_s, self.redraw_s, self.clock = every_s, redraw_s, clock
        self.t0 = clock()
        self.last_write = -float("inf")
        self.tenth = -1  # the last tenth of the file a plain line was written at
        self.width = 0  # of the line on the terminal, to blank a longer old one
        self.done_s, self.written_s = 0.0, None  # done, and done at the last line written
        self.update(0.0)  # at once: the total is known before anything is decoded

    def line(self) -> str:
        """`name [#####.....] 61.2/7200.0 s  1%  35.1x real time` (another unit:
        `name [##........] 12/96 sentences  12%  1.5 sentences/s`)."""
        frac = min(1.0, self.done_s / self.total_s)
        filled = int(frac * BAR)
        elapsed = self.clock() - self.t0
        seconds = self.unit == "s"
        rate = self.done_s / elapsed if self.done_s and elapsed > 0 else None
        speed = "-" if rate is None else f"{rate:.1f}x real time"
        done = f"{self.done_s:.1f}/{self.total_s:.1f} s"
        if not seconds:
            speed = "-" if rate is None else f"{rate:.1f} {self.unit}/s"
            done = f"{self.done_s:.0f}/{self.total_s:.0f} {self.unit}"
        return (
            f"{self.name} [{'#' * filled}{'.' * (BAR - filled)}] {done} {100 * frac:3.0f}% {speed}"
        )

    def update(self, done_s: float, final: bool = False) -> None:
        """Record `done_s` seconds of audio done; write the line if it is time to."""
        self.done_s = done_s
        now = self.clock()
        if self.tty:
            if final or now - self.last_write >= self.redraw_s:
                text = self.line()
                self.stream.write("\r" + text.ljust(self.width) + ("\n" if final else ""))
                self.width, self.last_write = len(text), now
                self.stream.flush()
            return
        tenth = int(10 * min(1.0, done_s / self.total_s))
        due = tenth > self.tenth or now - self.last_write >= self.every_s
        if (due or final) and done_s != self.written_s:  # no line twice
            self.stream.write(self.line() + "\n")
            self.tenth, self.last_write, self.written_s = tenth, now, done_s
            self.stream.flush()

    def close(self) -> None:
        """The last line (on a terminal: ended by a newline)."""
        self.update(self.done_s, final=True)
