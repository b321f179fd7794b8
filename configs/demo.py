r"""Conformer-CTC on the synthetic espeak-ng demo corpus, on CPU.

Run (what `make demo` does after preparing data/demo/shards):
  python -m jaxspeech.train --config configs/demo.py --workdir runs/demo
  python -m jaxspeech.evaluate --workdir runs/demo --data data/demo/shards --split test

Variants (`--config configs/demo.py:NAME`):
  (default) 1,350 steps, 20.6 min of training on 2 CPU cores (goodput 90%: 80 s of
            compilation). Test CER 14.5% / WER 50.5% (3 held-out voices, unseen
            sentences), dev CER 14.2% / WER 50.7% (2 other held-out voices). Before the
            non-finite test in the step (another compiled program): 14.9% / 51.5%, dev
            14.1%; before that (other per-step random draws, 21.4 min): 14.1% / 50.7%,
            dev 14.0%;
            before the speaker-grouped shards and per-process loader: 14.7 / 14.7%.
  long      1,800 steps of the same recipe (not rerun with today's code; its earlier
            figure is in benchmarks/README.md, "Demo runs").
  ctc_rnnt  the same encoder with a transducer (stateless predictor, pruned RNN-T loss)
            plus the CTC loss at weight 0.3, decoded by RNN-T greedy search: 1,350
            steps (2026-11-26, 40507ab; 43.2 min while the test suite shared the cores).
            Test CER 10.3% / WER 36.5%, dev CER 10.4% / WER 36.7%; its CTC head alone
            (`--method ctc_greedy`): test CER 16.2% / WER 56.3%. The transducer's
            gradient reaches the encoder only gradually over rnnt_warmup_steps
            (loss.rnnt_encoder_warmup); without that the recipe left its blank plateau
            with some random draws and not with others.
  rnnt      the transducer alone: 1,350 steps (2026-11-26, 8bddb28; 27.9 min, the test
            suite sharing the cores for 14 of them). Test CER 11.5% / WER 38.3%, dev CER
            11.1% / WER 38.8%. Without a CTC head the simple joiner's acoustic half alone
            (k2's am-only lattice) teaches the encoder during rnnt_warmup_steps.
  streaming the same recipe as a streaming model: causal convolutions and chunked
            attention with a chunk size drawn per batch (dynamic chunks), evaluated
            in-loop at chunk 16. 1,350 steps at the default's ~785 ms per step when the
            machine is quiet (34.2 min measured while the test suite shared it). Decoded
            chunk by chunk (`evaluate --streaming --chunk_size C`): test CER 18.9% / WER
            61.6% at 16 frames (640 ms), 21.0% / 68.6% at 4 (160 ms); full context
            (`--chunk_size 0`) 18.0% / 60.2% (benchmarks/streaming.py).
  tiny      a seconds-long model for tests; accuracy is not a goal.

Recipe notes (each measured with a full run on the demo corpus; test/dev CER):
- No masking. Mild SpecAugment (2 x 10 frequency bins, 2 x 4% time) after 1,150 steps:
  18.8 / 17.3%; none after 1,350 steps: 15.3 / 14.5% (24 training voices, before the
  depthwise speed-up). Stronger masking underfits (train CER 19.1% vs dev 20.3%).
- The gap is unseen voices, not fitting: with no augmentation, 1,450 steps reach train
  CER 6.5% but test 16.1% / dev 16.1%; the VTLP frequency warp (+-10%) alone gave
  15.6 / 15.3%, and twice as many training voices (48, corpus version 2) with the
  warp 14.6 / 14.2% (1,400 steps, 26.0 min wall: too slow, hence 1,350).
- Six duration buckets instead of four: 88% of each batch is audio (was 82%).
- Averaging the last 8 checkpoints (every 50 steps) moved CER by < 0.4%: not used.
- A BPE-128 tokenizer learned slower per step than characters (utterance loss 119 vs
  76 at step 450); peak LR 3e-3 with 32 s batches stayed on the blank plateau far
  longer than 2e-3 with 64 s.
"""

from ml_collections import ConfigDict

from jaxspeech import search
from jaxspeech.parallel import rules

VARIANTS = ("default", "long", "tiny", "rnnt", "ctc_rnnt", "streaming")


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "default"
    if variant not in VARIANTS:
        raise ValueError(f"unknown configs/demo.py variant {variant!r}: use one of {VARIANTS}")
    c = ConfigDict()
    c.seed = 0  # every random stream (init, data order, SpecAugment) derives from it
    # A run directory (its latest checkpoint) or RUN/checkpoints/<step> whose parameters
    # start this run (fine-tuning); used only when the workdir has no checkpoint yet.
    c.init_from = ""

    c.data = ConfigDict()
    c.data.dir = "data/demo/shards"  # written by `python -m data_prep.prepare`
    c.data.train_split = "train"
    c.data.eval_split = "dev"  # scored periodically and at the end of training
    # Duration buckets (seconds): each shape costs one compilation (~10 s on CPU); six
    # buckets fill batches with 88% audio (four: 82%). The demo's utterances are
    # 0.9-6.2 s, half of them under 2.5 s.
    c.data.bucket_boundaries = (1.75, 2.25, 2.75, 3.5, 4.5, 6.25)
    # Evaluation compiles one decode per bucket; fewer, wider buckets cost less compile
    # time than they waste on padding (None = the training buckets).
    c.data.eval_bucket_boundaries = (3.0, 6.5)
    c.data.batch_seconds = 64.0  # padded audio per global batch; sets each bucket's batch size
    # Label padding per bucket = boundary * this. Even characters of fast espeak speech run
    # at < 20/s; rows over the limit are counted (label_overflow), never truncated.
    c.data.max_tokens_per_second = 30.0
    # Loader shards: the corpus is dealt to this many readers, each host serving an equal
    # run of them. 0 = one per process. A fixed count (a multiple of every process count
    # you will use) gives the same global batches on 1 host or N: a run can move between
    # host counts and replay exactly.
    c.data.loader_shards = 0
    c.data.num_workers = 0  # Grain worker processes; 0 reads in threads (enough for the demo)
    c.data.prefetch = 4  # batches read ahead
    # A record that cannot be read or decoded is skipped and counted; more distinct bad
    # records in one epoch than this fraction of the split stops the run with the worst
    # shards named (a damaged corpus, not a stray bad sector). 0.1%: a few bad chunks
    # in a large corpus pass, a bad disk does not.
    c.data.max_corrupt_fraction = 0.001
    # Read errors that may pass (network file systems, object-store mounts) are retried
    # this many times, waiting read_backoff_s, then 2x, 4x ...: 1+2+4 s rides out a
    # mount's hiccup without stalling a step for minutes. Then the record is skipped.
    c.data.read_retries = 3
    c.data.read_backoff_s = 1.0

    c.features = ConfigDict()
    c.features.sample_rate = 16000
    c.features.n_fft = 512
    c.features.win_length = 400  # 25 ms
    c.features.hop_length = 160  # 10 ms
    c.features.num_mel_bins = 80
    c.features.fmin = 0.0
    c.features.fmax = 8000.0
    c.features.log_floor = 1e-6

    c.specaug = ConfigDict()
    # In a 20-minute CPU run masking slows fitting more than it helps (see the header), so
    # the demo masks nothing and only warps the frequency axis (VTLP, +-10%): held-out
    # voices differ from train voices mostly in formant frequencies.
    c.specaug.enabled = True
    c.specaug.num_freq_masks = 0
    c.specaug.freq_mask_width = 10
    c.specaug.num_time_masks = 0
    c.specaug.time_mask_max_ratio = 0.04
    c.specaug.freq_warp = 0.1

    # Host-side waveform augmentation in the loader (Grain workers), before bucketing. The
    # demo's recipe was tuned without it (VTLP on device covers the voice mismatch, and the
    # synthetic speech is clean), so it is off; `tiny` turns all of it on for the tests.
    c.waveform_aug = ConfigDict()
    c.waveform_aug.speeds = (1.0,)  # Kaldi-style 3-way perturbation: (0.9, 1.0, 1.1)
    c.waveform_aug.noise_prob = 0.0  # share of utterances with additive noise
    c.waveform_aug.snr_db = (5.0, 20.0)  # uniform SNR range of that noise
    # JSON-lines {"audio_filepath": ...} (relative to the manifest) or a plain list of paths;
    # "" = generated white/pink/brown noise.
    c.waveform_aug.noise_manifest = ""
    c.waveform_aug.noise_exponents = (0.0, 1.0, 2.0)  # colours of generated noise (1/f^e)
    c.waveform_aug.reverb_prob = 0.0  # share of utterances convolved with a simulated RIR
    c.waveform_aug.num_rirs = 64  # simulated rooms in the bank (built once per worker, ~25 ms)
    c.waveform_aug.rt60 = (0.2, 0.8)  # seconds: living room to hall

    c.model = ConfigDict()
    c.model.encoder = "conformer"  # conformer | lstm (jaxspeech.models.ENCODERS)
    # ctc | rnnt | ctc+rnnt (transducer with a CTC auxiliary loss on the encoder)
    c.model.head = "ctc"
    c.model.dtype = "float32"  # bf16 is slower than f32 on CPU
    c.model.conformer = ConfigDict()
    c.model.conformer.dim = 144
    c.model.conformer.num_layers = 8
    c.model.conformer.num_heads = 4
    c.model.conformer.ff_mult = 4
    c.model.conformer.conv_kernel = 15
    c.model.conformer.subsampling_channels = 64  # small: the 2nd conv dominates FLOPs otherwise
    c.model.conformer.scan_layers = True  # compile one block, not 8: ~12 s per batch shape, not ~38
    c.model.conformer.dropout = 0.0  # dropout's random bits cost ~25% of a CPU step
    # 4: 40 ms frames (Gulati et al.). 8 (a third stride-2 conv) halves the blocks' frames,
    # but 12.5 frames/s is fewer than the characters of fast espeak speech (up to ~20/s),
    # and CTC needs a frame per label.
    c.model.conformer.subsampling_factor = 4
    # What each block keeps for the backward pass: none | full (recompute the block) |
    # dots (keep only weight-matmul outputs). A 144-dim model's activations fit in CPU
    # memory, so recomputation would only cost time.
    c.model.conformer.remat = "none"
    # Streaming (see jaxspeech/models/conformer.py); all off: the demo is scored on whole
    # utterances, and full context is the more accurate model. causal: depthwise
    # convolutions see only past frames.
    c.model.conformer.causal = False
    # Chunked attention: subsampled frames attend within chunks of chunk_size frames and
    # left_chunks chunks before (-1 = all of them); chunk_size 0 = full context.
    c.model.conformer.chunk_size = 0
    c.model.conformer.left_chunks = -1
    # Training draws a chunk size per batch (full context half the time, else uniform on
    # 1..max_dynamic_chunk), so one model serves any chunk size; 25 frames (1 s at x4) as
    # in WeNet.
    c.model.conformer.dynamic_chunk = False
    c.model.conformer.max_dynamic_chunk = 25
    c.model.lstm = ConfigDict()  # used when model.encoder = "lstm"
    c.model.lstm.hidden = 320
    c.model.lstm.num_layers = 4
    c.model.lstm.bidirectional = True
    c.model.lstm.proj_dim = 0
    c.model.lstm.stack_frames = 4  # 40 ms frames, like the Conformer's x4 subsampling
    c.model.lstm.lookahead = 0
    c.model.lstm.dropout = 0.0
    c.model.lstm.output_dim = 0  # width of the encodings the heads see; 0 = hidden
    # Transducer parts (model.head containing "rnnt"): icefall's stateless predictor is as
    # accurate as an LSTM one and its decoding state is just the last labels.
    c.model.transducer = ConfigDict()
    c.model.transducer.predictor = "stateless"  # stateless | lstm
    c.model.transducer.predictor_dim = 256
    c.model.transducer.context_size = 2  # labels the stateless predictor sees
    c.model.transducer.lstm_layers = 1
    c.model.transducer.lstm_hidden = 0  # 0 = predictor_dim
    c.model.transducer.joiner_dim = 256

    c.loss = ConfigDict()
    # "pruned" (k2): a linear joiner bounds each frame to prune_range labels and the full
    # joiner runs only there; "full": the exact lattice, chunked (more memory and time).
    c.loss.rnnt = "pruned"
    c.loss.prune_range = 5
    c.loss.simple_scale = 0.5  # weight of the linear joiner's loss after warm-up
    # Over the first steps the simple loss weighs 1 -> simple_scale and the pruned one
    # 0.1 -> 1: the pruning bounds are meaningless until the simple joiner has learned.
    c.loss.rnnt_warmup_steps = 300
    c.loss.ctc_weight = 0.3  # CTC auxiliary weight when model.head = "ctc+rnnt"
    # The transducer's gradient reaches the encoder 0 -> 1 over rnnt_warmup_steps, and an
    # acoustic-only loss teaches the encoder its first alignments: CTC (ctc+rnnt), else the
    # simple joiner's acoustic half alone (rnnt). Without it the transducer flattened the
    # encoder output before any alignment formed and the recipes left their blank plateau
    # only with lucky random draws (jaxspeech.step).
    c.loss.rnnt_encoder_warmup = True
    c.loss.frames_per_chunk = 16  # full loss: frames whose joiner logits exist at once

    c.decoding = ConfigDict()
    # ctc_greedy | ctc_beam | rnnt_greedy | rnnt_beam; "auto": the head's greedy decoder
    # (RNN-T when there is one).
    c.decoding.method = "auto"
    c.decoding.beam = 4
    c.decoding.max_symbols_per_frame = 3  # RNN-T greedy
    # Shallow fusion of a word n-gram LM (ARPA/KenLM file, `python -m data_prep.lm`) in
    # ctc_beam and rnnt_beam: score + lm_weight * ln P_lm(words) + word_bonus * words
    # (defaults tuned on the demo's dev set; see jaxspeech.search).
    c.decoding.lm_path = ""
    c.decoding.lm_weight = search.LM_WEIGHT
    c.decoding.word_bonus = search.WORD_BONUS
    # Decode a streaming Conformer chunk by chunk through its stream functions (equal to
    # the masked full pass; what a streaming server runs) instead of in one pass.
    c.decoding.streaming = False

    # How hypotheses are scored against references (evaluation, in-loop and standalone).
    c.scoring = ConfigDict()
    c.scoring.lowercase = False  # fold case before scoring
    c.scoring.remove_punctuation = False  # drop punctuation (apostrophes inside words stay)
    # word<TAB>replacement per line, applied to both sides ("" deletes the word); "" = none
    c.scoring.mapping_file = ""
    c.scoring.worst = 5  # the utterances with the most word errors, printed after a score
    c.scoring.bootstrap_samples = 1000  # resamples for the 95% interval of WER/CER; 0 = none

    c.optim = ConfigDict()
    c.optim.name = "adamw"
    c.optim.peak_lr = 2e-3
    c.optim.warmup_steps = 150
    c.optim.decay = "cosine"  # to end_lr_ratio * peak at num_steps
    c.optim.end_lr_ratio = 0.02
    c.optim.b1 = 0.9
    c.optim.b2 = 0.98
    c.optim.eps = 1e-9
    c.optim.weight_decay = 1e-3
    c.optim.clip_norm = 5.0

    # Semi-supervised training (README "Semi-supervised training"): a second stream of
    # batches mixed with the labeled train split by a schedule. With `targets` (the output
    # of `python -m jaxspeech.distill.targets` for `other_split`) its rows learn a teacher's
    # per-frame top-k distribution (CTC students with the teacher's frame rate and
    # vocabulary); without, `other_split` is a pseudo-labeled split (the targets job's
    # --pseudo_labels) trained like labeled data, for any head.
    c.distill = ConfigDict()
    c.distill.other_split = ""  # "" = off
    c.distill.other_dir = ""  # the data directory of other_split ("" = data.dir)
    c.distill.targets = ""  # the targets job's --output ("" = pseudo-label mode)
    # END:LABELED_EVERY phases: until END (a fraction of train.num_steps, or a step count) a
    # labeled batch every LABELED_EVERY steps (1: labeled only; 0: the other stream only).
    # The reference's scheduled learning ends on labeled data only, e.g. "0.8:4,1.0:1".
    c.distill.schedule = "0.8:4,1.0:1"
    c.distill.loss = "kl"  # kl | ce: against the teacher's reconstructed distribution
    # The probability outside the stored top-k: spread uniformly over the other tokens, or
    # dropped (the top-k renormalized).
    c.distill.rest = "spread"
    c.distill.temperature = 1.0  # of both distributions; the loss is scaled by its square
    c.distill.weight = 1.0  # of the per-frame soft-target loss against the per-token CTC loss

    c.train = ConfigDict()
    c.train.num_steps = 1350  # ~1 step/s on 2 cores: `make demo` fits 25 minutes
    c.train.run_steps = 0  # >0: stop this invocation after that many steps (then resume)
    c.train.log_every = 25
    c.train.checkpoint_every = 200  # steps; also saved at the end and on SIGTERM
    # ... and at least this often (minutes): the most work a kill can cost. 10 minutes of a
    # 1000-device job is worth more than the few seconds a save blocks the step.
    c.train.checkpoint_minutes = 10.0
    c.train.keep_checkpoints = 2  # the latest ones ...
    c.train.keep_best = 1  # ... plus this many with the lowest eval WER
    # Steps with a non-finite loss or gradient are skipped; this many in a row means the
    # run diverged: stop with diagnostics rather than burn the allocation.
    c.train.max_nonfinite_steps = 10
    # XLA executables persist here ({workdir} = the run directory; "" = off), so a restarted
    # run loads its step instead of recompiling it (seconds to minutes per batch shape).
    # Point several runs at one shared directory (gs:// on TPU) to share compilations.
    c.train.compile_cache_dir = "{workdir}/compile_cache"
    c.train.eval_every = 0  # steps; 0 = only at the end (eval costs CPU time in the demo)
    c.train.eval_at_end = True
    # Micro-batches per step (gradient accumulation): the batch of data.batch_seconds is
    # processed in this many slices, for activation memory of one slice. 1 on CPU.
    c.train.grad_accum = 1

    c.monitor = ConfigDict()
    # Peak dense TFLOP/s of one device for MFU; 0 = from the device kind
    # (jaxspeech.metrics.perf.PEAK_TFLOPS; unknown kinds such as CPUs report no MFU).
    c.monitor.peak_tflops = 0.0
    # Every this many steps: decode a few training rows next to their references and
    # draw a spectrogram before/after augmentation (one extra compilation; 0 = never).
    c.monitor.samples_every = 450
    c.monitor.num_samples = 2
    # Write each step's utterance ids to RUN/batch_ids/ (audits data order across
    # restarts; one line per step and process).
    c.monitor.log_batch_ids = False
    # Count each batch shape's model FLOPs (one extra lowering per shape, for the MFU
    # column); off = MFU is not reported, start-up is quicker (the tests turn it off).
    c.monitor.count_flops = True

    c.mesh = ConfigDict()
    # Sizes of (replica, data, fsdp, tensor); -1 = the rest of the devices. `replica`:
    # groups of whole hosts (or TPU slices) joined by slow links; only the gradient
    # all-reduce crosses them. Parameters and optimizer state shard over `fsdp`;
    # attention heads, feed-forward units and the vocabulary over `tensor`.
    c.mesh.replica = 1
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    # Logical axis -> mesh axes ("a,b" = several, "" = replicated) for every parameter
    # and activation; a new parallelism layout is a new table here, not a model change.
    # E.g. --config.mesh.rules.embed= keeps parameters whole on a data+fsdp mesh.
    c.mesh.rules = ConfigDict(rules.rules_to_config())

    # How learners agree on a model (jaxspeech/parallel/sync.py; README "Choosing a sync
    # strategy"). A learner is one replica x data group of devices. allreduce (gradients
    # every step) | bmuf (local steps, block-wise model averaging with block momentum) |
    # gtc (threshold-compressed gradients with residuals) | gossip (ring averaging with
    # neighbours) | hierarchical (all-reduce inside a replica, `outer` across replicas).
    c.sync = ConfigDict()
    c.sync.strategy = "allreduce"
    c.sync.outer = "gossip"  # hierarchical: gossip | bmuf across the replica axis
    c.sync.block_steps = 8  # bmuf: local steps per block (communication / block_steps)
    c.sync.block_momentum = -1.0  # bmuf eta; -1 = 1 - 1/learners (the reference's)
    # bmuf zeta; -1 = from block_gain: zeta (1 + eta) / (1 - eta) = gain with Nesterov
    c.sync.block_lr = -1.0
    # bmuf: the global model's move per block / the learners' mean move, in steady state.
    # 1: the learners split the global batch, so their mean already moves as far as the
    # all-reduce model (sync.bmuf_block_lr); the reference's rule (zeta 1, eta 1 - 1/N) is
    # N x 1.75 and kept the demo on its blank plateau.
    c.sync.block_gain = 1.0
    c.sync.nesterov = True  # bmuf: learners restart from W_g + eta * momentum
    c.sync.gtc_tau = 0.0  # gtc: fixed threshold; used when gtc_density = 0
    # gtc: adaptive threshold sending this share of each shard's elements per step
    c.sync.gtc_density = 0.002
    # gtc: message slots per shard element (fixed-size all-gather); the excess waits in
    # the residual and is counted (sync/gtc_overflow)
    c.sync.gtc_capacity = 0.004
    c.sync.gtc_values = "sign"  # gtc: sign (+-tau, 4 bytes per element) | float (8 bytes)
    # gossip: mix with the neighbours' parameters from before this step's update, so the
    # exchange overlaps the step's compute (D-PSGD; the synchronous form of AD-PSGD)
    c.sync.gossip_overlap = False

    if variant == "long":
        c.train.num_steps = 1800
    if variant in ("rnnt", "ctc_rnnt"):
        c.model.head = "rnnt" if variant == "rnnt" else "ctc+rnnt"
    if variant == "streaming":
        # Causal convolutions and chunked attention with a chunk size drawn per batch:
        # one model decoded in chunks of any size (evaluated in-loop at 16 frames, 640 ms).
        c.model.conformer.causal = True
        c.model.conformer.dynamic_chunk = True
        c.model.conformer.chunk_size = 16
    if variant == "tiny":
        c.data.bucket_boundaries = (3.0, 8.0)
        c.specaug.num_freq_masks = 2  # exercise every augmentation in the tests
        c.specaug.num_time_masks = 2
        c.waveform_aug.speeds = (0.9, 1.0, 1.1)
        c.waveform_aug.noise_prob = 0.5
        c.waveform_aug.reverb_prob = 0.5
        c.waveform_aug.num_rirs = 4
        c.data.batch_seconds = 24.0
        c.model.conformer.dim = 32
        c.model.conformer.num_layers = 2
        c.model.conformer.num_heads = 2
        c.model.conformer.subsampling_channels = 8
        c.model.conformer.conv_kernel = 7
        c.model.lstm.hidden = 24
        c.model.lstm.num_layers = 2
        c.model.transducer.predictor_dim = 32
        c.model.transducer.joiner_dim = 32
        c.loss.rnnt_warmup_steps = 4
        c.optim.warmup_steps = 5
        c.train.num_steps = 8
        c.train.log_every = 2
        c.train.checkpoint_every = 4
        c.monitor.samples_every = 8  # once, at the end: each costs a compilation
    return c
