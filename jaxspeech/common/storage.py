"""Object stores (``s3://``, ``gs://``) beside local paths, through fsspec.

Prepared corpora may live on an object store: ``data_prep.prepare --output s3://...``
prepares into a local staging directory and uploads the result (:func:`upload_dir`), and
every reader of a prepared split (training, evaluation, export, distillation, verify)
goes through :func:`local_dir`, which mirrors the files it needs into a local cache once
and returns their local directory. ArrayRecord, SentencePiece and the feature statistics
are then read from local files as before: ArrayRecord's reader takes local paths only,
and a training job reads its shards many times (epochs), so one download per host is
also the cheapest way to read them.

Object stores have no rename, so a split is committed by its ``index.json``: uploaded
last, deleted first when a split is replaced. A split without it is absent or still being
written, and reading it fails with one line. Downloads go to a temporary name and are
renamed into the cache when complete; a cached file whose size or ETag differs from the
object's is fetched again, so a half-finished download or a replaced object is never read.

Endpoints and credentials are the stores' usual settings: for S3 the AWS variables
(``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3`` for S3-compatible servers,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_PROFILE``, ``AWS_REGION``), read by
botocore; for GCS Google's application default credentials and ``STORAGE_EMULATOR_HOST``,
read by gcsfs. Each client (s3fs, gcsfs) is the ``cloud`` extra and imported only when a
path of its scheme is used. Transient errors (connection resets, timeouts, throttling,
5xx) are retried with exponential backoff; anything else (no such bucket, access denied,
a missing object) is a :class:`StorageError` of one line.

The cache is ``$JAXSPEECH_CACHE`` (default ``~/.cache/jaxspeech``) ``/store/<scheme>/
<bucket>/<key>``. A bucket may be someone else's, so keys are not trusted as paths: an
object whose key would leave its mirror (``..``, an absolute key: :func:`key_path`) is
not copied (one warning line names them), and a mirror removes only files that its own
earlier listing put there.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from jaxspeech.common import files
from jaxspeech.common.errors import UserError

SCHEMES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
COMMIT_FILE = "index.json"  # a prepared split's commit marker: uploaded last
MIRROR_MANIFEST = ".store.json"  # a mirror's record of what it holds, in its root
RETRIES = 5
BACKOFF_S = 0.5  # first retry delay; doubled per retry, with jitter

T = TypeVar("T")


class StorageError(UserError):
    """An object-store path that cannot be used: reported as one line."""


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an object-store URL (``s3://``, ``gs://``); a local path may be
    a ``pathlib.Path``."""
    path = os.fspath(path)
    return path.split("://", 1)[0] in SCHEMES if "://" in path else False


def absolute(path: str | os.PathLike) -> str:
    """An object-store URL unchanged, a local path made absolute (what reports record)."""
    return os.fspath(path) if is_remote(path) else os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for a local path or a URL."""
    if not is_remote(base):
        return os.path.join(base, *parts)
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def filesystem(url: str):
    """(fsspec filesystem, path without the scheme) of an object-store URL.

    Raises:
      StorageError: the scheme's client library is not installed.
    """
    import fsspec

    scheme = url.split("://", 1)[0]
    if SCHEMES[scheme] == "gcsfs" and os.environ.get("STORAGE_EMULATOR_HOST"):
        # gcsfs first asks each bucket's type over gRPC (60 s timeouts), which emulators
        # do not serve; read at its import.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise StorageError(
            f"{url}: reading {scheme}:// needs {SCHEMES[scheme]} (pip install 'jaxspeech[cloud]')"
        ) from e
    return fs, path


def _transient(exc: BaseException) -> bool:
    """A failure worth retrying: the connection, a timeout, throttling or a 5xx."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    text = f"{type(exc).__name__} {exc}"
    return any(
        s in text
        for s in (
            "SlowDown",
            "Throttl",
            "RequestTimeout",
            "InternalError",
            "ServiceUnavailable",
            "503",
            "500",
            "502",
            "504",
            "ClientConnectorError",
            "ServerDisconnectedError",
            "EndpointConnectionError",
        )
    )


def _one_line(url: str, exc: BaseException) -> str:
    """A storage failure as one line: what failed on which URL, and why."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code") if cause else None
    if code == "NoSuchBucket" or "bucket does not exist" in reason:
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        return f"{url}: no bucket {bucket!r} on this endpoint ({_endpoint(url)})"
    if isinstance(exc, FileNotFoundError):
        return f"{url}: no such object"
    if isinstance(exc, PermissionError) or code in ("AccessDenied", "InvalidAccessKeyId"):
        return f"{url}: access denied ({reason}); check the credentials"
    return f"{url}: {type(exc).__name__}: {reason}"


def _endpoint(url: str) -> str:
    if url.startswith("s3://"):
        return (
            os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
        )
    return os.environ.get("STORAGE_EMULATOR_HOST") or "Google Cloud Storage"


def retrying(url: str, what: Callable[[], T], retries: int = RETRIES) -> T:
    """``what()``, retried with exponential backoff while it fails transiently.

    Raises:
      StorageError: a failure that is not transient, or still failing after the retries.
    """
    for attempt in range(retries + 1):
        try:
            return what()
        except StorageError:
            raise
        except Exception as e:
            if not _transient(e) or attempt == retries:
                raise StorageError(_one_line(url, e)) from e
            time.sleep(BACKOFF_S * 2**attempt * (1 + random.random()))
    raise AssertionError("unreachable")


def exists(url: str) -> bool:
    """Whether an object (or, for a prefix, any object under it) exists."""
    if not is_remote(url):
        return os.path.exists(url)
    fs, path = filesystem(url)
    return retrying(url, lambda: fs.exists(path))


def remove(url: str) -> None:
    """Removes an object if it exists."""
    fs, path = filesystem(url)

    def rm() -> None:
        if fs.exists(path):
            fs.rm_file(path)

    retrying(url, rm)


def list_files(url: str) -> dict[str, dict]:
    """{path relative to ``url``: {"size", "etag"}} of every object under the prefix."""
    fs, path = filesystem(url)
    prefix = path.rstrip("/") + "/"
    found = retrying(url, lambda: fs.find(prefix, detail=True))
    return {
        name[len(prefix) :]: {"size": int(info["size"]), "etag": _etag(info)}
        for name, info in found.items()
        if info.get("type", "file") == "file" and name.startswith(prefix)
    }


def _etag(info: dict) -> str:
    return str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or "").strip('"')


def check_bucket(url: str) -> None:
    """Raises StorageError (one line) when the URL's bucket does not exist or cannot be
    reached, before any work is done."""
    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    if not retrying(url, lambda: fs.exists(bucket)):
        raise StorageError(f"{url}: no bucket {bucket!r} on this endpoint ({_endpoint(url)})")


# ---------------------------------------------------------------- upload and mirror
def upload_dir(local: str, url: str, last: Iterable[str] = (COMMIT_FILE,)) -> list[str]:
    """Uploads every file under ``local`` to the prefix ``url`` (paths kept), the files
    named in ``last`` after all others: a reader that sees them sees everything. Objects
    under the prefix that ``local`` does not have are removed first, after the ``last``
    ones (a replaced split is uncommitted before it changes). Returns the uploaded paths.
    """
    fs, base = filesystem(url)
    last = tuple(last)
    names = sorted(
        os.path.relpath(os.path.join(d, f), local) for d, _, fs_ in os.walk(local) for f in fs_
    )
    names = [n.replace(os.sep, "/") for n in names]
    existing = list_files(url) if exists(url) else {}
    for name in [n for n in existing if n in last] + [n for n in existing if n not in names]:
        remove(join(url, name))
    ordered = [n for n in names if n not in last] + [n for n in names if n in last]
    for name in ordered:
        target = f"{base.rstrip('/')}/{name}"
        source = os.path.join(local, *name.split("/"))
        retrying(join(url, name), lambda s=source, t=target: fs.put_file(s, t))
    return ordered


def cache_root() -> str:
    return os.environ.get("JAXSPEECH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "jaxspeech"
    )


def key_path(root: str, key: str) -> str:
    """The local path of the store key ``key`` ('/'-separated, relative to a prefix) under
    the directory ``root``.

    Keys come from a bucket that may be someone else's: ``a/../../x`` joined as it is would
    be written, and later removed as stale, outside the cache.

    Raises:
      ValueError: the key cannot be a path inside ``root`` (the message says why): empty,
        absolute, a ``..``, ``.`` or empty segment, a backslash or NUL (a separator or the
        end of a name to the OS, not to the store), or a path that resolves outside
        ``root`` through a symbolic link.
    """
    if not key:
        raise ValueError("an empty key")
    if "\x00" in key:
        raise ValueError("a NUL byte")
    if "\\" in key:
        raise ValueError("a backslash")
    if key.startswith("/"):
        raise ValueError("an absolute path")
    parts = key.split("/")
    for bad, why in (("..", "a '..' segment"), (".", "a '.' segment"), ("", "an empty segment")):
        if bad in parts:
            raise ValueError(why)
    escape = files.escape_reason(root, key)  # the real path, symbolic links resolved
    if escape is not None:
        raise ValueError(escape)
    return os.path.join(root, *parts)


def cache_path(url: str) -> str:
    """The local mirror directory of an object-store URL.

    Raises:
      StorageError: a URL whose bucket and key cannot be a directory inside the cache
        (``s3://bucket/../../x``; see key_path).
    """
    scheme, rest = url.split("://", 1)
    root = os.path.join(cache_root(), "store", scheme)
    try:
        return key_path(root, rest.strip("/"))
    except ValueError as e:
        raise StorageError(f"{url}: not a usable object-store path: {e}") from None


def warn_skipped_keys(url: str, refused: dict[str, str]) -> None:
    """One warning line for the objects under ``url`` that were not copied: their count
    and the first keys, each with why."""
    if refused:
        shown = ", ".join(f"{k!r} ({why})" for k, why in sorted(refused.items())[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        print(
            f"WARNING: {url}: skipped {len(refused)} object(s) whose keys cannot be local "
            f"paths: {shown}{more}",
            flush=True,
        )


def local_dir(url: str, commit_file: str | None = None) -> str:
    """A local directory holding every object under ``url``: ``url`` itself when local,
    else its mirror in the cache, brought up to date (objects whose size or ETag changed
    are fetched again; files that are no longer in the store are removed).

    An object whose key cannot be a path inside the mirror (``a/../../x``: key_path) is
    not copied; one warning line counts and names them.

    ``commit_file``: the object that marks the prefix complete (a split's index.json);
    without it the prefix is refused.

    Raises:
      StorageError: no such prefix, or no commit file, or a failed download.
    """
    if not is_remote(url):
        return url
    check_bucket(url)
    listing = list_files(url)
    if not listing:
        raise StorageError(f"{url}: no objects under this prefix")
    if commit_file is not None and commit_file not in listing:
        raise StorageError(
            f"{url}: no {commit_file}: not prepared, or still being written (it is uploaded last)"
        )
    local = cache_path(url)
    os.makedirs(local, exist_ok=True)
    manifest_path = os.path.join(local, MIRROR_MANIFEST)
    try:
        with open(manifest_path) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    fs, base = filesystem(url)
    refused: dict[str, str] = {}  # key -> why it was not copied
    for name, meta in sorted(listing.items()):
        try:
            target = _mirror_path(local, name)
        except ValueError as e:
            refused[name] = str(e)
            continue
        if cached.get(name) == meta and _size(target) == meta["size"]:
            continue
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # keys "a" and "a/b"
            refused[name] = "a key below another object's key"
            continue
        temp = files.temp_path(target)
        source = f"{base.rstrip('/')}/{name}"
        retrying(join(url, name), lambda s=source, t=temp: fs.get_file(s, t))
        if _size(temp) != meta["size"]:
            os.remove(temp)
            raise StorageError(f"{join(url, name)}: downloaded {_size(temp)} bytes of {meta}")
        try:
            os.replace(temp, target)
        except IsADirectoryError:  # an earlier listing's "a/b", now "a"
            os.remove(temp)
            refused[name] = "a key an earlier listing had as a directory"
            continue
        cached[name] = meta
    # Stale files: only those an earlier listing of this prefix put here (the manifest),
    # and only inside the mirror (a manifest written before keys were checked may name
    # others: those are forgotten, never removed).
    for name in set(cached) - (set(listing) - set(refused)):
        try:
            os.remove(_mirror_path(local, name))
        except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError):
            pass
        del cached[name]
    files.atomic_json(manifest_path, cached)
    warn_skipped_keys(url, refused)
    return local


def _mirror_path(local: str, key: str) -> str:
    """key_path in a mirror directory, whose manifest's name is not a key's.

    Raises:
      ValueError: see key_path.
    """
    if key == MIRROR_MANIFEST:
        raise ValueError("the name of the mirror's own manifest")
    return key_path(local, key)


def local_file(url: str | os.PathLike) -> str:
    """A local path holding the object ``url`` (a file only a local reader can open: a
    KenLM model): ``url`` itself when local, else its copy in the cache, fetched again when
    the object's size or ETag changed.

    Raises:
      StorageError: no such object, or a failed download.
    """
    if not is_remote(url):
        return os.fspath(url)
    url = os.fspath(url)
    fs, path = filesystem(url)
    info = retrying(url, lambda: fs.info(path))
    meta = {"size": int(info["size"]), "etag": _etag(info)}
    target = cache_path(url)
    stamp = target + ".store.json"
    try:
        with open(stamp) as f:
            if json.load(f) == meta and _size(target) == meta["size"]:
                return target
    except (OSError, ValueError):
        pass
    os.makedirs(os.path.dirname(target), exist_ok=True)
    temp = files.temp_path(target)
    retrying(url, lambda: fs.get_file(path, temp))
    if _size(temp) != meta["size"]:
        os.remove(temp)
        raise StorageError(f"{url}: downloaded {_size(temp)} bytes of {meta['size']}")
    os.replace(temp, target)
    files.atomic_json(stamp, meta)
    return target


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def local_data(data_dir: str | os.PathLike, *subdirs: str) -> str:
    """A prepared corpus's directory to read locally: ``data_dir`` itself when local; for
    an object-store URL its cache mirror, with ``subdirs`` (splits, committed by their
    index.json, and ``tokenizer``) brought up to date.

    Raises:
      StorageError: see local_dir.
    """
    if not is_remote(data_dir):
        return os.fspath(data_dir)
    data_dir = os.fspath(data_dir)
    for sub in subdirs:
        local_dir(join(data_dir, sub), None if sub == "tokenizer" else COMMIT_FILE)
    return cache_path(data_dir)
