"""Input pipeline throughput with every host-side augmentation on, against the train step.

`python benchmarks/input_pipeline.py [--quick] [--data DIR] [--num_workers N]` measures,
in one run on the current machine:

  loader_audio_s_per_s  seconds of real (unpadded) audio per wall second that the demo's
                        Grain train pipeline delivers with speed perturbation (0.9/1.0/1.1),
                        additive noise (every utterance) and simulated-RIR reverberation
                        (every utterance): read, decode, augment, tokenize, pad, batch;
  train_audio_s_per_s   seconds of real audio per wall second that the demo's jitted train
                        step (configs/demo.py: Conformer-CTC, one device) consumes, on batches
                        of the same shapes, after every shape is compiled;
  ratio                 loader / train. Goal: >= 5, so that the loader needs at most a
                        fifth of the host's time and never starves the step;
  store                 the same corpus uploaded to an S3 server on 127.0.0.1 (moto's,
                        benchmarks/lib/store_servers.py) and read from it the way training
                        reads a `data.dir=s3://...`: the split mirrored into the local cache
                        (jaxspeech.common.storage, MB/s and audio s/s of the download), then the
                        loader on the mirror, beside the loader on the disk copy;
  loader_speed_only     the loader with speed perturbation only (no noise, no reverb);
  per_host_projection   the one-process loader rates (one core) times 16 cores, against
                        30,000 audio s/s per host (8 GPUs' worth of Conformer-L steps). A
                        projection: Grain's worker processes scale it, up to the host's
                        memory bandwidth, which one core does not measure.

The two are timed one after the other, not concurrently, so each has the machine to itself.
The corpus is synthetic noise with the demo corpus's durations (0.9-6.2 s), written as
ArrayRecord shards into a temporary directory, unless `--data` names a prepared data
directory (e.g. data/demo/shards). `--no_store` leaves out the object-store part. Prints
a table and writes `benchmarks/results/input_pipeline.json`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from array_record.python.array_record_module import ArrayRecordWriter

from configs import demo
from jaxspeech.audio import augment
from jaxspeech.config import build
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer, train_char_tokenizer
from jaxspeech.parallel import rules
from jaxspeech.training import batch as batch_lib
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results, store_servers  # noqa: E402

HOST_CORES, HOST_GOAL = 16, 30_000  # a 16-core GPU host; 8 GPUs' worth of Conformer-L
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
WORDS = "the a speech model of recognition train data audio loader step fast shard".split()


def synth_corpus(root: str, num_utterances: int, sample_rate: int, seed: int = 0) -> None:
    """Noise utterances with demo-like durations, 2 shards, an index and a char tokenizer."""
    rng = np.random.default_rng(seed)
    split_dir = os.path.join(root, "train")
    os.makedirs(split_dir)
    durations = np.clip(rng.lognormal(np.log(2.4), 0.4, num_utterances), 0.9, 6.2)
    texts, shards, all_durations = [], [], []
    for s in range(2):
        name = f"train-{s:05d}-of-00002.array_record"
        writer = ArrayRecordWriter(os.path.join(split_dir, name), "group_size:1")
        mine = durations[s::2]
        for i, d in enumerate(mine):
            audio = (rng.standard_normal(int(d * sample_rate)) * 3000).astype(np.int16)
            # ~14 characters per second, like the demo's espeak speech.
            text = " ".join(rng.choice(WORDS, max(1, int(d * 2.5))))
            texts.append(text)
            writer.write(
                records.encode_record(
                    id=f"u{s}-{i:05d}", audio=audio, sample_rate=sample_rate, text=text, speaker="s"
                )
            )
            all_durations.append(len(audio) / sample_rate)
        writer.close()
        seconds = float(np.sum(np.round(mine * sample_rate).astype(int)) / sample_rate)
        shards.append({"path": name, "num_records": len(mine), "seconds": seconds})
    records.write_split_index(
        split_dir, shards, np.asarray(all_durations), {"sample_rate": sample_rate}
    )
    train_char_tokenizer(texts).save(os.path.join(root, "tokenizer"))


def real_seconds(batch: dict, sample_rate: int) -> float:
    """Seconds of audio in the rows that carry an utterance (weight or label overflow)."""
    real = (batch["weight"] > 0) | (batch["label_overflow"] > 0)
    return float(batch["audio_len"][real].sum()) / sample_rate


def train_pipeline(data_dir: str, spec, seed: int, **kw) -> pipeline_lib.Pipeline:
    """The demo's train pipeline over ``data_dir`` (``kw``: workers, prefetch, augmentation)."""
    return pipeline_lib.make_pipeline(
        data_dir=data_dir,
        split="train",
        tokenizer_dir=os.path.join(data_dir, "tokenizer"),
        spec=spec,
        seed=seed,
        train=True,
        **kw,
    )


def time_loader(pipe: pipeline_lib.Pipeline, num_batches: int, sample_rate: int) -> dict:
    """Audio seconds per second delivered by the pipeline's iterator, from its creation (so
    starting worker processes, building the RIR bank and filling the prefetch buffer are
    paid for, not hidden)."""
    t0, audio_s = time.perf_counter(), 0.0
    it = pipe.iterator()
    for _ in range(num_batches):
        audio_s += real_seconds(next(it), sample_rate)
    wall = time.perf_counter() - t0
    return {"batches": num_batches, "audio_s": audio_s, "wall_s": wall, "rate": audio_s / wall}


def time_train_step(config, data_dir: str, spec, num_steps: int) -> dict:
    """Audio seconds per second consumed by the demo's jitted train step, one device."""
    with rules.axis_rules(build.rules_from_config(config)):
        return _time_train_step(config, data_dir, spec, num_steps)


def _time_train_step(config, data_dir: str, spec, num_steps: int) -> dict:
    mesh = build.mesh_from_config(config)
    tokenizer = Tokenizer.load(os.path.join(data_dir, "tokenizer"))
    num_bins = config.features.num_mel_bins
    # Parameters of config.seed, identity feature statistics, the config's optimizer.
    state, setup = state_lib.init_train_state(
        config,
        tokenizer.vocab_size,
        mesh,
        np.zeros(num_bins, np.float32),
        np.ones(num_bins, np.float32),
    )
    step_fn = jax.jit(
        step_lib.make_train_step(
            setup.spec.graphdef, setup.tx, config.seed, tokenizer.blank_id, config.loss
        ),
        out_shardings=(setup.shardings, None),
        donate_argnums=(0,),
    )
    # The batches the step would see, without augmentation (the same shapes), preloaded.
    pipe = train_pipeline(data_dir, spec, config.seed)
    keys = tuple(batch_lib.BATCH_RANKS)
    batches = [{k: pipe.load(pipe.plan[i])[k] for k in keys} for i in range(num_steps)]

    def at_step_0(state: state_lib.TrainState) -> state_lib.TrainState:
        # A fresh array each time (the state is donated), laid out like the state's step.
        return state.replace(step=jax.device_put(jnp.int32(0), setup.shardings.step))

    t0 = time.perf_counter()
    for bucket in sorted({pipe.plan[i].bucket for i in range(num_steps)}):  # Compile each.
        first = next(i for i in range(num_steps) if pipe.plan[i].bucket == bucket)
        state, m = step_fn(at_step_0(state), batches[first])
        jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    state = at_step_0(state)  # the timed steps are 0, 1, ... as in training
    audio_s, wall = 0.0, 0.0
    for batch in batches:
        t = time.perf_counter()
        state, m = step_fn(state, batch)
        jax.block_until_ready(m)
        wall += time.perf_counter() - t
        audio_s += real_seconds(batch, spec.sample_rate)
    return {
        "steps": num_steps,
        "audio_s": audio_s,
        "wall_s": wall,
        "rate": audio_s / wall,
        "compile_s": compile_s,
    }


def time_store(data_dir: str, spec, seed: int, num_batches: int, sample_rate: int, **kw) -> dict:
    """Uploads ``data_dir``'s train split and tokenizer to a fresh local S3 server, mirrors
    them into an empty cache as a training job does, and times the loader on the mirror."""
    from jaxspeech.common import storage

    with tempfile.TemporaryDirectory() as cache, store_servers.s3_server() as endpoint:
        saved = {k: os.environ.get(k) for k in store_servers.s3_env(endpoint, cache)}
        os.environ.update(store_servers.s3_env(endpoint, cache))
        try:
            url = "s3://jaxspeech-bench/corpus"
            storage.filesystem(url)[0].mkdir("jaxspeech-bench")
            t0 = time.perf_counter()
            for sub in ("tokenizer", "train"):
                storage.upload_dir(os.path.join(data_dir, sub), storage.join(url, sub))
            upload_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            local = storage.local_data(url, "tokenizer", "train")
            mirror_s = time.perf_counter() - t0
            index = records.read_split_index(local, "train")
            size = sum(os.path.getsize(p) for p in index.shard_paths)
            loader = time_loader(train_pipeline(local, spec, seed, **kw), num_batches, sample_rate)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
    return {
        "server": "moto_server on 127.0.0.1",
        "shard_mb": size / 1e6,
        "corpus_audio_s": index.seconds,
        "upload_s": upload_s,
        "mirror_s": mirror_s,
        "mirror_mb_per_s": size / 1e6 / mirror_s,
        "mirror_audio_s_per_s": index.seconds / mirror_s,
        "loader": loader,
    }


def measure(args: argparse.Namespace, config, data_dir: str) -> dict:
    """Every timing of one run on ``data_dir``: loaders, the object store, the train step."""
    sr = config.features.sample_rate
    loader_batches, train_steps = (40, 12) if args.quick else (200, 60)
    spec = pipeline_lib.make_bucket_spec(
        config.data.bucket_boundaries,
        config.data.batch_seconds,
        config.data.max_tokens_per_second,
        sr,
    )
    aug_cfg = augment.WaveformAugmentConfig(
        speeds=(0.9, 1.0, 1.1), noise_prob=1.0, reverb_prob=1.0, seed=config.seed
    )
    # Speed perturbation only (no noise, no reverberation): the recipes' usual load.
    speed_cfg = augment.WaveformAugmentConfig(speeds=aug_cfg.speeds, seed=config.seed)

    def loader_kw(cfg: augment.WaveformAugmentConfig) -> dict:
        return dict(
            num_workers=args.num_workers,
            prefetch=config.data.prefetch,
            speeds=cfg.speeds,
            augment=augment.WaveformAugmenter(cfg, sr),  # a fresh one: the same draws
        )

    def timed(cfg: augment.WaveformAugmentConfig) -> dict:
        pipe = train_pipeline(data_dir, spec, config.seed, **loader_kw(cfg))
        return time_loader(pipe, loader_batches, sr)

    loader, plain = timed(aug_cfg), timed(speed_cfg)
    store = None
    if not args.no_store:
        store = time_store(data_dir, spec, config.seed, loader_batches, sr, **loader_kw(aug_cfg))
    train = time_train_step(config, data_dir, spec, train_steps)
    one_core = args.num_workers == 0  # the loader's rate is then one core's
    return {
        "benchmark": "input_pipeline",
        **environment.jax_host(),
        "data": args.data or "synthetic",
        "num_workers": args.num_workers,
        "augmentation": {
            "speeds": list(aug_cfg.speeds),
            "noise_prob": aug_cfg.noise_prob,
            "reverb_prob": aug_cfg.reverb_prob,
        },
        "loader": loader,
        "loader_speed_only": plain,
        "train": train,
        "loader_audio_s_per_s": loader["rate"],
        "train_audio_s_per_s": train["rate"],
        "ratio": loader["rate"] / train["rate"],
        "store": store,
        "per_host_projection": {
            "cores": HOST_CORES,
            "audio_s_per_s": loader["rate"] * HOST_CORES if one_core else None,
            "speed_only_audio_s_per_s": plain["rate"] * HOST_CORES if one_core else None,
            "goal_audio_s_per_s": HOST_GOAL,
        },
    }


def print_result(result: dict) -> None:
    """The table and the summary lines."""
    loader, plain, store = result["loader"], result["loader_speed_only"], result["store"]
    print("| stage | batches | audio s | wall s | audio s / s |")
    print("|---|---|---|---|---|")
    rows = [
        ("loader from disk (all augmentation)", loader),
        ("loader from disk (speed perturbation only)", plain),
        ("demo train step", result["train"]),
    ]
    if store is not None:
        rows.insert(1, ("loader from the S3 mirror (all augmentation)", store["loader"]))
    for name, r in rows:
        n = r.get("batches", r.get("steps"))
        print(f"| {name} | {n} | {r['audio_s']:.0f} | {r['wall_s']:.1f} | {r['rate']:.1f} |")
    print(f"ratio loader / train: {result['ratio']:.1f} (goal >= 5)")
    if store is not None:
        print(
            f"S3 mirror: {store['shard_mb']:.0f} MB of shards in {store['mirror_s']:.1f} s "
            f"({store['mirror_mb_per_s']:.0f} MB/s, {store['mirror_audio_s_per_s']:.0f} "
            "audio s/s), once per host"
        )
    if result["per_host_projection"]["audio_s_per_s"] is not None:
        for name, rate in (("all augmentation", loader["rate"]), ("speed only", plain["rate"])):
            print(
                f"per host, projected, {name}: {rate:.0f} audio s/s per core x {HOST_CORES} "
                f"= {rate * HOST_CORES:.0f} (goal >= {HOST_GOAL})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and steps")
    parser.add_argument("--data", default=None, help="a prepared data dir (default: synthetic)")
    parser.add_argument("--num_workers", type=int, default=0, help="Grain worker processes")
    parser.add_argument("--no_store", action="store_true", help="no object-store part")
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.
    config = demo.get_config()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            data_dir = tmp
            synth_corpus(tmp, 400 if args.quick else 1500, config.features.sample_rate)
        result = measure(args, config, data_dir)
    print_result(result)
    if not math.isfinite(result["ratio"]):
        raise SystemExit("no audio was timed")
    results.save_result(os.path.join(RESULTS, "input_pipeline.json"), result)


if __name__ == "__main__":
    main()
