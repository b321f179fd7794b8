"""colabs/*.ipynb run top to bottom, and are stored clean: no outputs, the Colab badge
pointing at their own file, the install cell second.

Each notebook runs in a fresh `python3` kernel whose working directory and TMPDIR are a
pytest tmp_path (the notebooks write their data under a temporary directory of their own,
never into the repository). The kernel inherits the rest of this process's environment
(JAX_PLATFORMS=cpu) with one CPU device, as on Colab's CPU runtime; 04_scale sets up its own
8 simulated devices. One test per notebook, so that pytest-xdist spreads them over its
workers. The notebooks that train run fewer steps here (SHORTER): the test is that every
cell runs; nothing checks how far the notebook's own step count learns.
"""

import os
import pathlib
import re

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.e2e.cli import QUICK_COMPILE_FLAGS

COLABS = pathlib.Path(__file__).resolve().parents[1] / "colabs"
NOTEBOOKS = sorted(COLABS.glob("*.ipynb"))
# Generous next to the longest cell (training in notebook 3, its compilations most of it:
# tens of seconds on 2 cores): a hung kernel fails its test instead of hanging the run.
CELL_TIMEOUT_S = 300
# {notebook: [(a line of its source, the line it runs as here)]}: the training runs cut to
# a few steps (each line must be found once); every cell still runs, and compiles, as is.
SHORTER = {
    "02_train.ipynb": [
        ("config.train.num_steps = 200", "config.train.num_steps = 20"),
        ("config.train.eval_every = 50  #", "config.train.eval_every = 10  #"),
    ],
    "03_decode.ipynb": [("config.train.num_steps = 150", "config.train.num_steps = 20")],
}
BADGE = (
    "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
    "(https://colab.research.google.com/github/jaxspeech/jaxspeech/blob/main/colabs/{name})"
)


def _ids(paths):
    return [p.name for p in paths]


def test_there_are_four_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_data.ipynb",
        "02_train.ipynb",
        "03_decode.ipynb",
        "04_scale.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stored_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: cell {i} has outputs; clear them"
            assert cell.execution_count is None, f"{path.name}: cell {i} has an execution count"
    first, second = nb.cells[0], nb.cells[1]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert BADGE.format(name=path.name) in first.source, f"{path.name}: badge missing or stale"
    # Every Colab link names this notebook's own file (a copied badge would not).
    for linked in re.findall(
        r"colab\.research\.google\.com/github/\S+?/colabs/([\w.]+)", first.source
    ):
        assert linked == path.name
    assert second.cell_type == "code", f"{path.name}: the second cell must install jaxspeech"
    for needed in (
        'importlib.util.find_spec("jaxspeech") is None',  # a no-op where jaxspeech imports
        '"clone", "--depth", "1", "https://github.com/jaxspeech/jaxspeech"',
        '"pip", "install"',
        "check=True",
        "sys.path.insert",  # the running kernel sees the clone
    ):
        assert needed in second.source, f"{path.name}: install cell lacks {needed}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, tmp_path, monkeypatch):
    # One CPU device, as on Colab's CPU runtime (tests/conftest.py's 8 simulated devices
    # would make the tiny training runs several times slower); 04_scale asks for 8 itself.
    # XLA's CPU backend without its expensive LLVM passes, as in every other test: most of
    # a notebook's time is compiling, and the results differ only by float rounding.
    monkeypatch.setenv("XLA_FLAGS", QUICK_COMPILE_FLAGS)
    nb = nbformat.read(path, as_version=4)
    for line, shorter in SHORTER.get(path.name, []):
        cells = [c for c in nb.cells if c.cell_type == "code" and line in c.source]
        assert len(cells) == 1 and cells[0].source.count(line) == 1, f"{path.name}: {line}"
        cells[0].source = cells[0].source.replace(line, shorter)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    try:
        # TMPDIR: the notebooks' temporary directories (corpus, shards, run) land in tmp_path,
        # which pytest cleans up, instead of piling up in the system's /tmp.
        client.execute(env=dict(os.environ, TMPDIR=str(tmp_path)))
    except CellExecutionError as e:  # its message shows the failing cell and the traceback
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
