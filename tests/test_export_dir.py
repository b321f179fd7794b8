"""An export's --output: replaced only when it is new, empty or an earlier export with
nothing beside it (jaxspeech.serving.artifact_dir). A user's directory that merely holds a
file named manifest.json, or an earlier export with a file of the user's added, is refused
before any work, by each of the three exports, and left exactly as it was."""

import json
import os

import pytest

from jaxspeech.common import files
from jaxspeech.common.errors import UserError
from jaxspeech.serving import artifact_dir
from jaxspeech.serving import recognizer_export as export
from jaxspeech.tts import artifact as tts_export
from jaxspeech.vocoder import artifact as vocoder_export


def _tree(root) -> dict[str, bytes | None]:
    """{relative path: bytes (None for a directory)} of everything under `root`."""
    out = {}
    for path, dirs, names in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(path, d), root)] = None
        for n in names:
            full = os.path.join(path, n)
            out[os.path.relpath(full, root)] = open(full, "rb").read()
    return out


def _users_dir(tmp_path):
    """A directory of the user's that holds a manifest.json that is not an export's."""
    out = tmp_path / "thesis"
    (out / "sub").mkdir(parents=True)
    (out / "manifest.json").write_text('{"title": "my thesis"}')
    (out / "thesis.tex").write_text("\\documentclass{article}")
    (out / "sub" / "data.csv").write_text("a,b\n1,2\n")
    return out


def _export(output, content: str, manifest: dict | None = None) -> dict:
    """An export of `content` to `output` as the exports publish one (with a tokenizer/)."""
    stage = files.staging_dir(str(output))
    os.makedirs(os.path.join(stage, "tokenizer"))
    files.atomic_write(os.path.join(stage, "ctc.stablehlo"), content)
    files.atomic_write(os.path.join(stage, "tokenizer", "tokenizer.json"), "{}")
    manifest = dict(manifest or {"format": "stablehlo"})
    artifact_dir.publish(stage, str(output), manifest)
    return manifest


EXPORTS = {
    "recognizer": lambda out: export.export_run("no-run", out),
    "synthesizer": lambda out: tts_export.export_tts_run("no-run", out),
    "vocoder": lambda out: vocoder_export.export_vocoder_run("no-run", out),
}


@pytest.mark.parametrize("kind", EXPORTS)
def test_every_export_refuses_a_users_directory_and_leaves_it_untouched(tmp_path, kind):
    out = _users_dir(tmp_path)
    before = _tree(out)
    with pytest.raises(UserError) as e:
        EXPORTS[kind](str(out))
    message = str(e.value)
    assert message.startswith(f"--output {out} holds files no export wrote: ")
    assert all(n in message for n in ("manifest.json", "thesis.tex", "sub/data.csv"))
    assert "\n" not in message
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["thesis"]  # no staging directory either


def test_an_earlier_export_is_replaced_whole(tmp_path):
    out = tmp_path / "artifact"
    first = _export(out, "first")
    assert first["artifact"] == artifact_dir.ARTIFACT
    assert first["files"] == ["ctc.stablehlo", "tokenizer/tokenizer.json", "manifest.json"]
    os.remove(out / "tokenizer" / "tokenizer.json")  # a file it lists may be gone
    artifact_dir.check_output(str(out))
    second = _export(out, "second", {"format": "stablehlo", "run": 2})
    assert json.loads((out / "manifest.json").read_text()) == second
    assert _tree(out)["ctc.stablehlo"] == b"second"
    assert sorted(os.listdir(tmp_path)) == ["artifact"]  # the old one is gone, not aside


def test_an_earlier_export_with_a_users_file_beside_it_is_refused(tmp_path):
    """Choice: refused (not merged), so that nothing of the user's is ever deleted and an
    export directory holds only what its manifest lists."""
    out = tmp_path / "artifact"
    _export(out, "first")
    (out / "notes.txt").write_text("mine")
    (out / "tokenizer" / "mine.txt").write_text("mine too")
    (out / "empty").mkdir()
    before = _tree(out)
    with pytest.raises(UserError, match="holds files the earlier export there did not write: "):
        export.export_run("no-run", str(out))
    with pytest.raises(UserError, match="notes.txt, tokenizer/mine.txt, empty;"):
        artifact_dir.check_output(str(out))
    assert _tree(out) == before


@pytest.mark.parametrize(
    "manifest",
    [
        {"files": ["ctc.stablehlo", "manifest.json"]},  # no mark: not written by an export
        {"artifact": artifact_dir.ARTIFACT, "files": "ctc.stablehlo"},
        {"artifact": artifact_dir.ARTIFACT, "files": ["../thesis.tex", "ctc.stablehlo"]},
        ["not", "an", "object"],
    ],
)
def test_a_manifest_that_is_not_ours_proves_nothing(tmp_path, manifest):
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "ctc.stablehlo").write_text("x")
    with pytest.raises(UserError, match="holds files no export wrote: ctc.stablehlo, manifest"):
        artifact_dir.check_output(str(out))


def test_a_file_that_appears_during_an_export_is_kept(tmp_path, monkeypatch):
    out = tmp_path / "artifact"
    _export(out, "first")
    real = artifact_dir.check_output

    def then_a_file_appears(output):
        real(output)
        (out / "late.txt").write_text("written while the export ran")

    monkeypatch.setattr(artifact_dir, "check_output", then_a_file_appears)
    with pytest.raises(UserError, match=r"exported to .*: late\.txt"):
        _export(out, "second")
    assert (out / "ctc.stablehlo").read_text() == "second"
    (old,) = [p for p in tmp_path.iterdir() if p.name != "artifact"]
    assert _tree(old) == {"late.txt": b"written while the export ran"}


def test_an_earlier_export_whose_files_lead_out_is_refused(tmp_path):
    """A listed name reached through a symlink out of the directory (here its tokenizer/)
    is not the export's to delete: refused, and the directory it leads to is untouched."""
    out = tmp_path / "artifact"
    _export(out, "first")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "tokenizer.json").write_text("keep")
    os.remove(out / "tokenizer" / "tokenizer.json")
    os.rmdir(out / "tokenizer")
    (out / "tokenizer").symlink_to(tmp_path / "precious")
    with pytest.raises(UserError, match="holds files no export wrote: ctc.stablehlo"):
        _export(out, "second")
    assert (tmp_path / "precious" / "tokenizer.json").read_text() == "keep"
    assert (out / "ctc.stablehlo").read_text() == "first"
