"""data_prep.lm against references of its own: a brute-force ARPA backoff scorer written
here (every context's distribution sums to one), bigram probabilities worked out by hand,
and KenLM's own scorer reading the written file."""

import json
import math
import os
import random
import subprocess
import sys
from fractions import Fraction as F

import kenlm
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from data_prep import lm
from jaxspeech.data import records
from jaxspeech.data.tokenizer import normalize_text

# ---------------------------------------------------------------------------------------------
# A brute-force reader and scorer of ARPA text, independent of data_prep.lm
# ---------------------------------------------------------------------------------------------


def read_arpa(path):
    """(order, {n-gram tuple: (log10 p, log10 backoff or None)}) of an ARPA file."""
    table, declared, section = {}, {}, None
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[0] == "\\data\\" and lines[-2:] == ["\\end\\", ""]
    for line in lines[1:-2]:
        if line.startswith("ngram "):
            n, count = line[len("ngram ") :].split("=")
            declared[int(n)] = int(count)
        elif line.endswith("-grams:"):
            section = int(line[1:].split("-")[0])
        elif line:
            fields = line.split("\t")
            words = tuple(fields[1].split(" "))
            assert len(words) == section and words not in table
            table[words] = (float(fields[0]), float(fields[2]) if len(fields) > 2 else None)
    for n, count in declared.items():
        assert sum(len(g) == n for g in table) == count
    return max(declared), table


def log10_prob(table, order, history, word):
    """Standard backoff: log10 p(word | history) from the listed n-grams."""
    h = tuple(history)[-(order - 1) :] if order > 1 else ()  # the last N-1 words
    backoff = 0.0
    while h + (word,) not in table:
        assert h, f"{word!r} is not a unigram"
        backoff += table.get(h, (0.0, None))[1] or 0.0
        h = h[1:]
    return backoff + table[h + (word,)][0]


def score(table, order, sentence):
    """log10 p(<s> sentence </s>), out-of-vocabulary words read as <unk>."""
    words = [w if (w,) in table else "<unk>" for w in sentence.split()] + ["</s>"]
    history, total = ["<s>"], 0.0
    for w in words:
        total += log10_prob(table, order, history, w)
        history.append(w)
    return total


def random_corpus(seed=0, sentences=50, words=15):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(words)]
    weights = [1 / (i + 1) for i in range(words)]  # Zipf-like: some n-grams repeat
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(1, 8))) for _ in range(sentences)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{order: (ARPA path, report)} of the random corpus for orders 1..4."""
    root = tmp_path_factory.mktemp("lm")
    out = {}
    for order in (1, 2, 3, 4):
        path = str(root / f"o{order}.arpa")
        out[order] = path, lm.build_lm(random_corpus(), order, path)
    return out


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_context_distribution_sums_to_one(models, order):
    path, report = models[order]
    n, table = read_arpa(path)
    assert n == order and report["ngrams"] == {
        str(k): sum(len(g) == k for g in table) for k in range(1, order + 1)
    }
    vocab = [g[0] for g in table if len(g) == 1 and g != ("<s>",)]
    assert len(vocab) == 15 + 2  # the words, </s>, <unk>
    assert table[("<s>",)][0] == -99
    contexts = [()] + [g for g in table if len(g) < order]
    rng = random.Random(1)  # and some contexts never seen
    contexts += [tuple(rng.choices(vocab, k=rng.randint(1, 3))) for _ in range(20)]
    for h in contexts:
        total = sum(10 ** log10_prob(table, order, h, w) for w in vocab)
        assert abs(total - 1) < 1e-6, (h, total)
    if order > 1:  # the corpus is big enough for computed discounts at the higher orders
        assert report["discount_fallback"] != list(range(1, order + 1))


def test_hand_computed_bigram_model(tmp_path, capsys):
    corpus = ["a b c", "A  B c", "a b", "", "  ", "a d"]
    path = str(tmp_path / "lm.arpa")
    report = lm.build_lm(corpus, 2, path)
    assert (report["sentences"], report["skipped_empty"], report["words"]) == (4, 2, 10)
    assert report["vocabulary"] == 4 and report["discount_fallback"] == [1]
    assert "1-gram counts-of-counts n1..n4 = [4, 0, 1, 0]" in capsys.readouterr().err

    # Unigrams: continuation counts (distinct words before): a 1 (<s>), b 1 (a), c 1 (b),
    # d 1 (a), </s> 3 (c, b, d); 7 in all. Counts-of-counts 4, 0, 1, 0: no discounts, so
    # the fallback 1/2, 1, 3/2. Freed mass (4 * 1/2 + 3/2) / 7 = 1/2, spread over the 6
    # words a b c d </s> <unk>: 1/12 each.
    uni = {w: F(1, 2) / 7 + F(1, 12) for w in "abcd"}
    uni["</s>"] = (3 - F(3, 2)) / 7 + F(1, 12)
    uni["<unk>"] = F(1, 12)
    # Bigrams (raw): <s> a 4, a b 3, b c 2, c </s> 2, b </s> 1, a d 1, d </s> 1.
    # Counts-of-counts 3, 2, 1, 1: Y = 3/7, D1 = 1 - 2Y 2/3 = 3/7, D2 = 2 - 3Y 1/2 = 19/14,
    # D3+ = 3 - 4Y = 9/7.
    assert report["discounts"]["2"] == pytest.approx([3 / 7, 19 / 14, 9 / 7], abs=1e-6)
    d1, d2, d3 = F(3, 7), F(19, 14), F(9, 7)
    # gamma(h) = (sum of the discounts taken after h) / c(h .)
    gamma = {"<s>": d3 / 4, "a": (d3 + d1) / 4, "b": (d2 + d1) / 3, "c": d2 / 2, "d": d1 / 1}
    bi = {
        ("<s>", "a"): (4 - d3) / 4 + gamma["<s>"] * uni["a"],
        ("a", "b"): (3 - d3) / 4 + gamma["a"] * uni["b"],
        ("a", "d"): (1 - d1) / 4 + gamma["a"] * uni["d"],
        ("b", "c"): (2 - d2) / 3 + gamma["b"] * uni["c"],
        ("b", "</s>"): (1 - d1) / 3 + gamma["b"] * uni["</s>"],
        ("c", "</s>"): (2 - d2) / 2 + gamma["c"] * uni["</s>"],
        ("d", "</s>"): (1 - d1) / 1 + gamma["d"] * uni["</s>"],
    }
    expected = {
        (w,): (math.log10(p), math.log10(gamma[w]) if w in gamma else None) for w, p in uni.items()
    }
    expected[("<s>",)] = (-99.0, math.log10(gamma["<s>"]))
    expected |= {g: (math.log10(p), None) for g, p in bi.items()}  # no backoff at order N
    order, table = read_arpa(path)
    assert order == 2 and sorted(table) == sorted(expected)
    for g, (logp, logbo) in expected.items():  # a backoff only for contexts: not </s>, <unk>
        assert table[g][0] == pytest.approx(logp, abs=1e-7), g
        assert (table[g][1] is None) == (logbo is None), g
        assert logbo is None or table[g][1] == pytest.approx(logbo, abs=1e-7), g
    # An unseen bigram backs off: p(c | a) = gamma(a) p(c).
    assert 10 ** log10_prob(table, 2, ["a"], "c") == pytest.approx(gamma["a"] * uni["c"])


def test_discounts_from_counts_of_counts():
    # Y = 10 / 20; D1 = 1 - 2 Y 5/10, D2 = 2 - 3 Y 3/5, D3+ = 3 - 4 Y 2/3.
    assert lm.kn_discounts((10, 5, 3, 2)) == pytest.approx((0.5, 1.1, 3 - 4 / 3))
    assert lm.kn_discounts((4, 0, 1, 0)) is None  # a zero: undefined
    assert lm.kn_discounts((3, 2, 1, 0)) is None  # D3+ = 3: outside (0, 3)
    assert lm.kn_discounts((5, 1, 1, 1)) is None  # D2 = 2 - 15/7 < 0


@pytest.mark.parametrize("order", [2, 3, 4])
def test_kenlm_scores_sentences_as_the_backoff_scorer(models, order):
    path, _ = models[order]
    _, table = read_arpa(path)
    model = kenlm.Model(path)
    assert model.order == order
    corpus = random_corpus()
    sentences = corpus[:5] + ["", "w0 w0 w0 w0 w0", "w14 w13 w12 w1", "zebra w0 w1"]
    sentences += ["w2 quokka quokka w3", "W1 w2 unseen", " ".join(corpus[5:9])]
    for s in sentences:
        mine = score(table, order, normalize_text(s))
        assert model.score(normalize_text(s), bos=True, eos=True) == pytest.approx(
            mine, abs=1e-4
        ), s


def test_same_input_same_bytes_whatever_the_sentence_order(tmp_path):
    corpus = random_corpus(seed=3, sentences=200)
    paths = [str(tmp_path / f"{i}.arpa") for i in range(3)]
    lm.build_lm(corpus, 3, paths[0])
    lm.build_lm(iter(corpus), 3, paths[1])
    lm.build_lm(random.Random(0).sample(corpus, len(corpus)), 3, paths[2])
    blobs = [open(p, "rb").read() for p in paths]
    assert blobs[0] == blobs[1] == blobs[2]
    assert sorted(os.listdir(tmp_path)) == ["0.arpa", "1.arpa", "2.arpa"]  # no temp files


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    model = lm.estimate(lm.count_ngrams(["a b", "b a"], 2)[0], 2)

    def broken(model):
        yield "\\data\\\n"
        raise KeyboardInterrupt

    monkeypatch.setattr(lm, "arpa_lines", broken)
    with pytest.raises(KeyboardInterrupt):
        lm.write_arpa(model, str(tmp_path / "lm.arpa"))
    assert os.listdir(tmp_path) == []


def test_bad_requests_raise():
    with pytest.raises(lm.LMError, match="reserved word"):
        lm.count_ngrams(["a <s> b"], 2)
    for order in (0, 7):
        with pytest.raises(lm.LMError, match="from 1 to 6"):
            lm.count_ngrams(["a"], order)
    with pytest.raises(lm.LMError, match="no words"):
        lm.build_lm(["", " \t"], 3, "/nonexistent/never.arpa")


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def write_split(root, texts, split="train", sr=8000):
    """A prepared split of `texts` in two shards (short silent audio); a record that is not
    a record (`None` in texts) is written as garbage bytes."""
    split_dir = os.path.join(root, split)
    os.makedirs(split_dir)
    shards, durations = [], []
    for s, mine in enumerate((texts[::2], texts[1::2])):
        name = f"{split}-{s:05d}-of-00002.array_record"
        writer = ArrayRecordWriter(os.path.join(split_dir, name), "group_size:1")
        for i, text in enumerate(mine):
            audio = np.zeros(80, np.int16)
            if text is None:
                writer.write(b"not a record")
            else:
                writer.write(
                    records.encode_record(
                        id=f"{s}-{i}", audio=audio, sample_rate=sr, text=text, speaker="x"
                    )
                )
            durations.append(0.01)
        writer.close()
        shards.append({"path": name, "num_records": len(mine), "seconds": 0.01 * len(mine)})
    records.write_split_index(split_dir, shards, np.array(durations), {"sample_rate": sr})


def run_main(capsys, *args):
    code = lm.main(["lm", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_text_and_split_give_the_same_model(tmp_path, capsys):
    texts = random_corpus(seed=5, sentences=30)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(texts[:10]) + "\n\n", encoding="utf-8")
    b.write_text("\n".join(texts[10:]) + "\n", encoding="utf-8")
    code, out, _ = run_main(capsys, f"--text={a},{b}", "--output", str(tmp_path / "t.arpa"))
    assert code == 0
    report = json.loads(out)
    assert (report["sentences"], report["skipped_empty"], report["order"]) == (30, 1, 3)
    assert kenlm.Model(str(tmp_path / "t.arpa")).order == 3

    data = str(tmp_path / "data")
    write_split(data, texts[:7] + [None] + texts[7:])  # garbage lands in the second shard
    code, out, err = run_main(
        capsys, "--data", data, "--split", "train", "--output", str(tmp_path / "s.arpa")
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["sentences"] == 30 and report["unreadable_records"] == 1
    assert "1 unreadable records" in err and "corrupt record" in err
    # The split's record order differs from the files' line order: the model does not.
    assert (tmp_path / "s.arpa").read_bytes() == (tmp_path / "t.arpa").read_bytes()


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "exactly one source"),
        (["--text=X", "--data=D", "--split=train"], "exactly one source"),
        (["--data=D"], "--data and --split go together"),
        (["--split=train"], "--data and --split go together"),
        (["--text=X", "--order=0"], "--order must be from 1 to 6, got 0"),
        (["--text=X", "--order=7"], "--order must be from 1 to 6, got 7"),
        (["--text=X", "stray"], "unexpected arguments"),
        (["--text=X", "--order=three"], "order"),
    ],
)
def test_cli_usage_errors(tmp_path, capsys, args, message):
    out = tmp_path / "lm.arpa"
    code, stdout, err = run_main(capsys, f"--output={out}", *args)
    assert code == 2 and stdout == ""
    assert err.startswith("error: bad command line: ") and message in err
    assert not out.exists()


def test_cli_data_errors(tmp_path, capsys):
    out = tmp_path / "lm.arpa"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\t\n", encoding="utf-8")
    cases = [
        ([f"--text={empty}"], "no words (3 lines, all empty"),
        ([f"--text={tmp_path / 'missing.txt'}"], "missing.txt"),
        ([f"--data={tmp_path}", "--split=dev"], "no prepared split"),
    ]
    for args, message in cases:
        code, stdout, err = run_main(capsys, f"--output={out}", *args)
        assert code == 2 and stdout == "" and err.startswith("error: ") and message in err, err
        assert not out.exists()
    assert run_main(capsys)[0] == 2  # no --output


def test_cli_as_a_module(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat\nthe dog sat\n", encoding="utf-8")
    out = tmp_path / "lm.arpa"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "data_prep.lm", f"--text={text}", f"--output={out}", "--order=2"],
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ngrams"] == {"1": 7, "2": 6}
    assert kenlm.Model(str(out)).score("the cat sat") < 0


def test_a_lost_shard_is_counted_not_fatal(tmp_path, capsys):
    texts = [f"sentence number {i}" for i in range(9)]
    write_split(str(tmp_path), texts)
    index = records.read_split_index(str(tmp_path), "train")
    os.remove(index.shard_paths[1])  # its 4 records (the odd ones) are gone
    unreadable = lm.Unreadable()
    got = list(lm.read_sentences_from_split(str(tmp_path), "train", unreadable))
    assert got == texts[::2]
    assert unreadable.count == 4 and "missing" in unreadable.examples[0]
    assert "4 unreadable records" in capsys.readouterr().err
