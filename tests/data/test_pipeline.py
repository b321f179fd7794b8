"""Batch plan, loading and Grain iterator state of jaxspeech.data.pipeline."""

import os

import numpy as np
import pytest
from absl import flags
from array_record.python.array_record_module import ArrayRecordWriter

from jaxspeech.data import pipeline as pl
from jaxspeech.data import records
from jaxspeech.data.tokenizer import train_char_tokenizer

SR = 16000
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def write_corpus(root, split="train", n=37, num_shards=3, seed=0, long_ones=2):
    """n utterances of random noise (0.5-5 s) + `long_ones` of 9 s, in shards, with an index."""
    rng = np.random.default_rng(seed)
    split_dir = os.path.join(root, split)
    os.makedirs(split_dir, exist_ok=True)
    durs = list(rng.uniform(0.5, 5.0, n)) + [9.0] * long_ones
    utts = []
    for i, d in enumerate(durs):
        text = " ".join(rng.choice(WORDS, rng.integers(1, 5)))
        audio = (rng.standard_normal(int(d * SR)) * 3000).astype(np.int16)
        utts.append((f"utt{i:03d}", audio, text))
    shards, all_durs = [], []
    for s in range(num_shards):
        name = f"{split}-{s:05d}-of-{num_shards:05d}.array_record"
        w = ArrayRecordWriter(os.path.join(split_dir, name), "group_size:1")
        mine = utts[s::num_shards]
        for uid, audio, text in mine:
            w.write(
                records.encode_record(id=uid, audio=audio, sample_rate=SR, text=text, speaker="s")
            )
            all_durs.append(len(audio) / SR)
        w.close()
        shards.append(
            {
                "path": name,
                "num_records": len(mine),
                "seconds": sum(len(a) for _, a, _ in mine) / SR,
            }
        )
    records.write_split_index(split_dir, shards, np.array(all_durs), {"sample_rate": SR})
    tok = train_char_tokenizer([t for _, _, t in utts])
    tok.save(os.path.join(root, "tokenizer"))
    by_id = {uid: (audio, text) for uid, audio, text in utts}
    return by_id


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("corpus"))
    return root, write_corpus(root)


def spec(multiple_of=1, tps=30.0):
    return pl.make_bucket_spec([2.0, 3.5, 6.0], 12.0, tps, SR, multiple_of=multiple_of)


def test_bucket_spec_sizes_and_shapes():
    s = pl.make_bucket_spec([2.0, 4.0, 8.0], 16.0, 20.0, SR, multiple_of=4)
    assert s.batch_sizes == (8, 4, 4)  # 16/8 = 2 rounds up to the multiple, 4
    assert s.max_labels == (40, 80, 160)
    assert s.shapes() == [(8, 32000, 40), (4, 64000, 80), (4, 128000, 160)]
    with pytest.raises(ValueError):
        pl.make_bucket_spec([4.0, 2.0], 16.0, 20.0, SR)
    np.testing.assert_array_equal(
        pl.assign_buckets(np.array([0.1, 2.0, 2.1, 8.0, 8.5]), [2.0, 4.0, 8.0]), [0, 0, 1, 2, -1]
    )


def test_plan_covers_each_utterance_once_per_epoch(corpus):
    root, _ = corpus
    index = records.read_split_index(root, "train")
    plan = pl.BatchPlan(index.durations, spec(), seed=3, shuffle=True)
    assert len(plan.too_long) == 2
    for epoch in range(2):
        seen = []
        for step in range(epoch * plan.batches_per_epoch, (epoch + 1) * plan.batches_per_epoch):
            bucket, idx = plan[step]
            assert len(idx) == plan.spec.batch_sizes[bucket]
            real = idx[idx != pl.PAD_INDEX]
            assert np.all(index.durations[real] <= plan.spec.boundaries[bucket])
            seen += real.tolist()
        assert sorted(seen) == sorted(set(range(index.num_records)) - set(plan.too_long.tolist()))
    # Deterministic from the seed, fresh order per epoch, and a different seed differs.
    again = pl.BatchPlan(index.durations, spec(), seed=3, shuffle=True)
    order = lambda p, e: [
        tuple(p[e * p.batches_per_epoch + i][1]) for i in range(p.batches_per_epoch)
    ]
    assert order(plan, 0) == order(again, 0)
    assert order(plan, 0) != order(plan, 1)
    assert order(plan, 0) != order(pl.BatchPlan(index.durations, spec(), seed=4, shuffle=True), 0)


def test_process_slices_are_disjoint_and_cover_the_batch():
    idx = np.arange(12)
    parts = [pl.process_slice(idx, p, 3) for p in range(3)]
    np.testing.assert_array_equal(np.concatenate(parts), idx)
    with pytest.raises(ValueError):
        pl.process_slice(idx, 0, 5)


def test_load_batch_pads_and_tokenizes(corpus):
    root, by_id = corpus
    index = records.read_split_index(root, "train")
    pipe = pl.make_pipeline(
        data_dir=root,
        split="train",
        tokenizer_dir=os.path.join(root, "tokenizer"),
        spec=spec(),
        seed=0,
        train=False,
    )
    tok = pipe.load.tokenizer
    seen = 0
    for step in range(len(pipe.plan)):
        bucket, idx = pipe.plan[step]
        batch = pipe.load(pipe.plan[step])
        s = pipe.plan.spec.num_samples(bucket)
        assert batch["audio"].shape == (len(idx), s) and batch["audio"].dtype == np.float32
        for row, uid in enumerate(batch["id"]):
            if idx[row] == pl.PAD_INDEX:
                assert uid == "" and batch["weight"][row] == 0 and batch["label_len"][row] == 0
                continue
            audio, text = by_id[uid]
            n = batch["audio_len"][row]
            assert n == len(audio)
            np.testing.assert_array_equal(batch["audio"][row, :n], audio / 32768.0)
            assert np.all(batch["audio"][row, n:] == 0)
            ids = tok.encode(text)
            assert (
                batch["label_len"][row] == len(ids)
                and batch["labels"][row, : len(ids)].tolist() == ids
            )
            assert batch["weight"][row] == 1.0
            seen += 1
    assert seen == index.num_records - 2


def test_label_overflow_is_counted_not_truncated(corpus):
    root, _ = corpus
    pipe = pl.make_pipeline(
        data_dir=root,
        split="train",
        tokenizer_dir=os.path.join(root, "tokenizer"),
        spec=spec(tps=2.0),
        seed=0,
        train=False,
    )
    batches = [pipe.load(pipe.plan[i]) for i in range(len(pipe.plan))]
    overflow = sum(int(b["label_overflow"].sum()) for b in batches)
    assert overflow > 0
    for b in batches:
        assert np.all(b["weight"][b["label_overflow"] == 1] == 0)


def test_two_processes_read_disjoint_halves(corpus):
    root, _ = corpus
    tok = os.path.join(root, "tokenizer")
    pipes = [
        pl.make_pipeline(
            data_dir=root,
            split="train",
            tokenizer_dir=tok,
            spec=spec(2),
            seed=1,
            train=True,
            process_index=p,
            process_count=2,
        )
        for p in range(2)
    ]
    whole = pl.make_pipeline(
        data_dir=root, split="train", tokenizer_dir=tok, spec=spec(2), seed=1, train=True
    ).load
    for step in range(5):
        a, b = (p.load(p.plan[step]) for p in pipes)
        full = whole(pipes[0].plan[step])
        np.testing.assert_array_equal(np.concatenate([a["audio"], b["audio"]]), full["audio"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterator_state_restore_is_exact(corpus, num_workers):
    if num_workers and not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags
    root, _ = corpus
    make = lambda: pl.make_pipeline(
        data_dir=root,
        split="train",
        tokenizer_dir=os.path.join(root, "tokenizer"),
        spec=spec(),
        seed=5,
        train=True,
        num_workers=num_workers,
    )
    pipe = make()
    it = pipe.iterator()
    for _ in range(pipe.plan.batches_per_epoch - 2):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(6)]  # crosses the epoch boundary
    it2 = make().iterator()
    it2.set_state(state)
    got = [next(it2) for _ in range(6)]
    for e, g in zip(expected, got):
        for k in e:
            np.testing.assert_array_equal(e[k], g[k])
