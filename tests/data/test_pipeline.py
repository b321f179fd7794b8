"""Batch plan, loading and Grain iterator state of jaxspeech.data.pipeline."""

import os
import pickle

import numpy as np
import pytest
from absl import flags
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from jaxspeech.audio import augment
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


def test_plan_covers_each_utterance_once_per_epoch(corpus):
    root, _ = corpus
    index = records.read_split_index(root, "train")
    plan = pl.BatchPlan(index.durations, spec(), seed=3, shuffle=True)
    assert len(plan.too_long) == 2
    for epoch in range(2):
        seen = []
        for step in range(epoch * plan.batches_per_epoch, (epoch + 1) * plan.batches_per_epoch):
            bucket, idx = plan[step].bucket, plan[step].indices
            assert len(idx) == plan.spec.batch_sizes[bucket]
            real = idx[idx != pl.PAD_INDEX]
            assert np.all(index.durations[real] <= plan.spec.boundaries[bucket])
            if bucket:  # The smallest bucket that fits.
                assert np.all(index.durations[real] > plan.spec.boundaries[bucket - 1])
            seen += real.tolist()
        assert sorted(seen) == sorted(set(range(index.num_records)) - set(plan.too_long.tolist()))
    # Deterministic from the seed, fresh order per epoch, and a different seed differs.
    again = pl.BatchPlan(index.durations, spec(), seed=3, shuffle=True)
    order = lambda p, e: [
        tuple(p[e * p.batches_per_epoch + i].indices) for i in range(p.batches_per_epoch)
    ]
    assert order(plan, 0) == order(again, 0)
    assert order(plan, 0) != order(plan, 1)
    assert order(plan, 0) != order(pl.BatchPlan(index.durations, spec(), seed=4, shuffle=True), 0)


def test_plan_read_from_many_threads_equals_one_thread(monkeypatch):
    """Grain's read threads call plan[step] concurrently. With speed perturbation the plan
    counts epoch starts as it goes; unlocked, two threads appended the same start twice
    and later steps got other epochs' batches. A sleep inside the count (it releases the
    GIL) makes the interleaving that exposed it near certain."""
    import threading
    import time

    durations = np.random.default_rng(0).uniform(0.5, 5.5, 60)
    kw = dict(seed=1, shuffle=True, speeds=(0.9, 1.0, 1.1))
    want = pl.BatchPlan(durations, spec(), **kw)
    steps = 12 * want.batches_per_epoch
    expected = [(want[s].epoch, tuple(want[s].indices)) for s in range(steps)]
    plan = pl.BatchPlan(durations, spec(), **kw)
    count = pl.BatchPlan.batches_in_epoch
    monkeypatch.setattr(
        pl.BatchPlan, "batches_in_epoch", lambda self, e: (time.sleep(0.002), count(self, e))[1]
    )
    got = [None] * steps

    def read(first: int) -> None:
        for s in range(first, steps, 4):
            got[s] = (plan[s].epoch, tuple(plan[s].indices))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected
    # The lock is not pickled (Grain workers get their own): a copy plans the same.
    import pickle

    assert pickle.loads(pickle.dumps(plan))[steps - 1].epoch == expected[-1][0]


def test_owned_records_are_whole_shards_or_strided():
    counts = [3, 0, 4, 2, 5]
    parts = [pl.owned_records(counts, p, 2) for p in range(2)]
    np.testing.assert_array_equal(parts[0], [0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13])  # 0, 2, 4
    np.testing.assert_array_equal(parts[1], [7, 8])  # Shards 1 (empty) and 3.
    few = [pl.owned_records([3, 4], p, 3) for p in range(3)]  # Fewer shards than processes.
    np.testing.assert_array_equal(np.sort(np.concatenate(few)), np.arange(7))
    np.testing.assert_array_equal(few[1], [1, 4])


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
        bucket, idx = pipe.plan[step].bucket, pipe.plan[step].indices
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


def _pipe(root, process_index=0, process_count=1, **kw):
    args = dict(
        data_dir=root,
        split="train",
        tokenizer_dir=os.path.join(root, "tokenizer"),
        spec=spec(process_count),
        seed=1,
        train=True,
        process_index=process_index,
        process_count=process_count,
    )
    return pl.make_pipeline(**{**args, **kw})


def test_augmentation_starts_at_its_epoch(corpus):
    """Before augment_from_epoch every row is the record as stored (speed 1, no noise); from
    it on, speeds are drawn and the augmenter runs (noise on every row here)."""
    root, by_id = corpus
    cfg = augment.WaveformAugmentConfig(speeds=(0.9, 1.0, 1.1), noise_prob=1.0)
    pipe = _pipe(
        root,
        speeds=cfg.speeds,
        augment=augment.WaveformAugmenter(cfg, SR),
        augment_from_epoch=2,
        with_text=True,
    )
    plan = pipe.plan
    epochs = {s: plan[s].epoch for s in range(4 * plan.batches_per_epoch)}
    assert set(epochs.values()) >= {0, 1, 2}
    assert all(np.all(plan[s].speeds == 1.0) for s in epochs if epochs[s] < 2)
    assert any(np.any(plan[s].speeds != 1.0) for s in epochs if epochs[s] >= 2)
    for step in (0, min(s for s in epochs if epochs[s] == 2)):
        batch = pipe.load(plan[step])
        for row, uid in enumerate(batch["id"]):
            if not uid:
                continue
            stored = by_id[uid][0].astype(np.float32) / 32768.0
            got = batch["audio"][row, : batch["audio_len"][row]]
            same = len(got) == len(stored) and np.array_equal(got, stored)
            assert same == (plan[step].epoch < 2), (step, uid)


def test_short_first_phase_then_the_plan_as_without_it(corpus):
    """The curriculum: the first steps read only the utterances up to the phase's bucket
    boundary, each once a pass, with the same batch shape on both processes; its passes
    are the first epochs, so augmentation from epoch 1 starts in its second pass (the
    first is the records as stored). Then the plain plan from its step 0, batch for
    batch, its epochs counted after the phase's. Steps are stateless: a resume anywhere
    agrees."""
    root, by_id = corpus
    index = records.read_split_index(root, "train")
    cfg = augment.WaveformAugmentConfig(speeds=(0.9, 1.0, 1.1), noise_prob=1.0)
    kw = dict(speeds=cfg.speeds, augment=augment.WaveformAugmenter(cfg, SR), with_text=True)
    plain = [_pipe(root, p, 2, **kw) for p in range(2)]  # augmented from epoch 0
    phase = dict(short_first_steps=15, short_first_seconds=3.5, augment_from_epoch=1)
    pipes = [_pipe(root, p, 2, **kw, **phase) for p in range(2)]
    plans = [p.plan for p in pipes]
    assert isinstance(plans[0], pl.ShortFirstPlan) and plans[0].passes == 2
    assert len(plans[0]) == 15 + len(plain[0].plan)
    assert "the first 15 batches: only the" in pipes[0].describe()
    assert plans[0].spec == plain[0].plan.spec and plans[0].spec is plans[0].main.spec
    assert len(plans[0].too_long) == 2  # the two 9 s utterances, skipped as without it
    np.testing.assert_array_equal(plans[0].too_long, plain[0].plan.too_long)
    copy = pickle.loads(pickle.dumps(plans[0]))  # as Grain's worker processes get it
    assert copy.spec == plans[0].spec and np.array_equal(copy[20].indices, plans[0][20].indices)
    per_pass = plans[0].short.batches_per_epoch  # (the first pass: unperturbed)
    assert per_pass < 15
    seen = []
    for step in range(15):
        planned = [p[step] for p in plans]
        assert planned[0].bucket == planned[1].bucket <= 1  # buckets <= 3.5 s only
        for p, b in enumerate(planned):
            assert b.epoch == int(step >= per_pass) == plans[p].epoch_of(step)[0]
            assert np.all(b.speeds == 1.0) or b.epoch == 1
            real = b.indices[b.indices != pl.PAD_INDEX]
            assert np.all(index.durations[real] <= 3.5)
            if step < per_pass:
                seen += real.tolist()
        batch = pipes[0].load(planned[0])
        for row, uid in enumerate(batch["id"]):
            if uid:
                stored = by_id[uid][0].astype(np.float32) / 32768.0
                got = batch["audio"][row, : batch["audio_len"][row]]
                same = len(got) == len(stored) and np.array_equal(got, stored)
                assert same == (step < per_pass), (step, uid)  # noise on every row from epoch 1
    assert sorted(seen) == np.flatnonzero(index.durations <= 3.5).tolist()
    assert any(np.any(plans[0][s].speeds != 1.0) for s in range(per_pass, 15))
    for step in range(2 * plain[0].plan.batches_per_epoch):
        for p in range(2):
            want, got = plain[p].plan[step], plans[p][15 + step]
            assert (got.bucket, got.epoch) == (want.bucket, want.epoch + 2)
            np.testing.assert_array_equal(got.indices, want.indices)
            np.testing.assert_array_equal(got.speeds, want.speeds)
        epoch, position = plain[0].plan.epoch_of(step)
        assert plans[0].epoch_of(15 + step) == (epoch + 2, position)
    # A loader resumed inside the phase and one resumed after it read what the plan says.
    for start in (13, 16):
        resumed = next(iter(pipes[0].dataset(start)))
        np.testing.assert_array_equal(resumed["audio"], pipes[0].load(plans[0][start])["audio"])
    with pytest.raises(ValueError, match="must be one of the bucket boundaries"):
        _pipe(root, short_first_steps=15, short_first_seconds=3.0)
    tiny = pl.make_bucket_spec([0.25, 6.0], 12.0, 30.0, SR)  # no utterance is that short
    with pytest.raises(ValueError, match="no utterance of the split is <= 0.25s"):
        _pipe(root, spec=tiny, short_first_steps=15, short_first_seconds=0.25)
    short = pl.BatchPlan(index.durations, spec(2).prefix(2), seed=1, shuffle=True)
    with pytest.raises(ValueError, match="first of the main plan's"):
        pl.ShortFirstPlan(short, pl.BatchPlan(index.durations, spec(), seed=1, shuffle=True), 3)


@pytest.mark.parametrize("speeds", [(1.0,), (0.9, 1.0, 1.1)])
def test_two_processes_read_disjoint_shards_covering_everything(corpus, speeds):
    root, by_id = corpus
    index = records.read_split_index(root, "train")
    aug = augment.WaveformAugmenter(augment.WaveformAugmentConfig(speeds=speeds), SR)
    pipes = [_pipe(root, p, 2, speeds=speeds, augment=aug) for p in range(2)]
    # Process 0 opens shards 0 and 2, process 1 shard 1, and nothing else.
    assert [os.path.basename(x)[:11] for x in pipes[0].load.shard_paths] == [
        "train-00000",
        "train-00002",
    ]
    assert [os.path.basename(x)[:11] for x in pipes[1].load.shard_paths] == ["train-00001"]
    shard_of_record = np.repeat(np.arange(3), index.shard_num_records)
    for epoch in range(2):
        first = pipes[0].plan.epoch_of(0)[0] + sum(
            pipes[0].plan.batches_in_epoch(e) for e in range(epoch)
        )
        n = pipes[0].plan.batches_in_epoch(epoch)
        assert n == pipes[1].plan.batches_in_epoch(epoch)
        seen = [[], []]
        for step in range(first, first + n):
            planned = [p.plan[step] for p in pipes]
            assert planned[0].bucket == planned[1].bucket  # The same shape on every host.
            assert planned[0].epoch == planned[1].epoch == epoch
            for p in range(2):
                idx = planned[p].indices[planned[p].indices != pl.PAD_INDEX]
                assert set(shard_of_record[idx] % 2) <= {p}
                seen[p] += idx.tolist()
        assert not set(seen[0]) & set(seen[1])
        everything = sorted(seen[0] + seen[1])
        assert everything == sorted(set(range(index.num_records)) - set(pipes[0].plan.too_long))
    # Loading through each process's own shards gives the records the plan names, at the
    # planned speed (audio length exactly speed_perturbed_length).
    id_of = _ids_in_index_order(index)
    for p in range(2):
        for step in range(4):
            planned = pipes[p].plan[step]
            batch = pipes[p].load(planned)
            assert batch["audio"].shape == (
                pipes[p].plan.local_batch_sizes[planned.bucket],
                spec().num_samples(planned.bucket),
            )
            for row, i in enumerate(planned.indices):
                if i == pl.PAD_INDEX:
                    continue
                source = by_id[id_of[i]][0]
                n = augment.speed_perturbed_length(len(source), float(planned.speeds[row]))
                assert batch["audio_len"][row] == n
                if planned.speeds[row] == 1.0:
                    np.testing.assert_array_equal(batch["audio"][row, :n], source / 32768.0)


def _ids_in_index_order(index) -> list[str]:
    out = []
    for path in index.shard_paths:
        reader = ArrayRecordReader(path)
        out += [records.decode_header(b)["id"] for b in reader.read_all()]
        reader.close()
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterator_state_restore_is_exact(corpus, num_workers):
    """With every host-side augmentation on: speed, reverb, noise."""
    if num_workers and not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags
    root, _ = corpus
    cfg = augment.WaveformAugmentConfig(
        speeds=(0.9, 1.0, 1.1), noise_prob=1.0, reverb_prob=0.5, num_rirs=4
    )
    make = lambda: _pipe(
        root,
        seed=5,
        num_workers=num_workers,
        speeds=cfg.speeds,
        augment=augment.WaveformAugmenter(cfg, SR),
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
    # Noise and reverb did something: the same planned batch with speed perturbation only.
    speed_only = _pipe(
        root,
        seed=5,
        speeds=cfg.speeds,
        augment=augment.WaveformAugmenter(augment.WaveformAugmentConfig(speeds=cfg.speeds), SR),
    )
    step = pipe.plan.batches_per_epoch - 2
    plain = speed_only.load(speed_only.plan[step])
    np.testing.assert_array_equal(plain["audio_len"], expected[0]["audio_len"])
    assert not np.allclose(plain["audio"], expected[0]["audio"], atol=1e-3)


@pytest.mark.parametrize("speeds", [(1.0,), (0.9, 1.0, 1.1)])
def test_fixed_loader_shards_give_the_same_global_batches_on_any_process_count(corpus, speeds):
    """With data.loader_shards = 2, one process serving both loader shards sees exactly the
    global batches that two processes assemble (rows in process order), loaded data too."""
    root, _ = corpus
    aug = augment.WaveformAugmenter(augment.WaveformAugmentConfig(speeds=speeds), SR)
    kw = dict(speeds=speeds, augment=aug, loader_shards=2, spec=spec(2))
    one = _pipe(root, 0, 1, **kw)
    two = [_pipe(root, p, 2, **kw) for p in range(2)]
    assert len(one.load.shard_paths) == 3  # the lone process opens every file
    for step in range(2 * one.plan.batches_in_epoch(0)):
        whole = one.plan[step]
        halves = [p.plan[step] for p in two]
        assert whole.bucket == halves[0].bucket == halves[1].bucket
        np.testing.assert_array_equal(whole.indices, np.concatenate([h.indices for h in halves]))
        np.testing.assert_array_equal(whole.speeds, np.concatenate([h.speeds for h in halves]))
    for step in (0, 5):
        got = one.load(one.plan[step])
        parts = [p.load(p.plan[step]) for p in two]
        for k in set(got) - set(pl.HOST_KEYS):
            np.testing.assert_array_equal(got[k], np.concatenate([p[k] for p in parts]))
    # Default (one loader shard per process) is what the two-process test above checks; a
    # count that is not a multiple of the processes is refused.
    with pytest.raises(ValueError, match="multiple of the 2 processes"):
        _pipe(root, 0, 2, loader_shards=3, spec=spec(6))
