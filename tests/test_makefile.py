"""`make demo`'s commands, read with `make -n` (nothing runs): every step reads and writes
the corpus and run that DEMO_DATA and DEMO_RUN name, so a second corpus (another natural
share, another size) is trained on, not the default one."""

import re
import shutil
import subprocess

import pytest

from tests.e2e.cli import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_steps_follow_demo_data_and_demo_run(tmp_path):
    data, run = tmp_path / "corpus", tmp_path / "run"
    out = subprocess.run(
        ["make", "-n", "demo", f"DEMO_DATA={data}", f"DEMO_RUN={run}", "DEMO_NATURAL_SHARE=0.25"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commands = re.sub(r"\\\n\s*", " ", out)  # one line per command
    train = [c for c in commands.splitlines() if "-m jaxspeech.train" in c]
    assert len(train) == 1 and f"--config.data.dir={data}/shards" in train[0], train
    assert f"--workdir {run}" in train[0]
    evaluate = [c for c in commands.splitlines() if "-m jaxspeech.evaluate" in c]
    assert len(evaluate) == 2
    assert all(f"--data {data}/shards" in c and f"--workdir {run}" in c for c in evaluate)
    synth = [c for c in commands.splitlines() if "-m data_prep.demo.synth" in c]
    assert len(synth) == 1 and f"--output {data}/raw" in synth[0]
    assert "--natural_share 0.25" in synth[0]
