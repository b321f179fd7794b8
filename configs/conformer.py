r"""Conformer transducers (CTC auxiliary) of Gulati et al. (2020) sizes, for large corpora.

Run (LibriSpeech prepared as `data/librispeech/shards` with splits train-960, dev-clean,
test-clean and a BPE-500 tokenizer):
  python -m data_prep.prepare --format librispeech --input LibriSpeech/train-clean-100 ... \
      --output data/librispeech/shards --split train-960 --train_tokenizer \
      --tokenizer bpe --vocab_size 500   # and dev-clean, test-clean without --train_tokenizer
  python -m jaxspeech.train --config configs/conformer.py:M --workdir runs/conformer-m
  python -m jaxspeech.evaluate --workdir runs/conformer-m --split test-clean

Sizes (`:S`, `:M`, `:L`, `:XL`; parameter counts with a 500-token vocabulary, measured by
tests/test_configs.py): S 9.3M, M 28.7M, L 116.6M, XL 620.8M. XL keeps float32 parameters
and Adam moments sharded over `fsdp` x `tensor` (about 7.5 GB of them in all), so it is
configured for FSDP + tensor parallelism; the others are data parallel.

Expected: word error rates on LibriSpeech have not been measured with these configs yet
(no accelerator time so far); the recipe follows the published Conformer/icefall settings.
`configs/demo.py` is the recipe measured end to end (docs/results/asr.md).
"""

from ml_collections import ConfigDict

from jaxspeech.config import defaults

# name: (dim, layers, heads, conv kernel, predictor/joiner dim)
SIZES = {
    "S": (144, 16, 4, 31, 256),
    "M": (256, 16, 4, 31, 512),
    "L": (512, 17, 8, 31, 512),
    "XL": (1024, 24, 16, 31, 640),
}


def get_config(arg: str | None = None) -> ConfigDict:
    size = arg or "M"
    if size not in SIZES:
        raise ValueError(f"unknown configs/conformer.py size {size!r}: use one of {list(SIZES)}")
    dim, layers, heads, kernel, head_dim = SIZES[size]
    # Every key, its default and why (jaxspeech/config/defaults.py: the buckets, the
    # SpecAugment LD policy and dropout 0.1 are already LibriSpeech's); what differs at
    # scale is set here.
    c = defaults.get_config()

    c.data.dir = "data/librispeech/shards"
    c.data.train_split = "train-960"
    c.data.eval_split = "dev-clean"
    c.data.eval_bucket_boundaries = (10.0, 20.0, 35.0)  # three decode compilations
    c.data.batch_seconds = 6400.0  # ~1.8 h of audio per global batch (icefall: 8 x 800 s)
    c.data.max_tokens_per_second = 10.0  # BPE-500 runs at ~3-5 tokens/s in read speech
    c.data.num_workers = 8  # decoding, augmentation and batching in worker processes
    c.data.prefetch = 8
    c.waveform_aug.speeds = (0.9, 1.0, 1.1)  # Kaldi's 3-way speed perturbation

    c.model.head = "ctc+rnnt"
    c.model.dtype = "bfloat16"  # accelerators: bf16 matmuls, float32 params and losses
    c.model.conformer.dim = dim
    c.model.conformer.num_layers = layers
    c.model.conformer.num_heads = heads
    c.model.conformer.conv_kernel = kernel
    c.model.conformer.subsampling_channels = min(dim, 512)  # the convs' FLOPs grow as C^2
    # The blocks keep only their weight matmuls' outputs for the backward pass: L at
    # 64 x 16 s on an H100 plans 16.6 GiB of temporaries instead of 57.4 (float32
    # LayerNorm copies, FFN hiddens and (B, H, T, T) attention tensors of 17 layers), for
    # 3% more GEMM FLOPs and no more launches (benchmarks/README.md, gpu_plan.py).
    c.model.conformer.remat = "dots"
    # pos_enc stays "rel" (cuDNN takes its position term as a bias): "rope" saves 7% of the
    # L plan's launches but read the demo's natural speech 2.2-2.6 CER points worse at equal
    # steps (docs/results/asr.md, "Rotary or relative positions").
    c.model.transducer.predictor_dim = head_dim
    c.model.transducer.joiner_dim = head_dim
    c.loss.rnnt_warmup_steps = 4000  # icefall's warm_step for the pruned loss

    c.optim.peak_lr = 2e-3 if dim <= 256 else 1e-3  # larger models need a smaller peak
    c.optim.warmup_steps = 10_000
    c.train.num_steps = 150_000
    c.train.log_every = 100
    c.train.checkpoint_every = 2_000
    c.train.keep_checkpoints = 3
    c.train.eval_every = 10_000

    if size == "XL":
        # 622M float32 parameters + 2 Adam moments = 7.5 GB before activations: shard them.
        c.mesh.data = 1
        c.mesh.fsdp = -1
        c.mesh.tensor = 4
    return c
