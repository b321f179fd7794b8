"""Every config key with its default and why: what a run that sets nothing gets.

`configs/*.py` start from `get_config()` and set only what differs (their corpus, model
size, machine); `python -m jaxspeech.train --config.<key>=...` can override any key here
and no other. The values are the demo's measured recipe (`configs/demo.py`, figures in
docs/results/asr.md) wherever that is general; corpus-shaped values (buckets, SpecAugment's
policy) follow read speech at LibriSpeech's scale. Runs saved before a key existed read it
from here (`lookup`, `fill_missing`). `jaxspeech.config.validate` checks a config.

Three tables have their single source in the layer that uses them, read here: the
logical-axis rules (`jaxspeech.parallel.rules.DEFAULT_RULES`), the sync settings
(`jaxspeech.parallel.sync.default_sync_config`, which also completes partial sync
mappings) and the LM fusion weights (`jaxspeech.decoding.search.LM_WEIGHT`, `WORD_BONUS`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping

from ml_collections import ConfigDict

from jaxspeech.config import sections as task_sections
from jaxspeech.decoding import attention, search
from jaxspeech.parallel import rules, sync


def get_config(task: str = "asr") -> ConfigDict:
    """Every key a run of `task` reads, at its default: the shared sections and its own."""
    c = _every_section(task)
    for name in task_sections.foreign(task, list(c)):  # (a ValueError for an unknown task)
        del c[name]
    return c


def _every_section(task: str) -> ConfigDict:
    """Every task's sections (what `lookup` falls back on), optim at `task`'s values."""
    c = ConfigDict()
    c.seed = 0  # every random stream (init, data order, SpecAugment) derives from it
    # What the trainer learns: "asr" (the recognizer of config.model), "tts" (the
    # synthesizer of config.tts, on records with phonemes and durations) or "vocoder"
    # (HiFi-GAN of config.vocoder, on any prepared audio); one trainer, one loop, the
    # task's model and data (the registry: jaxspeech.tasks). A config holds the shared
    # sections and its task's (jaxspeech.config.sections): start it from get_config(task).
    c.task = task
    # A run directory (its latest checkpoint) or RUN/checkpoints/<step> whose parameters
    # start this run (fine-tuning); used only when the workdir has no checkpoint yet.
    c.init_from = ""
    _data(c)
    _features(c)
    _augmentation(c)
    _model(c)
    _loss(c)
    _decoding(c)
    _optim(c, task)
    _distill(c)
    _tts(c)
    _vocoder(c)
    _train(c)
    _monitor(c)
    _mesh(c)
    _pipeline(c)
    _sync(c)
    return c


def _data(c: ConfigDict) -> None:
    c.data = ConfigDict()  # the corpus and the input pipeline
    c.data.dir = ""  # a corpus written by `python -m data_prep.prepare`; must be set
    c.data.train_split = "train"  # the split training reads
    # Scored periodically and at the end of training; "a,b": several, the first one's WER
    # picks the best checkpoints.
    c.data.eval_split = "dev"
    # Duration buckets (seconds): each shape costs one compilation, and an utterance
    # longer than the last is skipped (and counted). Read speech runs up to 35 s
    # (LibriSpeech), most of it 12-16 s: narrow buckets where most utterances are.
    c.data.bucket_boundaries = (4.0, 8.0, 11.0, 13.0, 15.0, 17.0, 20.0, 25.0, 35.0)
    # Evaluation compiles one decode per bucket; fewer, wider buckets cost less compile
    # time than they waste on padding. () = the training buckets.
    c.data.eval_bucket_boundaries = ()
    # Padded audio per global batch (seconds); sets each bucket's batch size. 64 s with
    # optim.peak_lr 2e-3 is the demo's pair (32 s at 3e-3 stayed on the blank plateau).
    c.data.batch_seconds = 64.0
    # Label padding per bucket = boundary * this. Even characters of fast speech run at
    # < 20/s; rows over the limit are counted (label_overflow), never truncated.
    c.data.max_tokens_per_second = 30.0
    # A curriculum: the first short_first_steps steps read only the utterances of the
    # buckets up to short_first_seconds (one of bucket_boundaries), then all of them.
    # Epochs (waveform_aug.start_epoch counts them) count the short passes first. 0 = off.
    c.data.short_first_steps = 0
    c.data.short_first_seconds = 0.0  # the phase's longest utterance (a bucket boundary)
    # Loader shards: the corpus is dealt to this many readers, each host serving an equal
    # run of them. 0 = one per process. A fixed count (a multiple of every process count
    # you will use) gives the same global batches on 1 host or N: a run can move between
    # host counts and replay exactly.
    c.data.loader_shards = 0
    c.data.num_workers = 0  # Grain worker processes; 0 reads in threads (enough on CPU)
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
    c.data.read_backoff_s = 1.0  # the first wait of those retries (seconds)


def _features(c: ConfigDict) -> None:
    c.features = ConfigDict()  # the front end, computed on device (LogMelConfig)
    c.features.sample_rate = 16000  # Hz of the prepared audio
    c.features.n_fft = 512  # FFT size: the next power of two above the window
    c.features.win_length = 400  # 25 ms analysis window
    c.features.hop_length = 160  # 10 ms between frames
    c.features.num_mel_bins = 80  # the usual ASR front end (Conformer, icefall)
    c.features.fmin = 0.0  # lowest mel filter edge (Hz)
    c.features.fmax = 8000.0  # highest mel filter edge (Hz): Nyquist at 16 kHz
    c.features.log_floor = 1e-6  # added before the log so silence is finite
    # "log_mel" (the encoder sees num_mel_bins log-mel bins) or "mfcc": the log-mel's
    # orthonormal DCT-II, liftered, with optional deltas (jaxspeech/audio/mfcc.py). The
    # prepared split's stats.json must be of the same features (data_prep --features).
    c.features.kind = "log_mel"
    # mfcc: cepstra kept (<= num_mel_bins); 40 of 40 bins is Kaldi's hires, 13 the classic.
    c.features.num_ceps = 40
    c.features.lifter = 22.0  # mfcc: cepstral lifter L (Kaldi's and HTK's 22); 0 = off
    # mfcc: orders of deltas appended (0, 1, 2; librosa delta(width=5)): the encoder's input
    # is num_ceps * (1 + deltas). Not with a streaming encoder (2 frames of look-ahead).
    c.features.deltas = 0


def _augmentation(c: ConfigDict) -> None:
    c.specaug = ConfigDict()  # on-device feature augmentation in training
    c.specaug.enabled = True  # off: the model sees the features unchanged
    c.specaug.num_freq_masks = 2  # the SpecAugment LD policy of Park et al.
    c.specaug.freq_mask_width = 27  # LD: up to 27 of 80 mel bins per mask
    c.specaug.num_time_masks = 10  # LD: ten time masks ...
    c.specaug.time_mask_max_ratio = 0.05  # ... each up to 5% of the utterance
    # VTLP frequency warp (+-this share): helps when unseen voices differ from the training
    # ones mostly in formants (the demo's few synthetic voices); many real speakers: off.
    c.specaug.freq_warp = 0.0

    # Host-side waveform augmentation in the loader (Grain workers), before bucketing; all
    # of it off by default (it costs host CPU per utterance).
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
    # The first epoch augmented (0: from the start): earlier epochs are clean, so that a short
    # CTC recipe leaves its blank plateau before the augmentation makes fitting harder.
    c.waveform_aug.start_epoch = 0


def _model(c: ConfigDict) -> None:
    c.model = ConfigDict()  # built by jaxspeech.config.build (models never see the config)
    c.model.encoder = "conformer"  # conformer | lstm (jaxspeech.models.ENCODERS)
    # ctc | rnnt | ctc+rnnt (transducer with a CTC auxiliary loss on the encoder) |
    # ctc+aed (CTC and an attention decoder trained jointly; decoded through CTC)
    c.model.head = "ctc"
    # Compute dtype: float32 | bfloat16 (parameters and losses stay float32). bf16 is
    # faster on accelerators and slower than f32 on CPU.
    c.model.dtype = "float32"
    _conformer(c)
    c.model.lstm = ConfigDict()  # used when model.encoder = "lstm"
    c.model.lstm.hidden = 320  # LSTM cells per direction
    c.model.lstm.num_layers = 4  # stacked layers
    c.model.lstm.bidirectional = True  # False: a streaming (left-to-right) encoder
    c.model.lstm.proj_dim = 0  # LSTMP recurrent projection; 0 = none
    c.model.lstm.stack_frames = 4  # 40 ms frames, like the Conformer's x4 subsampling
    c.model.lstm.lookahead = 0  # future frames a unidirectional encoder may see
    c.model.lstm.dropout = 0.0  # between layers; the recipe has not needed it
    c.model.lstm.output_dim = 0  # width of the encodings the heads see; 0 = hidden
    # Transducer parts (model.head containing "rnnt"): icefall's stateless predictor is as
    # accurate as an LSTM one and its decoding state is just the last labels.
    c.model.transducer = ConfigDict()
    c.model.transducer.predictor = "stateless"  # stateless | lstm
    c.model.transducer.predictor_dim = 256  # label embedding width (icefall's small models)
    c.model.transducer.context_size = 2  # labels the stateless predictor sees
    c.model.transducer.lstm_layers = 1  # lstm predictor: layers
    c.model.transducer.lstm_hidden = 0  # lstm predictor: cells; 0 = predictor_dim
    c.model.transducer.joiner_dim = 256  # the joiner's hidden width
    # Attention decoder (model.head = "ctc+aed"): a Transformer decoder over the encodings
    # (jaxspeech/models/decoder.py). ESPnet's LibriSpeech recipes use 6 blocks; the width
    # is a small model's (ESPnet's: 512 wide, 2048 units).
    c.model.decoder = ConfigDict()
    c.model.decoder.dim = 256  # decoder width (its own; cross-attention reads the encoder's)
    c.model.decoder.num_layers = 6  # decoder blocks (ESPnet's LibriSpeech recipes)
    c.model.decoder.num_heads = 4  # attention heads; dim must be a multiple
    c.model.decoder.ff_mult = 4  # feed-forward hidden units = ff_mult * dim
    c.model.decoder.dropout = 0.1  # as the encoder's
    c.model.decoder.scan_layers = True  # compile one block, not num_layers (as the Conformer)


def _conformer(c: ConfigDict) -> None:
    c.model.conformer = ConfigDict()  # used when model.encoder = "conformer"
    c.model.conformer.dim = 144  # model width (Gulati et al.'s S)
    c.model.conformer.num_layers = 8  # blocks: the demo's depth (S has 16)
    c.model.conformer.num_heads = 4  # attention heads; dim must be a multiple
    c.model.conformer.ff_mult = 4  # feed-forward hidden units = ff_mult * dim
    c.model.conformer.conv_kernel = 15  # depthwise kernel; odd unless causal
    c.model.conformer.subsampling_channels = 64  # small: the 2nd conv dominates FLOPs otherwise
    c.model.conformer.scan_layers = True  # compile one block, not 8: ~12 s per batch shape, not ~38
    c.model.conformer.dropout = 0.1  # Gulati et al.'s; its random bits cost ~25% of a CPU step
    # 4: 40 ms frames (Gulati et al.). 8 (a third stride-2 conv) halves the blocks' frames,
    # but 12.5 frames/s is fewer than the characters of fast speech (up to ~20/s), and CTC
    # needs a frame per label.
    c.model.conformer.subsampling_factor = 4
    # What each block keeps for the backward pass: none | full (recompute the block) |
    # dots (keep only weight-matmul outputs). A 144-dim model's activations fit in CPU
    # memory, so recomputation would only cost time.
    c.model.conformer.remat = "none"
    # Position encoding of the self-attention: "rel" (Transformer-XL relative positions,
    # ESPnet's and NeMo's default, the demo's measured recipe) or "rope" (rotary embeddings:
    # no (B, H, T, T) bias, so cuDNN's fused kernel runs without one; at equal steps the
    # demo's natural speech 2.2-2.6 CER points worse: docs/results/asr.md, "Rotary").
    c.model.conformer.pos_enc = "rel"
    # Attention kernel: "auto" (cuDNN's fused attention on a GPU with bf16/f16 compute and
    # a head dim cuDNN takes, XLA elsewhere), "cudnn" (fail if it cannot run) or "xla".
    c.model.conformer.attention = "auto"
    # Streaming (see jaxspeech/models/conformer.py); all off: full context is the more
    # accurate model. causal: depthwise convolutions see only past frames.
    c.model.conformer.causal = False
    # Chunked attention: subsampled frames attend within chunks of chunk_size frames and
    # left_chunks chunks before (-1 = all of them); chunk_size 0 = full context.
    c.model.conformer.chunk_size = 0
    c.model.conformer.left_chunks = -1  # chunks of history each chunk attends to
    # Training draws a chunk size per batch (full context half the time, else uniform on
    # 1..max_dynamic_chunk), so one model serves any chunk size.
    c.model.conformer.dynamic_chunk = False
    c.model.conformer.max_dynamic_chunk = 25  # 1 s at x4 subsampling, as in WeNet


def _loss(c: ConfigDict) -> None:
    c.loss = ConfigDict()  # the transducer's loss, the CTC weight and the kernels
    # "pruned" (k2): a linear joiner bounds each frame to prune_range labels and the full
    # joiner runs only there; "full": the exact lattice, chunked (more memory and time).
    c.loss.rnnt = "pruned"
    c.loss.prune_range = 5  # labels per frame the pruned loss keeps (k2's default)
    c.loss.simple_scale = 0.5  # weight of the linear joiner's loss after warm-up
    # Over the first steps the simple loss weighs 1 -> simple_scale and the pruned one
    # 0.1 -> 1: the pruning bounds are meaningless until the simple joiner has learned.
    c.loss.rnnt_warmup_steps = 300
    # ctc+rnnt: the CTC auxiliary loss's weight beside the transducer's; ctc+aed: ESPnet's
    # joint ctc_weight * CTC + (1 - ctc_weight) * attention, so in [0, 1] (0.3: ESPnet's
    # LibriSpeech value).
    c.loss.ctc_weight = 0.3
    # ctc+aed: label smoothing of the attention decoder's targets (ESPnet's 0.1): 1 - s on
    # the reference token, s spread over the others.
    c.loss.label_smoothing = 0.1
    # The transducer's gradient reaches the encoder 0 -> 1 over rnnt_warmup_steps, and an
    # acoustic-only loss teaches the encoder its first alignments: CTC (ctc+rnnt), else the
    # simple joiner's acoustic half alone (rnnt). Without it the transducer flattened the
    # encoder output before any alignment formed and the recipes left their blank plateau
    # only with lucky random draws (jaxspeech.training.step).
    c.loss.rnnt_encoder_warmup = True
    c.loss.frames_per_chunk = 16  # full loss: frames whose joiner logits exist at once
    # The loss recursions: "xla" runs a loop iteration of several small kernels per frame
    # (on a GPU ~8,400 launches for CTC + gradient at 64 x 16 s, ~15,600 for the pruned
    # RNN-T's lattices), "pallas" one fused kernel each way (jaxspeech.losses.kernels;
    # interpreted, slowly, on a CPU: for tests);
    # "auto" = pallas when the step's devices are GPUs, xla otherwise.
    c.loss.kernel = "auto"


def _decoding(c: ConfigDict) -> None:
    c.decoding = ConfigDict()  # evaluation's decoder (in-loop and standalone)
    # ctc_greedy | ctc_beam | rnnt_greedy | rnnt_beam | aed_beam | aed_rescore; "auto": the
    # head's greedy decoder (RNN-T when there is one; CTC's for ctc+aed; aed_beam for aed).
    c.decoding.method = "auto"
    c.decoding.beam = 4  # hypotheses kept by ctc_beam / rnnt_beam / aed_beam / aed_rescore
    # RNN-T greedy and beam search: labels a frame may emit (1 in rnnt_beam is icefall's
    # modified beam search; a character model at 40 ms frames needs more on some frames).
    c.decoding.max_symbols_per_frame = 3
    # Shallow fusion of a word n-gram LM (ARPA/KenLM file, `python -m data_prep.lm`) in
    # ctc_beam and rnnt_beam: score + lm_weight * ln P_lm(words) + word_bonus * words
    # (defaults tuned on the demo's dev set; see jaxspeech.decoding.search).
    c.decoding.lm_path = ""
    c.decoding.lm_weight = search.LM_WEIGHT  # the LM's weight (value: decoding.search)
    c.decoding.word_bonus = search.WORD_BONUS  # score per word (value: decoding.search)
    # The attention searches (jaxspeech.decoding.attention): aed_beam ranks hypotheses by
    # (1 - w) * attention + w * CTC prefix score (+ the LM), aed_rescore a CTC n-best by
    # (1 - w) * attention + w * CTC; w = ctc_weight, -1: 0.3 with a CTC head (ESPnet's), 0
    # without (model.head=aed, where w > 0 is an error).
    c.decoding.ctc_weight = -1.0
    c.decoding.length_norm = True  # aed_beam: rank ended hypotheses by score / (labels + 1)
    # aed_beam: <eos> may end a hypothesis only if its log-prob >= eos_threshold x the best
    # other label's (Chiu et al. 2018); 0 = always.
    c.decoding.eos_threshold = attention.EOS_THRESHOLD
    # aed_beam: at most ceil(max_len_ratio x frames) labels; 0 = up to the frame count, with
    # ESPnet's end detection (stop once newly ended hypotheses are far behind the best).
    c.decoding.max_len_ratio = 0.0
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


def _optim(c: ConfigDict, task: str) -> None:
    # The model's optimizer (jaxspeech.training.optim); the vocoder's generator's, at
    # HiFi-GAN's values (its discriminators': optim2)
    c.optim = ConfigDict()
    c.optim.name = "adamw"  # the one optimizer (AdamW: decoupled weight decay)
    c.optim.peak_lr = 2e-3  # with 64 s batches; 3e-3 with 32 s stayed on the blank plateau
    c.optim.warmup_steps = 150  # linear warm-up to peak_lr
    # cosine (to end_lr_ratio * peak at num_steps) | noam | constant | exponential
    c.optim.decay = "cosine"
    c.optim.end_lr_ratio = 0.02  # the cosine's final learning rate / peak_lr
    # exponential: peak_lr * decay_rate ** (steps after warm-up / decay_steps) (HiFi-GAN's:
    # 0.999 per epoch of LJSpeech, ~820 steps of 16 segments)
    c.optim.decay_rate = 0.999
    c.optim.decay_steps = 820  # exponential: steps per factor of decay_rate
    c.optim.b1 = 0.9  # Adam's first-moment decay
    c.optim.b2 = 0.98  # Adam's second-moment decay (Transformer practice, not 0.999)
    c.optim.eps = 1e-9  # Adam's epsilon (Transformer practice)
    c.optim.weight_decay = 1e-3  # AdamW's decoupled weight decay, on ...
    c.optim.weight_decay_mask = "matrices"  # ... ndim >= 2 weights only | "all" (PyTorch's)
    c.optim.clip_norm = 5.0  # global gradient norm clip; 0 = none
    if task == "vocoder":  # HiFi-GAN's AdamW: no warm-up, no clipping, PyTorch's eps
        c.optim.update(peak_lr=2e-4, warmup_steps=0, decay="exponential", clip_norm=0.0)
        c.optim.update(b1=0.8, b2=0.99, eps=1e-8, weight_decay=0.01, weight_decay_mask="all")
    # The second model's optimizer (config.task = "vocoder": the discriminators'; ESPnet's
    # optim2), of optim's keys: HiFi-GAN trains both models with the same AdamW.
    c.optim2 = ConfigDict(c.optim.to_dict())


def _distill(c: ConfigDict) -> None:
    # Semi-supervised training (docs/reference.md, "Semi-supervised training"): a second stream of
    # batches mixed with the labeled train split by a schedule. With `targets` (the output
    # of `python -m jaxspeech.teach` for `other_split`) its rows learn a teacher's
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


def _tts(c: ConfigDict) -> None:
    # config.task = "tts": FastSpeech2 (jaxspeech/tts/model.py) on the records' phonemes and
    # ends (data_prep --require_phonemes), a speaker embedding; targets: config.features.
    c.tts = ConfigDict()  # the synthesizer (config.task = "tts"; jaxspeech.tts.task)
    c.tts.model = ConfigDict()  # FastSpeech2's arguments; the defaults are its own
    c.tts.model.dim = 256  # model width of the encoder, decoder and embeddings
    c.tts.model.num_heads = 2  # attention heads; dim must be a multiple
    c.tts.model.encoder_layers = 4  # Conformer blocks over the phonemes
    c.tts.model.decoder_layers = 4  # Conformer blocks over the frames
    c.tts.model.ff_mult = 4  # feed-forward hidden units = ff_mult * dim
    c.tts.model.conv_kernel = 7  # the blocks' depthwise convolution (odd)
    c.tts.model.variance_channels = 256  # duration, pitch and energy predictors' width
    c.tts.model.variance_kernel = 3  # their convolutions (odd)
    c.tts.model.embed_kernel = 9  # the pitch and energy embeddings' convolution (odd)
    c.tts.model.dropout = 0.1  # ESPnet's FastSpeech2 uses 0.1-0.2
    c.tts.model.pos_enc = "rel"  # attention positions: "rel" (Transformer-XL) | "rope" (rotary)
    c.tts.model.reduction = 1  # frames per decoder position (Tacotron's r; 1 = every frame)
    c.tts.dtype = "float32"  # compute: float32 | bfloat16 (parameters stay float32)
    c.tts.loss = ConfigDict()  # the weights of jaxspeech.tts.losses.fastspeech2_loss's parts
    c.tts.loss.mel_weight = 1.0  # mel L1 (normalized features)
    c.tts.loss.duration_weight = 1.0  # log(1 + frames) squared error
    c.tts.loss.pitch_weight = 1.0  # normalized log-F0 squared error
    c.tts.loss.energy_weight = 1.0  # token energy squared error
    # Evaluation synthesizes this many utterances of each split with predicted durations and
    # scores their MCD-DTW (dB) against the real features (0 = none; DTW is quadratic).
    c.tts.mcd_utterances = 4
    # Train utterances whose voiced frames set the log-F0 normalization (mean, std), read
    # once into RUN/assets/pitch_stats.json: evenly spaced over the split.
    c.tts.pitch_utterances = 256


def _vocoder(c: ConfigDict) -> None:
    # The neural vocoder (config.task = "vocoder", jaxspeech.vocoder.task): raw log-mel
    # (config.features) -> audio; optimizers: optim (generator), optim2 (discriminators).
    c.vocoder = ConfigDict()
    c.vocoder.generator = "hifigan"  # or "vocos" (jaxspeech/vocoder/vocos.py): ~10x cheaper
    c.vocoder.segment_samples = 8192  # HiFi-GAN's 0.51 s; shorter utterances padded and masked
    c.vocoder.batch_size = 16  # segments per step (global), HiFi-GAN's V1
    c.vocoder.generator_channels = 512  # the first stage's width, halved at each of 4 (V1 512)
    c.vocoder.resblocks = 3  # residual blocks per stage: kernels 3, 7, 11, the first this many
    c.vocoder.vocos_dim = 512  # vocos: channels (Vocos's base 512 / 1536 / 8: 13.5 M parameters)
    c.vocoder.vocos_intermediate_dim = 1536  # vocos: the ConvNeXt blocks' MLP width
    c.vocoder.vocos_layers = 8  # vocos: ConvNeXt blocks (its n_fft: 4 x features.hop_length)
    c.vocoder.vocos_mel_prior = False  # vocos: FreeV's pseudo-inverse magnitude + a residual
    c.vocoder.discriminator = "paper"  # MPD + MSD, 70.7 M parameters; "demo" 0.33 M; "tiny"
    c.vocoder.dtype = "float32"  # compute: float32 | bfloat16 (parameters stay float32)
    c.vocoder.mel_weight = 45.0  # the generator's loss: 45 x log-mel L1 (the paper's) ...
    c.vocoder.feature_weight = 2.0  # ... + 2 x feature matching ...
    c.vocoder.adversarial_weight = 1.0  # ... + 1 x least-squares adversarial
    c.vocoder.adversarial_start = 0  # steps of mel L1 alone first (discriminators resting)
    # A synthesizer's ground-truth-aligned log-mel of the train split (FILE.npz, written by
    # `jaxspeech.synthesize --gta_split`) as the input where it has the utterance; "": none.
    c.vocoder.gta_mels = ""
    # Utterances of each eval split that are also vocoded by Griffin-Lim (on the host) and
    # scored by MCD-DTW for both vocoders (0 = none); the mel L1 covers the whole split.
    c.vocoder.eval_utterances = 8


def _train(c: ConfigDict) -> None:
    c.train = ConfigDict()  # the training loop
    c.train.num_steps = 1350  # the demo variants' budget on 2 cores (the demo's transducer: 1,800)
    c.train.run_steps = 0  # >0: stop this invocation after that many steps (then resume)
    c.train.log_every = 25  # steps between progress lines and metric writes
    c.train.checkpoint_every = 200  # steps (0 = off); also saved at the end and on SIGTERM
    # ... and at least this often (minutes): all the work a kill can cost a 1000-device job
    c.train.checkpoint_minutes = 10.0
    c.train.keep_checkpoints = 2  # the latest ones ...
    c.train.keep_best = 1  # ... plus this many with the lowest eval WER
    # Steps with a non-finite loss or gradient are skipped; this many in a row means the
    # run diverged: stop with diagnostics rather than burn the allocation.
    c.train.max_nonfinite_steps = 10
    # XLA executables persist here ({cache} = the user's jaxspeech cache, $JAXSPEECH_CACHE
    # or ~/.cache/jaxspeech; {workdir} = the run directory; "" = off), so a restarted run
    # loads its step instead of recompiling it (seconds to minutes per batch shape). Runs
    # share entries (keyed by the program). Not the run directory by default: the entries
    # are native code that is run unchecked, and a run directory may come from elsewhere.
    c.train.compile_cache_dir = "{cache}/jit"
    # One job per run directory: the trainer holds RUN/lease.json and renews it every tenth
    # of this; a lease not renewed for this long (its host died) may be taken over.
    c.train.lease_timeout_s = 300.0
    c.train.eval_every = 0  # steps; 0 = only at the end (eval costs CPU time in the demo)
    c.train.eval_at_end = True  # score data.eval_split when training ends
    # Micro-batches per step (gradient accumulation): the batch of data.batch_seconds is
    # processed in this many slices, for activation memory of one slice. 1 on CPU.
    c.train.grad_accum = 1


def _monitor(c: ConfigDict) -> None:
    c.monitor = ConfigDict()  # what training reports besides its losses
    # Peak dense TFLOP/s of one device for MFU; 0 = from the device kind
    # (jaxspeech.metrics.perf.PEAK_TFLOPS; unknown kinds such as CPUs report no MFU).
    c.monitor.peak_tflops = 0.0
    # Every this many steps: decode a few training rows next to their references and
    # draw a spectrogram before/after augmentation (one extra compilation; 0 = never).
    c.monitor.samples_every = 450
    c.monitor.num_samples = 2  # training rows decoded each time
    # Write each step's utterance ids to RUN/batch_ids/ (audits data order across
    # restarts; one line per step and process).
    c.monitor.log_batch_ids = False
    # Count each batch shape's model FLOPs (one extra lowering per shape, for the MFU
    # column); off = MFU is not reported, start-up is quicker (the tests turn it off).
    c.monitor.count_flops = True
    # Where the metrics go besides RUN/metrics.jsonl: a comma list of "tensorboard",
    # "mlflow", "wandb" (jaxspeech.metrics.trackers; endpoints and credentials from the
    # environment: MLFLOW_TRACKING_URI, WANDB_API_KEY or WANDB_MODE=offline).
    c.monitor.trackers = "tensorboard"
    # Price of one device for an hour (any currency; 0 = off): the progress line, the
    # metrics and the trackers report the price of an hour of audio trained.
    c.monitor.device_hour_price = 0.0


def _mesh(c: ConfigDict) -> None:
    c.mesh = ConfigDict()  # the device mesh and how arrays are laid out on it
    # Sizes of (replica, stage, data, fsdp, tensor); -1 = the rest of the devices.
    # `replica`: groups of whole hosts (or TPU slices) joined by slow links; only the
    # gradient all-reduce crosses them. `stage`: pipeline stages over the Conformer's layer
    # stack (`pipeline.*`). Parameters and optimizer state shard over `fsdp`; attention
    # heads, feed-forward units and the vocabulary over `tensor`.
    c.mesh.replica = 1
    c.mesh.stage = 1  # no pipeline
    c.mesh.data = -1  # plain data parallelism over every device
    c.mesh.fsdp = 1  # no parameter sharding: a small model fits every device
    c.mesh.tensor = 1  # no tensor parallelism
    # Logical axis -> mesh axes ("a,b" = several, "" = replicated) for every parameter
    # and activation (jaxspeech.parallel.rules.DEFAULT_RULES, each entry's reason there);
    # a new parallelism layout is a new table here, not a model change.
    # E.g. --config.mesh.rules.embed= keeps parameters whole on a data+fsdp mesh.
    c.mesh.rules = ConfigDict(rules.rules_to_config())


def _pipeline(c: ConfigDict) -> None:
    # With mesh.stage > 1 (jaxspeech.parallel.pipeline): the Conformer's scanned layer stack
    # split into mesh.stage stages; the rest of the model runs data-parallel over them.
    c.pipeline = ConfigDict()
    # Microbatches per step (per gradient-accumulation microbatch): the bubble is
    # (S - 1) / (M R + S - 1); batches are rounded to a multiple of it.
    c.pipeline.microbatches = 4
    # gpipe (contiguous layers per stage) | circular (`repeats` groups per stage, visited
    # in turn: a smaller bubble, needs microbatches >= mesh.stage).
    c.pipeline.schedule = "gpipe"
    c.pipeline.repeats = 2  # circular: layer groups per stage
    # All-gather each stage's FSDP-sharded weights once per step, before the pipeline loop
    # (their gradients reduce-scattered once after it), instead of at every loop iteration:
    # 12-14x fewer all-gather bytes for Conformer-XL, at the cost of the gathered weights
    # and their gradients held through the loops (temporaries 2.1 -> 5.8 GiB per device
    # on 2 stages x FSDP 4; benchmarks/README.md). False: the memory-lean choice.
    c.pipeline.gather_weights_once = True


def _sync(c: ConfigDict) -> None:
    # How learners agree on a model (jaxspeech/parallel/sync.py; README.md, "Clusters";
    # docs/results/other.md, "Sync strategies"). A learner is one replica x data group of
    # devices. The values come from sync.default_sync_config (the one table, which also
    # completes partial settings).
    s = sync.default_sync_config()
    c.sync = ConfigDict()  # see sync.default_sync_config for the values
    # allreduce (gradients every step) | bmuf (local steps, block-wise model averaging
    # with block momentum) | gtc (threshold-compressed gradients with residuals) | gossip
    # (ring averaging with neighbours) | hierarchical (all-reduce inside a replica,
    # `outer` across replicas).
    c.sync.strategy = s["strategy"]
    c.sync.outer = s["outer"]  # hierarchical: gossip | bmuf across the replica axis
    c.sync.block_steps = s["block_steps"]  # bmuf: local steps per block (traffic / block_steps)
    # bmuf eta; -1 = 1 - 1/learners (the reference's, with SGD learners). 0: plain block
    # averaging, the default: with AdamW learners it reached all-reduce's dev CER within
    # 4.7% at the demo's budget, eta 0.75 (the reference's for 4 learners) lagged by 18.4%
    # (benchmarks/README.md, "Sync strategies").
    c.sync.block_momentum = s["block_momentum"]
    # bmuf zeta; -1 = from block_gain: zeta (1 + eta) / (1 - eta) = gain with Nesterov
    c.sync.block_lr = s["block_lr"]
    # bmuf: the global model's move per block / the learners' mean move, in steady state.
    # 1: the learners split the global batch, so their mean already moves as far as the
    # all-reduce model (sync.bmuf_block_lr); the reference's rule (zeta 1, eta 1 - 1/N) is
    # N x 1.75 and kept the demo on its blank plateau.
    c.sync.block_gain = s["block_gain"]
    c.sync.nesterov = s["nesterov"]  # bmuf: learners restart from W_g + eta * momentum
    # bmuf: the first steps average the learners' models every step (no block momentum;
    # an all-reduce's bytes), then blocks: as gtc_dense_steps, the block lag costs most
    # before the model leaves the blank plateau.
    c.sync.block_dense_steps = s["block_dense_steps"]
    c.sync.gtc_tau = s["gtc_tau"]  # gtc: fixed threshold; used when gtc_density = 0
    # gtc: adaptive threshold sending this share of each shard's elements per step. The
    # defaults (0.004, capacity 0.0048, 200 dense steps) reached all-reduce's dev CER
    # (+0.3%) at 0.98% of its bytes per compressed step at the demo's budget; 0.002 from
    # step 0 lagged by 48.8% (benchmarks/README.md, "Sync strategies").
    c.sync.gtc_density = s["gtc_density"]
    # gtc: message slots per shard element (fixed-size all-gather); the excess waits in
    # the residual and is counted (sync/gtc_overflow)
    c.sync.gtc_capacity = s["gtc_capacity"]
    c.sync.gtc_values = s["gtc_values"]  # gtc: sign (+-tau, 4 bytes per element) | float (8 bytes)
    # gtc: the first steps exchange the learners' dense mean update (an all-reduce; the
    # residual waits at zero), then compress: the reference compressed a model already
    # trained synchronously for a while, and compressing from step 0 delays the escape
    # from the blank plateau.
    c.sync.gtc_dense_steps = s["gtc_dense_steps"]
    # gossip: mix with the neighbours' parameters from before this step's update, so the
    # exchange overlaps the step's compute (D-PSGD; the synchronous form of AD-PSGD)
    c.sync.gossip_overlap = s["gossip_overlap"]


# ---------------------------------------------------------------- runs from before a key
@functools.cache
def _defaults(task: str, every: bool = False) -> dict:
    """A run of `task`'s defaults; `every`: with the other tasks' sections too."""
    return (_every_section(task) if every else get_config(task)).to_dict()


def lookup(config: ConfigDict | Mapping, key: str):
    """`config`'s (a ConfigDict or a saved run's dict) value of the dotted `key`, or its
    task's default when `config` lacks it (a run saved before the key existed)."""
    node = config
    for part in key.split("."):
        if node is None or part not in node:
            node = _defaults(task_sections.task_of(config), every=True)
            for p in key.split("."):
                node = node[p]
            return copy.deepcopy(node)
        node = node[part]
    return node


def fill_missing(config: ConfigDict, *sections: str) -> ConfigDict:
    """Add to `config`, in place, every default key it lacks under `sections` ("decoding",
    "model.conformer"; all when none are named): a run saved before those keys existed
    then reads as it always ran (config.task's defaults). Returns `config`."""
    for section in sections or ("",):
        default: dict = _defaults(task_sections.task_of(config), every=bool(sections))
        node = config
        for part in [p for p in section.split(".") if p]:
            default = default[part]
            if part not in node:
                node[part] = ConfigDict()
            node = node[part]
        task_sections.fill(node, default)
    return config
