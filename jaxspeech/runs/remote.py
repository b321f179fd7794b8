"""Run directories on object stores: ``--workdir s3://BUCKET/RUN`` or ``gs://BUCKET/RUN``.

Checkpoints are written to the store by Orbax itself, every process its own shards as on
a shared file system, and committed by Orbax's commit-file protocol: object stores have
no rename, so a step counts once its ``commit_success.txt`` exists (runs/checkpoint.py
selects it for store URLs). Orbax 0.12 builds tensorstore's ``gcs`` kvstore for ``gs://``
but no ``s3`` one: :func:`install_orbax_s3` adds it.

Every other file of a run is written by the same code as for a local run, into a local
working copy (``$JAXSPEECH_CACHE/runs/...``), and pushed to the store as whole objects:

- append-only logs (events, metrics, data faults, batch ids: ``APPEND_LOGS``): the complete
  lines appended since the last push, as a new object ``NAME.parts/<offset>`` (the byte
  offset in the log, 16 digits). A push never rewrites an object an earlier push wrote; a
  reader concatenates the parts in offset order, stopping at a gap.
- every other file (config.json, assets/, evaluation results, TensorBoard, diagnostics):
  one whole-object PUT when its size or modification time changed. A PUT is atomic: a
  reader sees the old object or the new one. TensorBoard's event files only grow and are
  sent whole, so between checkpoints they go at most every ``SLOW_PUSH_EVERY_S``.
- a log's parts are compacted when its writer starts (``compact``): the whole log as
  part 0, then the parts it covers deleted; a reader skips parts that an earlier part
  already covers, and reads again if one vanished while it read.
- not pushed: the lease (kept on the store itself: runs/lease.py), the compile cache
  (per host), the checkpoints (on the store already) and temporaries.

A training job pushes after each checkpoint commit and evaluation, at most every
``PUSH_EVERY_S`` between, and when it ends (finished, failed or preempted). A restart
pulls the store's copy over its local one: the store holds the run, and what a killed job
appended after its last push is lost, like what a killed process had not yet flushed.
Readers (evaluate, export, transcribe, status, distillation) pull into a private
temporary copy, removed when they exit. A pull writes only objects whose keys are plain
relative paths inside the copy (storage.key_path: no ``..``, no absolute key); the others
are named in one warning line, and what it removes are files found inside the copy.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

from jaxspeech.common import files, storage
from jaxspeech.common.files import TEMP_MARK

PARTS = ".parts"
PUSH_EVERY_S = 30.0
SLOW_PUSH_EVERY_S = 600.0  # TensorBoard files: whole objects that only grow
SLOW_DIRS = ("tensorboard",)
COMPACT_PARTS = 64  # a log with more parts is rewritten as one when its writer starts
NOT_PUSHED_DIRS = ("checkpoints", "checkpoints_corrupt", "compile_cache")
NOT_PUSHED_FILES = ("lease.json", "lease.json.takeover")


def _pushed(name: str) -> bool:
    """Whether the relative path ``name`` of a run's file belongs on the store."""
    parts = name.split("/")
    return (
        parts[0] not in NOT_PUSHED_DIRS
        and name not in NOT_PUSHED_FILES
        and TEMP_MARK not in parts[-1]
        and not any(p.endswith(PARTS) for p in parts[:-1])
    )


# The run's append-only logs (runs/events.py, runs/faults.py, metrics/writers.py); other
# .jsonl files (an evaluation's per-utterance rows) are written whole.
APPEND_LOGS = ("events.jsonl", "metrics.jsonl", "eval/watch_metrics.jsonl")
APPEND_LOG_DIRS = ("data_faults", "batch_ids")


def _is_log(name: str) -> bool:
    return name in APPEND_LOGS or (
        name.endswith(".jsonl") and name.count("/") == 1 and name.split("/")[0] in APPEND_LOG_DIRS
    )


def _local_files(root: str) -> list[str]:
    """Relative '/'-joined paths of the files under ``root`` that belong on the store."""
    out = []
    for d, _, names in os.walk(root):
        for f in names:
            rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            if _pushed(rel):
                out.append(rel)
    return sorted(out)


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


class RunCopy:
    """A run directory's local working copy: ``local`` is where the run's files are read
    and written; for a local run it is the run directory itself and pull/push do nothing.
    """

    def __init__(self, workdir: str, local: str | None = None):
        self.url = storage.absolute(workdir)
        self.remote = storage.is_remote(workdir)
        self.local = (local or _cache_dir(self.url)) if self.remote else self.url
        self._state: dict[str, object] = {}  # name -> pushed log offset, or (size, mtime)
        self._parts: dict[str, int] = {}  # log -> parts on the store at the last pull
        self._whole_logs: set[str] = set()  # logs stored as one object (uploaded runs)
        self._part0: set[str] = set()  # logs whose parts start at byte 0
        self._last_push = self._last_slow_push = 0.0

    # ------------------------------------------------------------ pull
    def pull(self) -> str:
        """Makes the local copy the store's (files the store lacks are removed, the compile
        cache kept); returns ``local``."""
        if not self.remote:
            return self.local
        storage.check_bucket(self.url)
        listing = storage.list_files(self.url) if storage.exists(self.url) else {}
        os.makedirs(self.local, exist_ok=True)
        plain, logs, refused = _classify(listing, self.local)
        storage.warn_skipped_keys(self.url, refused)
        for name in _local_files(self.local):
            if name not in plain and name not in logs:
                os.remove(os.path.join(self.local, *name.split("/")))
        _remove_empty_dirs(self.local)  # a directory's presence means something (assets/)
        fs, base = storage.filesystem(self.url)
        for name in plain:
            self._download(fs, f"{base.rstrip('/')}/{name}", name)
        # A log uploaded whole (a local run copied to the store) is the start of its parts.
        self._whole_logs = {n for n in plain if _is_log(n)}
        for name, offsets in logs.items():
            sizes = {o: listing[f"{name}{PARTS}/{o:016d}"]["size"] for o in offsets}
            head = b""
            if name in self._whole_logs and 0 not in sizes:
                with open(self._path(name), "rb") as f:
                    head = f.read()
            self._join_parts(fs, base, name, sizes, head)
        self._parts = {name: len(offsets) for name, offsets in logs.items()}
        self._part0 = {name for name, offsets in logs.items() if 0 in offsets}
        self._state = {
            n: os.path.getsize(self._path(n)) if _is_log(n) else _stat(self._path(n))
            for n in _local_files(self.local)
        }
        self._last_push = time.time()
        return self.local

    def _path(self, name: str) -> str:
        """The local path of a run file ``name``: a file found under ``local``, or a key
        that ``_classify`` accepted."""
        return os.path.join(self.local, *name.split("/"))

    def _download(self, fs, source: str, name: str) -> None:
        target = self._path(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        data = storage.retrying(storage.join(self.url, name), lambda: fs.cat_file(source))
        files.atomic_write(target, data)

    def _join_parts(
        self, fs, base: str, name: str, sizes: dict[int, int], head: bytes = b""
    ) -> None:
        """NAME rebuilt from `head` (the log's bytes before its parts) and its parts
        ({offset: size}) in offset order, up to the first gap. A part that an earlier one
        covers (compacted) is skipped; one that vanished while this ran (a compaction)
        makes it list the parts and read again."""
        url = storage.join(self.url, name)
        for _ in range(3):
            try:
                data = _concatenate(fs, f"{base.rstrip('/')}/{name}{PARTS}", sizes, url, head)
                break
            except storage.StorageError as e:
                if not isinstance(e.__cause__, FileNotFoundError):
                    raise
                listing = storage.list_files(f"{url}{PARTS}")
                sizes = {int(k): v["size"] for k, v in listing.items() if k.isdigit()}
        else:
            raise storage.StorageError(f"{url}: its parts keep changing while read")
        target = self._path(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        files.atomic_write(target, data)

    def compact(self, process: int) -> int:
        """For each log this process writes (``_writes``): a log stored as one object (a
        run copied to the store) becomes its part 0, and one with more than COMPACT_PARTS
        parts is rewritten as one part; returns the logs compacted. Only for the job that
        holds the run's lease, right after its pull (no other writer of these logs)."""
        if not self.remote:
            return 0
        fs, base = storage.filesystem(self.url)
        for name in sorted(self._whole_logs - self._part0):  # a whole object -> part 0
            if _writes(name, process):
                url, source = storage.join(self.url, name), f"{base.rstrip('/')}/{name}"
                data = storage.retrying(url, lambda s=source: fs.cat_file(s))
                key = f"{source}{PARTS}/{0:016d}"
                storage.retrying(url, lambda k=key, d=data: fs.pipe_file(k, d))
                storage.remove(url)
                self._parts[name] = self._parts.get(name, 0) + 1
        done = 0
        for name, count in sorted(self._parts.items()):
            if count <= COMPACT_PARTS or not _writes(name, process):
                continue
            prefix = f"{base.rstrip('/')}/{name}{PARTS}"
            url = storage.join(self.url, name)
            with open(self._path(name), "rb") as f:
                data = f.read()
            covered = storage.list_files(f"{url}{PARTS}")  # before: later ones stay
            storage.retrying(url, lambda p=prefix, d=data: fs.pipe_file(f"{p}/{0:016d}", d))
            stale = [  # the parts part 0 now holds (none past a gap: kept as found)
                f"{prefix}/{k}"
                for k, meta in covered.items()
                if k.isdigit() and 0 < int(k) and int(k) + meta["size"] <= len(data)
            ]
            for i in range(0, len(stale), 1000):
                storage.retrying(url, lambda b=stale[i : i + 1000]: fs.rm(b))
            self._parts[name] = 1
            done += 1
        return done

    # ------------------------------------------------------------ push
    def push(self, slow_too: bool = True) -> int:
        """Uploads what changed since the last pull or push; returns the objects written.
        slow_too=False: TensorBoard files only when SLOW_PUSH_EVERY_S passed since their
        last push."""
        if not self.remote:
            return 0
        fs, base = storage.filesystem(self.url)
        written, now = 0, time.time()
        slow_due = slow_too or now - self._last_slow_push >= SLOW_PUSH_EVERY_S
        if slow_due:
            self._last_slow_push = now
        for name in _local_files(self.local):
            if name.split("/")[0] in SLOW_DIRS and not slow_due:
                continue
            path = self._path(name)
            if _is_log(name):
                written += self._push_log(fs, base, name, path)
                continue
            try:
                st = _stat(path)
            except FileNotFoundError:  # replaced meanwhile: the next push sends it
                continue
            if self._state.get(name) == st:
                continue
            with open(path, "rb") as f:
                data = f.read()
            key = f"{base.rstrip('/')}/{name}"
            storage.retrying(storage.join(self.url, name), lambda k=key, d=data: fs.pipe_file(k, d))
            self._state[name] = st
            written += 1
        self._last_push = time.time()
        return written

    def _push_log(self, fs, base: str, name: str, path: str) -> int:
        start = int(self._state.get(name, 0))
        with open(path, "rb") as f:
            f.seek(start)
            new = f.read()
        new = new[: new.rfind(b"\n") + 1]  # complete lines only: the rest comes next time
        if not new:
            return 0
        key = f"{base.rstrip('/')}/{name}{PARTS}/{start:016d}"
        storage.retrying(storage.join(self.url, name), lambda: fs.pipe_file(key, new))
        self._state[name] = start + len(new)
        return 1

    def push_due(self) -> int:
        """``push()`` when PUSH_EVERY_S passed since the last one (TensorBoard files when
        SLOW_PUSH_EVERY_S passed)."""
        if self.remote and time.time() - self._last_push >= PUSH_EVERY_S:
            return self.push(slow_too=False)
        return 0


def _classify(
    listing: dict[str, dict], local: str
) -> tuple[dict[str, dict], dict[str, list[int]], dict[str, str]]:
    """A run's objects (list_files) -> (whole files {name: meta}, logs {name: [part
    offsets]}, refused {key: why}); objects that are not pushed (checkpoints, the lease)
    are in none. A key that cannot be a path inside ``local`` (storage.key_path) is
    refused, and so is a part not named by its 16-digit offset (the name a pull looks it
    up by)."""
    plain: dict[str, dict] = {}
    logs: dict[str, list[int]] = {}
    refused: dict[str, str] = {}
    for name in sorted(listing):
        head, sep, tail = name.rpartition(PARTS + "/")
        is_part = bool(sep) and tail.isdigit()
        target = head if is_part else name
        if not _pushed(target):
            continue
        try:
            storage.key_path(local, target)
        except ValueError as e:
            refused[name] = str(e)
            continue
        if is_part and len(tail) != 16:
            refused[name] = "a log part not named by its 16-digit offset"
        elif is_part:
            logs.setdefault(head, []).append(int(tail))
        else:
            plain[name] = listing[name]
    return plain, logs, refused


def _writes(name: str, process: int) -> bool:
    """Whether process ``process`` of a training job is the writer of log ``name``: the
    per-process logs (``<dir>/p<i>.jsonl``) their process, the others process 0."""
    head, _, tail = name.rpartition("/")
    if head in APPEND_LOG_DIRS:
        return tail == f"p{process}.jsonl"
    return process == 0


def _concatenate(fs, prefix: str, sizes: dict[int, int], url: str, head: bytes = b"") -> bytes:
    """`head`, then the bytes of parts ``prefix/<offset>`` in order: a part inside what
    came before is skipped (unread), one that extends past it gives its new bytes; a gap
    ends it with a warning."""
    chunks, at = [head], len(head)
    for offset in sorted(sizes):
        if offset + sizes[offset] <= at:
            continue  # covered by a compacted part
        if offset > at:
            print(
                f"WARNING: {url}: part at byte {offset} where {at} was expected; the log is "
                f"read up to byte {at}",
                flush=True,
            )
            break
        key = f"{prefix}/{offset:016d}"
        part = storage.retrying(url, lambda k=key: fs.cat_file(k))
        chunks.append(part[at - offset :])
        at = offset + len(part)
    return b"".join(chunks)


def _remove_empty_dirs(root: str) -> None:
    for d, _, names in os.walk(root, topdown=False):
        rel = os.path.relpath(d, root).replace(os.sep, "/")
        if d != root and not names and not os.listdir(d) and _pushed(rel + "/x"):
            os.rmdir(d)


def _cache_dir(url: str) -> str:
    """A training job's working copy: one per run and process (two processes of one job
    on one host must not share it).

    Raises:
      StorageError: a URL that cannot name a directory inside the cache (``..``: key_path).
    """
    import jax

    scheme, rest = url.split("://", 1)
    root = os.path.join(storage.cache_root(), "runs", f"p{jax.process_index()}", scheme)
    try:
        return storage.key_path(root, rest.strip("/"))
    except ValueError as e:
        raise storage.StorageError(f"{url}: not a usable run directory URL: {e}") from None


def for_reading(workdir: str) -> RunCopy:
    """A pulled copy of a run for a command that reads it (and may add its own results,
    then ``push()``): a private temporary directory for a store URL, removed at exit,
    so a reader never touches a training job's working copy. A local run as it is."""
    if not storage.is_remote(workdir):
        return RunCopy(workdir)
    root = os.path.join(storage.cache_root(), "runs", "read")
    os.makedirs(root, exist_ok=True)
    local = tempfile.mkdtemp(dir=root)
    atexit.register(shutil.rmtree, local, True)
    copy = RunCopy(workdir, local)
    copy.pull()
    return copy


_READ: dict[str, RunCopy] = {}


def reader(workdir: str) -> RunCopy:
    """The copy of ``workdir`` this process reads (and adds results to): pulled once per
    process (:func:`for_reading`); a local run as it is."""
    if workdir not in _READ:
        _READ[workdir] = for_reading(workdir)
    return _READ[workdir]


def read_copy(workdir: str) -> str:
    """The local directory of ``workdir``'s files (:func:`reader`)."""
    return workdir if not storage.is_remote(workdir) else reader(workdir).local


# ---------------------------------------------------------------- Orbax on S3 and GCS
def configure_gcs() -> None:
    """Points tensorstore's GCS driver (Orbax's, for ``gs://``) at the emulator that
    fsspec uses when ``STORAGE_EMULATOR_HOST`` is set (tensorstore reads its own
    variable, ``TENSORSTORE_GCS_HTTP_URL``)."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)


_SENTINEL = "/__jaxspeech_s3__/"


def s3_kvstore(bucket: str, key: str) -> dict:
    """tensorstore's s3 kvstore spec for ``s3://bucket/key`` with the AWS settings of the
    environment (an S3-compatible server's endpoint, the region); the credentials are
    read by tensorstore from the usual variables or profile."""
    spec = {"driver": "s3", "bucket": bucket, "path": key}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        # Without this tensorstore also looks for ~/.aws files and logs their absence.
        spec["aws_credentials"] = {"type": "environment"}
    return spec


def _to_s3(spec):
    """``spec`` with each ``file`` kvstore under the sentinel root made an ``s3`` one."""
    if isinstance(spec, dict):
        path = str(spec.get("path", ""))
        if spec.get("driver") == "file" and path.startswith(_SENTINEL):
            bucket, _, key = path[len(_SENTINEL) :].partition("/")
            return s3_kvstore(bucket, key)
        return {k: _to_s3(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_to_s3(v) for v in spec]
    return spec


def install_orbax_s3() -> None:
    """Lets Orbax write and read arrays under ``s3://`` URLs (idempotent).

    Orbax 0.12's ``build_kvstore_tspec`` knows the ``file`` and ``gcs`` kvstores only (an
    ``s3://`` directory fails as "not absolute"). The wrapper builds the spec Orbax would
    build for the same key under a local sentinel root, with its OCDBT layout and write
    options intact, and swaps the ``file`` driver for tensorstore's ``s3`` one. Every
    other file Orbax writes (metadata, commit markers) goes through etils' epath, which
    reads ``s3://`` with fsspec. Pinned by pyproject (orbax-checkpoint <0.13) and tested
    against an S3 server in tests/e2e/test_object_store.py.
    """
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    if getattr(tsu.build_kvstore_tspec, "jaxspeech_s3", False):
        return
    original = tsu.build_kvstore_tspec

    def build_kvstore_tspec(directory, *args, **kwargs):
        directory = str(directory)
        if not directory.startswith("s3://"):
            return original(directory, *args, **kwargs)
        return _to_s3(original(_SENTINEL + directory[len("s3://") :], *args, **kwargs))

    build_kvstore_tspec.jaxspeech_s3 = True
    tsu.build_kvstore_tspec = build_kvstore_tspec
