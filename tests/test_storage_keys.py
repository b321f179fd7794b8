"""Object-store keys as local paths (jaxspeech.common.storage.key_path and its users): a key from
someone else's bucket never names a path outside the local mirror. Pure functions; the
same cases against a real S3 server are in tests/e2e/test_object_store.py."""

import os

import pytest

from jaxspeech.common import storage
from jaxspeech.runs import remote


@pytest.mark.parametrize(
    "key, parts",
    [
        ("index.json", ["index.json"]),
        ("tokenizer/sp.model", ["tokenizer", "sp.model"]),
        ("a..b/..c/d..", ["a..b", "..c", "d.."]),  # dots inside a name are a name
        (".hidden/x", [".hidden", "x"]),
        ("events.jsonl.parts/0000000000000016", ["events.jsonl.parts", "0000000000000016"]),
    ],
)
def test_key_path_keeps_a_plain_key_under_the_root(tmp_path, key, parts):
    assert storage.key_path(str(tmp_path), key) == os.path.join(str(tmp_path), *parts)


@pytest.mark.parametrize(
    "key, why",
    [
        ("", "empty key"),
        ("/etc/passwd", "absolute"),
        ("../x", "'..' segment"),
        ("train/../../../../tmp/x", "'..' segment"),
        ("a/..", "'..' segment"),
        ("..", "'..' segment"),
        ("a/./b", "'.' segment"),
        (".", "'.' segment"),
        ("a//b", "empty segment"),
        ("a/", "empty segment"),
        ("..\\..\\x", "backslash"),
        ("a\x00b", "NUL"),
    ],
)
def test_key_path_refuses_keys_that_are_not_plain_relative_paths(tmp_path, key, why):
    with pytest.raises(ValueError, match=why):
        storage.key_path(str(tmp_path), key)


def test_key_path_refuses_a_key_that_resolves_outside_through_a_link(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(ValueError, match="symbolic link"):
        storage.key_path(str(root), "link/x")
    # A root that is itself a link (a cache on another disk) is fine.
    assert storage.key_path(str(tmp_path / "root" / "link"), "x") == str(root / "link" / "x")


def test_cache_dirs_of_a_url_stay_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEECH_CACHE", str(tmp_path))
    assert storage.cache_path("s3://b/corpus/train") == str(tmp_path / "store/s3/b/corpus/train")
    assert remote._cache_dir("s3://b/runs/r") == str(tmp_path / "runs/p0/s3/b/runs/r")
    for url in ("s3://b/../../../../x", "gs://../x", "s3://b/a//c", "s3://"):
        with pytest.raises(storage.StorageError, match="not a usable"):
            storage.cache_path(url)
    with pytest.raises(storage.StorageError, match=r"not a usable run directory URL.*'\.\.'"):
        remote._cache_dir("s3://b/../../../../x")


def test_a_run_listing_refuses_keys_outside_the_copy(tmp_path):
    """RunCopy.pull's sorting of a run's objects: whole files, log parts, and refused keys
    (a part not named by its 16-digit offset could not be looked up again)."""
    meta = {"size": 1, "etag": "e"}
    listing = {
        name: meta
        for name in (
            "config.json",
            f"events.jsonl.parts/{0:016d}",
            f"events.jsonl.parts/{40:016d}",
            "../outside.txt",
            f"../outside.jsonl.parts/{0:016d}",
            "metrics.jsonl.parts/7",
            "/abs/x",
            "checkpoints/4/x",  # not pushed: left to Orbax
        )
    }
    plain, logs, refused = remote._classify(listing, str(tmp_path))
    assert plain == {"config.json": meta}
    assert logs == {"events.jsonl": [0, 40]}
    assert set(refused) == {
        "../outside.txt",
        f"../outside.jsonl.parts/{0:016d}",
        "metrics.jsonl.parts/7",
        "/abs/x",
    }
    assert "16-digit" in refused["metrics.jsonl.parts/7"]
