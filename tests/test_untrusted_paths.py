"""A dataset or run directory from elsewhere names only files inside itself: a crafted
split's index.json (or a tokenizer's config, or a symlink) that points at a file of the
user's is refused with one line, by the training loader, `verify` and `verify --repair`,
and the file outside is left as it was. A run directory brings no compiled code along."""

import json
import os

import numpy as np
import pytest

from data_prep import verify
from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import defaults
from jaxspeech.data import pipeline as pl
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer, train_char_tokenizer
from jaxspeech.runs import assets
from jaxspeech.training import compile_cache
from tests.data.test_pipeline import SR, write_corpus

SECRET = b"the user's own file, not a shard"


@pytest.mark.parametrize(
    "name, reason",
    [
        ("a.array_record", None),
        ("sub/a.array_record", None),
        ("../outside", "a path through '..'"),
        ("sub/../../outside", "a path through '..'"),
        ("/etc/passwd", "an absolute path"),
        ("", "not a file name"),
        (3, "not a file name"),
        ("escape", "a symbolic link that leads out of it"),
    ],
)
def test_escape_reason(tmp_path, name, reason):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").write_bytes(SECRET)
    (root / "escape").symlink_to(tmp_path / "outside")
    assert files.escape_reason(str(root), name) == reason


def test_a_symlinked_root_and_links_inside_it_are_fine(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "x").write_text("x")
    (real / "y").symlink_to(real / "sub" / "x")
    (tmp_path / "link").symlink_to(real)
    for name in ("y", "sub/x"):
        assert files.escape_reason(str(tmp_path / "link"), name) is None


def _crafted_split(tmp_path, entry_for):
    """A prepared train split (2 shards) whose index names `entry_for(outside)` as its
    first shard, `outside` being a file of the user's beside the dataset; (root, outside)."""
    root = str(tmp_path / "data")
    write_corpus(root, n=6, num_shards=2, long_ones=0)
    outside = tmp_path / "private.array_record"
    outside.write_bytes(SECRET)
    index_path = os.path.join(root, "train", records.INDEX_FILE)
    index = json.load(open(index_path))
    index["shards"][0]["path"] = entry_for(str(outside), os.path.join(root, "train"))
    json.dump(index, open(index_path, "w"))
    return root, outside


def _link(outside, split_dir):
    os.symlink(outside, os.path.join(split_dir, "linked.array_record"))
    return "linked.array_record"


@pytest.mark.parametrize(
    "entry_for",
    [
        lambda outside, split_dir: "../../private.array_record",
        lambda outside, split_dir: outside,  # an absolute path
        _link,  # a symlink inside the split that leads out
    ],
    ids=["dotdot", "absolute", "symlink"],
)
def test_a_crafted_index_is_refused_and_the_file_outside_untouched(tmp_path, capsys, entry_for):
    root, outside = _crafted_split(tmp_path, entry_for)
    index_path = os.path.join(root, "train", records.INDEX_FILE)
    entry = json.load(open(index_path))["shards"][0]["path"]
    with pytest.raises(UserError, match="may name only files inside") as e:
        pl.make_pipeline(  # the training (and evaluation) loader
            data_dir=root,
            split="train",
            tokenizer_dir=os.path.join(root, "tokenizer"),
            spec=pl.make_bucket_spec([2.0, 5.0], 12.0, 30.0, SR),
            seed=0,
            train=True,
        )
    assert str(e.value).startswith(f"{index_path} names {entry!r}, ")
    assert "\n" not in str(e.value)
    for argv in ([root], [root, "--repair"]):
        assert verify.main([*argv, "--direct_running_mode=in_memory"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {index_path} names {entry!r}, ") and "\n" not in err
    # Even called on its own with a report that calls the shard bad, repair moves nothing.
    bad = {"path": outside, "problem": "unreadable", "bad_records": [], "found": None}
    with pytest.raises(UserError, match="may name only files inside"):
        verify.repair_split(root, "train", [bad, bad | {"problem": ""}])
    assert outside.read_bytes() == SECRET
    assert not os.path.exists(os.path.join(root, "train", verify.SET_ASIDE))
    assert not os.path.exists(os.path.join(root, "verify.json"))


def test_a_tokenizer_naming_a_model_outside_is_refused(tmp_path):
    tok_dir = tmp_path / "tokenizer"
    train_char_tokenizer(["ab"]).save(str(tok_dir))
    (tmp_path / "secret").write_bytes(SECRET)
    config = json.loads((tok_dir / "tokenizer.json").read_text())
    for name in ("../secret", str(tmp_path / "secret")):
        config |= {"kind": "sentencepiece", "spm_model": name}
        (tok_dir / "tokenizer.json").write_text(json.dumps(config))
        with pytest.raises(UserError, match=f"names {name!r}, .*inside {tok_dir}"):
            Tokenizer.load(str(tok_dir))


def test_a_dataset_symlink_out_is_not_copied_into_a_run(tmp_path):
    root = tmp_path / "data"
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (tmp_path / "secret").write_bytes(SECRET)
    (root / "tokenizer" / "extra").symlink_to(tmp_path / "secret")
    with pytest.raises(UserError, match="names 'extra', a symbolic link that leads out"):
        assets.check_tree(str(root / "tokenizer"))
    os.remove(root / "tokenizer" / "extra")
    assets.check_tree(str(root / "tokenizer"))  # a plain tokenizer directory passes


def test_the_compile_cache_is_the_users_not_the_run_directorys(tmp_path, monkeypatch):
    """A run directory from elsewhere may hold a compile_cache/ of native code: by default
    the trainer reads executables only from the user's own cache."""
    monkeypatch.setenv("JAXSPEECH_CACHE", str(tmp_path / "cache"))
    run = str(tmp_path / "run")
    default = defaults.get_config().train.compile_cache_dir
    path = compile_cache.path(default, run)
    assert path == os.path.join(storage.cache_root(), "jit")
    assert os.path.commonpath([path, run]) != run
    assert compile_cache.path("{workdir}/jc", run) == os.path.join(run, "jc")


def test_the_trainer_points_jax_at_a_private_directory(tmp_path, monkeypatch):
    updates = {}
    monkeypatch.setattr(compile_cache.jax.config, "update", updates.__setitem__)
    monkeypatch.setenv("JAXSPEECH_CACHE", str(tmp_path / "cache"))
    path = compile_cache.use("{cache}/jit", str(tmp_path / "run"))
    assert updates["jax_compilation_cache_dir"] == path == str(tmp_path / "cache" / "jit")
    assert os.stat(path).st_mode & 0o777 == 0o700  # others cannot plant executables
    assert not os.path.exists(tmp_path / "run")


def test_verify_reads_a_clean_split_after_the_check(tmp_path):
    """The containment check keeps an honest split readable (relative names, a split
    directory reached through a symlink)."""
    root = tmp_path / "data"
    write_corpus(str(root), n=4, num_shards=2, long_ones=0)
    (tmp_path / "alias").symlink_to(root)
    index = records.read_split_index(str(tmp_path / "alias"), "train")
    assert index.num_records == 4 and all(os.path.isfile(p) for p in index.shard_paths)
    assert np.isclose(index.seconds, float(index.durations.sum()), atol=1e-3)
