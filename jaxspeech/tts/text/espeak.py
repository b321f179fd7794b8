"""Minimal ctypes wrapper around libespeak-ng (from the `espeakng-loader` wheel).

No root, no system package: the wheel ships `libespeak-ng.so` and `espeak-ng-data`. The
library keeps global state, so there is one `Espeak` per process (`Espeak.get()`); it runs
in synchronous mode, where `espeak_Synth` returns only after our callback has received
every sample.

    tts = Espeak.get()
    tts.set_voice("en-us", "m3")
    tts.set_prosody(rate=175, pitch=50, pitch_range=50)
    wav = tts.synthesize("Hello there.")   # (N,) int16 at tts.sample_rate (22,050 Hz)
    wav, phonemes = tts.synthesize_with_phonemes("Hello there.")
    # phonemes: [("h", 0.012), ("@", 0.063), ..., ("_:", 0.647), ("_", 0.654)]: espeak-ng
    # mnemonics and the second of wav each starts at

Phoneme events: the library is initialized with espeakINITIALIZE_PHONEME_EVENTS, so every
synthesis reports, besides its samples, an espeakEVENT_PHONEME per phoneme (its mnemonic,
e.g. "h", "'oU", "_:", and the output sample it starts at). Reporting them does not change
a single sample (checked on whole corpora against a build without them); `synthesize`
simply ignores them.

Determinism: for the same sequence of calls in a fresh process the output is bit-exact.
It is NOT independent of earlier calls in the same process: the wave generator carries
static state (pitch-flutter phase, glottal cycle, agc) from one utterance to the next that
the API cannot reset. Callers that need per-utterance reproducibility must fix the order
of calls per process (see `data_prep.demo.synth`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import numpy as np

# espeak_AUDIO_OUTPUT: synchronous playback through the synth callback.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
# espeakINITIALIZE_DONT_EXIT: return an error instead of calling exit() on bad data.
_INITIALIZE_DONT_EXIT = 0x8000
# espeakINITIALIZE_PHONEME_EVENTS: the synth callback also receives one event per phoneme.
_INITIALIZE_PHONEME_EVENTS = 0x0001
# espeak_EVENT_TYPE values we read (the others: WORD 1, SENTENCE 2, MARK 3, PLAY 4, END 5,
# MSG_TERMINATED 6, SAMPLERATE 8 are ignored).
_EVENT_LIST_TERMINATED, _EVENT_PHONEME = 0, 7
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
# espeak_PARAMETER
_RATE, _VOLUME, _PITCH, _RANGE = 1, 2, 3, 4
# espeak_ERROR
_EE_OK, _EE_NOT_FOUND = 0, 2

MIN_RATE, MAX_RATE = 80, 450  # words per minute accepted by espeak-ng

_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class EspeakError(RuntimeError):
    """libespeak-ng could not be loaded, or rejected a voice, parameter or text."""


class _EventId(ctypes.Union):
    """espeak_EVENT.id: a number (WORD, SENTENCE), a name (MARK, PLAY) or, for PHONEME, the
    mnemonic in 8 bytes of UTF-8 (NUL-terminated unless it needs all 8)."""

    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class Event(ctypes.Structure):
    """espeak_EVENT of speak_lib.h (API revision 12): 40 bytes on 64-bit, `id` at offset 32.

    audio_position is milliseconds from the start of the synthesis, truncated; sample is the
    same instant in output samples at the library's rate (audio_position == sample * 1000
    // rate, checked by the tests), so it is the one we time phonemes by.
    """

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


def phoneme_events(events: Any) -> list[tuple[str, int]]:
    """The phoneme events of one callback's event list, in list order.

    Args:
      events: the callback's espeak_EVENT array as a ctypes POINTER(Event) (or an Event
        array), terminated by an event of type 0; None or NULL: no events.

    Returns:
      [(mnemonic, start sample at the library's rate)]. The mnemonic is the id's bytes up to
      the first NUL (at most 8), as UTF-8 (undecodable bytes replaced).
    """
    out: list[tuple[str, int]] = []
    if not events:
        return out
    i = 0
    while events[i].type != _EVENT_LIST_TERMINATED:
        event = events[i]
        if event.type == _EVENT_PHONEME:
            # ctypes reads a char[8] up to its first NUL, or all 8 bytes when the name
            # fills them (no terminator then).
            name = event.id.string.decode("utf-8", errors="replace")
            out.append((name, int(event.sample)))
        i += 1
    return out


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


def _default_paths() -> tuple[str, str]:
    try:
        import espeakng_loader
    except ImportError as e:
        raise EspeakError(
            "the 'espeakng-loader' package is not installed; it provides libespeak-ng "
            "(pip install espeakng-loader)"
        ) from e
    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


def library_version(library_path: str | None = None) -> str:
    """Version of libespeak-ng (e.g. '1.52.0'), read without initializing the library."""
    library_path = library_path or _default_paths()[0]
    try:
        lib = ctypes.CDLL(library_path)
    except OSError as e:
        raise EspeakError(f"cannot load libespeak-ng from {library_path}: {e}") from e
    lib.espeak_Info.argtypes = [ctypes.c_void_p]
    lib.espeak_Info.restype = ctypes.c_char_p
    return lib.espeak_Info(None).decode()


class Espeak:
    """One initialized libespeak-ng per process. Use `Espeak.get()`, not the constructor."""

    _instance: Espeak | None = None

    @classmethod
    def get(cls) -> Espeak:
        """The process-wide instance, initialized on first use."""
        if cls._instance is None or cls._instance._pid != os.getpid():
            cls._instance = cls()
        return cls._instance

    def __init__(self, library_path: str | None = None, data_path: str | None = None):
        if library_path is None or data_path is None:
            default_lib, default_data = _default_paths()
            library_path = library_path or default_lib
            data_path = data_path or default_data
        if not os.path.isfile(library_path):
            raise EspeakError(f"libespeak-ng not found at {library_path}")
        if not os.path.isdir(os.path.join(data_path, "voices")):
            raise EspeakError(f"espeak-ng data directory not found or incomplete: {data_path}")
        try:
            lib = ctypes.CDLL(library_path)
        except OSError as e:
            raise EspeakError(f"cannot load libespeak-ng from {library_path}: {e}") from e
        self._lib = lib
        self._pid = os.getpid()
        self.data_path = data_path
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]

        options = _INITIALIZE_DONT_EXIT | _INITIALIZE_PHONEME_EVENTS
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), options)
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed (code {rate}) with data at {data_path}")
        self.sample_rate: int = rate
        self.version: str = lib.espeak_Info(None).decode()
        self._chunks: list[np.ndarray] = []
        self._phonemes: list[tuple[str, int]] | None = None  # collected when not None
        # Keep a reference: ctypes callbacks are freed with their Python object.
        self._callback = _SYNTH_CALLBACK(self._on_samples)
        lib.espeak_SetSynthCallback(self._callback)
        self._voice: str | None = None
        self._variants = frozenset(os.listdir(os.path.join(data_path, "voices", "!v")))
        libc_name = ctypes.util.find_library("c")
        self._libc = ctypes.CDLL(libc_name) if libc_name else None

    def _on_samples(self, wav, num_samples, events) -> int:
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        if self._phonemes is not None and events:
            self._phonemes += phoneme_events(ctypes.cast(events, ctypes.POINTER(Event)))
        return 0  # 0 = continue synthesis

    def variants(self) -> list[str]:
        """Names of the voice variants in `espeak-ng-data/voices/!v` (m1, f2, klatt, ...)."""
        return sorted(self._variants)

    def voices(self) -> list[str]:
        """Language voice names espeak-ng knows (e.g. 'en-us', 'en-gb-x-rp'), sorted."""
        names = set()
        table = self._lib.espeak_ListVoices(None)
        i = 0
        while table[i]:
            ident = table[i].contents.identifier
            if ident:
                names.add(ident.decode().rsplit("/", 1)[-1].lower())
            i += 1
        return sorted(names)

    def set_voice(self, voice: str, variant: str | None = None) -> None:
        """Select a language voice (e.g. 'en-us') and optional variant (e.g. 'm3', 'f2').

        Raises EspeakError if either is unknown (espeak-ng itself silently ignores an
        unknown variant, which would make two "different" speakers identical).
        """
        if variant is not None and variant not in self._variants:
            raise EspeakError(
                f"unknown espeak-ng voice variant {variant!r}; available: "
                + ", ".join(self.variants())
            )
        name = f"{voice}+{variant}" if variant else voice
        if name == self._voice:
            return
        err = self._lib.espeak_SetVoiceByName(name.encode())
        if err != _EE_OK:
            english = [v for v in self.voices() if v.startswith("en")]
            raise EspeakError(
                f"espeak-ng cannot load voice {name!r} (error {err}); English voices: "
                + ", ".join(english)
            )
        self._voice = name

    def set_prosody(self, rate: int = 175, pitch: int = 50, pitch_range: int = 50) -> None:
        """Speaking rate in words per minute (80-450); pitch and pitch range in 0-100
        (50 = the voice's default; they scale the variant's own base pitch and range)."""
        if not MIN_RATE <= rate <= MAX_RATE:
            raise EspeakError(f"rate {rate} outside {MIN_RATE}-{MAX_RATE} words per minute")
        for name, value in (("pitch", pitch), ("pitch_range", pitch_range)):
            if not 0 <= value <= 100:
                raise EspeakError(f"{name} {value} outside 0-100")
        for param, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range)):
            if self._lib.espeak_SetParameter(param, int(value), 0) != _EE_OK:
                raise EspeakError(f"espeak_SetParameter({param}, {value}) failed")

    def synthesize(self, text: str, seed: int = 0) -> np.ndarray:
        """Speak `text` with the current voice and prosody.

        `seed` seeds espeak-ng's and libc's random generators (breath noise), so a given
        call sequence is reproducible. Returns (N,) int16 samples at `self.sample_rate`.
        """
        return self._synthesize(text, seed, collect_phonemes=False)[0]

    def synthesize_with_phonemes(
        self, text: str, seed: int = 0
    ) -> tuple[np.ndarray, list[tuple[str, float]]]:
        """`synthesize`, and the phonemes espeak-ng spoke with the second each starts at.

        The samples are exactly those `synthesize` returns for the same call sequence (the
        events are reported either way; this only keeps them).

        Returns:
          ((N,) int16 samples at `self.sample_rate`, [(mnemonic, start seconds)]): espeak-ng
          phoneme mnemonics in spoken order, pauses included ("_", "_:"; the last one
          usually starts at the very end, N / sample_rate), starts non-decreasing.
        """
        wav, events = self._synthesize(text, seed, collect_phonemes=True)
        return wav, [(name, sample / self.sample_rate) for name, sample in events]

    def _synthesize(
        self, text: str, seed: int, collect_phonemes: bool
    ) -> tuple[np.ndarray, list[tuple[str, int]]]:
        """(samples, [(mnemonic, start sample)] or [] unless collect_phonemes)."""
        if self._voice is None:
            raise EspeakError("no voice selected: call set_voice() first")
        self._lib.espeak_ng_SetRandSeed(seed)
        if self._libc is not None:
            self._libc.srand(ctypes.c_uint(seed & 0xFFFFFFFF))
        self._chunks = []
        self._phonemes = [] if collect_phonemes else None
        data = text.encode("utf-8") + b"\0"
        try:
            err = self._lib.espeak_Synth(
                data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            if err != _EE_OK:
                raise EspeakError(f"espeak_Synth failed (error {err}) for text {text!r}")
            self._lib.espeak_Synchronize()
            chunks, events = self._chunks, self._phonemes or []
        finally:
            self._chunks, self._phonemes = [], None
        if not chunks:
            return np.zeros(0, np.int16), events
        return np.concatenate(chunks).astype(np.int16, copy=False), events
