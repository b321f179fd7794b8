"""A run's assets from its corpus: a corpus without the training split says which split
is missing and which are there (it once said "not a prepared corpus")."""

import pytest

from configs import demo
from jaxspeech.common.errors import UserError
from jaxspeech.runs import assets


def test_a_missing_training_split_is_named_with_the_splits_present(tmp_path):
    data = tmp_path / "corpus"
    (data / assets.TOKENIZER).mkdir(parents=True)
    for split in ("test", "dev"):
        (data / split).mkdir()
        (data / split / "index.json").write_text("{}")
    (data / "notes").mkdir()  # not a split: no index.json
    config = demo.get_config("tiny")
    config.data.dir = str(data)
    with pytest.raises(UserError) as e:
        assets.install_assets(config, str(tmp_path / "run"))
    split = config.data.train_split
    assert str(e.value) == (
        f"data.dir={str(data)!r} has no split {split!r} (data.train_split); its prepared "
        "splits: dev, test"
    )
    assert not (tmp_path / "run").exists()
