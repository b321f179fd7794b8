"""The PyTorch peer of benchmarks/train_step.py: a model of the same size from torchaudio
parts, its train step timed as train_step times ours; prints one JSON line.

Run by `train_step.py --peer` from the repository root in the peer's Python (torch and
torchaudio: `make install-peer`, or the GPU machine's image):
    python -m benchmarks.lib.torch_peer '{"spec": {...}, "model": "S", "dtype": ..., ...}'
`spec` comes from benchmarks/lib/peer.py (sizes and settings of a configs/conformer.py
config). Imports torch, torchaudio, numpy and the numpy-only synthetic_batch and timing.

The step, in PyTorch eager on one device (CUDA if there is one):
- features as ours, inside the step: torchaudio's MelSpectrogram (centred, zero-padded,
  Slaney mel), log(x + floor), fixed normalisation, torchaudio's SpecAugment (the
  config's masks, per utterance);
- ours' front-end sizes: two (x8: three) 3x3 stride-2 Conv2d + ReLU, then Linear to D;
- torchaudio.models.Conformer (FFN/2, MHSA, convolution module, FFN/2, LayerNorm; no
  relative positions) of the config's width, depth, heads and kernel, dropout as ours;
- heads as ours: CTC (Linear to the vocabulary, torch's ctc_loss) and a transducer with
  ours' stateless predictor (embedding, a learned mix of the last `context_size` labels,
  ReLU) and joiner out(tanh(enc_proj + pred_proj)), its logits over the full (B, T, U+1,
  V) lattice in torchaudio.functional.rnnt_loss (the full loss; ours is pruned);
- loss rnnt + ctc_weight * ctc, backward, gradient-norm clipping, AdamW (weight decay on
  matrices), the config's hyper-parameters;
- bfloat16: torch.autocast around the model; features and losses in float32.
The batch is train_step's synthetic batch (same seed), its labels cut to the batch's
longest (a PyTorch collate's padding; ours pads to the bucket's width, which its pruned
loss does not pay for). Timing: one warm-up step, then the median of `repeats` steps,
each ended by torch.cuda.synchronize on a GPU (CPU work is synchronous; OpenMP threads wait
passively, see below). Memory on a GPU:
torch.cuda.max_memory_allocated over the process; everywhere the process's peak RSS.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

# torch's OpenMP threads spin while they wait for work; on a shared CPU that stalls every
# parallel region (S, 4 x 4 s, at a load average of ~15 on 2 cores: 17-32 s a step, 2.9 s
# with passive waiting, 3.2 s on one thread). XLA's CPU thread pool does not spin so. Set
# before torch loads its OpenMP; a user's own setting wins. (No effect on GPU kernels.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchaudio  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from benchmarks.lib.synthetic_batch import make_batch  # noqa: E402
from benchmarks.lib.timing import call_times  # noqa: E402

CMVN_MEAN, CMVN_STD = -5.0, 3.0  # train_step's feature statistics


class Subsampling(nn.Module):
    """(B, T, F) -> (B, T', D): `n` 3x3 stride-2 convolutions + ReLU, Linear to D."""

    def __init__(self, num_features: int, channels: int, dim: int, factor: int):
        super().__init__()
        n = {4: 2, 8: 3}[factor]
        convs, f = [], num_features
        for i in range(n):
            convs += [nn.Conv2d(1 if i == 0 else channels, channels, 3, 2), nn.ReLU()]
            f = (f - 3) // 2 + 1
        self.convs = nn.Sequential(*convs)
        self.out = nn.Linear(channels * f, dim)
        self.n = n

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.convs(x[:, None])  # (B, C, T', F')
        b, c, t, f = h.shape
        for _ in range(self.n):
            lengths = (lengths - 3) // 2 + 1
        return self.out(h.permute(0, 2, 1, 3).reshape(b, t, c * f)), lengths


class StatelessPredictor(nn.Module):
    """(B, U) labels -> (B, U+1, P): row u mixes the embeddings of its last K labels."""

    def __init__(self, vocab: int, dim: int, context: int, blank: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Parameter(torch.full((context, dim), 1.0 / context))
        self.context, self.blank = context, blank

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        k, u = self.context, labels.shape[1]
        emb = self.embed(F.pad(labels, (k, 0), value=self.blank))  # (B, U+K, P)
        return F.relu(sum(emb[:, j : j + u + 1] * self.mix[j] for j in range(k)))


class Joiner(nn.Module):
    """(B, T, D) and (B, U+1, P) -> (B, T, U+1, V) logits = out(tanh(enc + pred))."""

    def __init__(self, enc_dim: int, pred_dim: int, dim: int, vocab: int):
        super().__init__()
        self.enc_proj, self.pred_proj = nn.Linear(enc_dim, dim), nn.Linear(pred_dim, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.enc_proj(enc)[:, :, None] + self.pred_proj(pred)[:, None]))


class Peer(nn.Module):
    """Audio and labels -> the training loss (see the module docstring)."""

    def __init__(self, spec: dict, vocab: int, blank: int, frames: int):
        super().__init__()
        fe, sa = spec["features"], spec["specaug"]
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=fe["sample_rate"],
            n_fft=fe["n_fft"],
            win_length=fe["win_length"],
            hop_length=fe["hop_length"],
            f_min=fe["fmin"],
            f_max=fe["fmax"],
            n_mels=fe["num_mel_bins"],
            center=True,
            pad_mode="constant",
            norm="slaney",
            mel_scale="slaney",
        )
        self.specaug = (
            torchaudio.transforms.SpecAugment(
                n_time_masks=sa["num_time_masks"],
                time_mask_param=max(1, int(sa["time_mask_max_ratio"] * frames)),
                n_freq_masks=sa["num_freq_masks"],
                freq_mask_param=sa["freq_mask_width"],
                iid_masks=True,
                zero_masking=True,  # the normalised features' mean
            )
            if sa["enabled"]
            else None
        )
        d = spec["dim"]
        self.subsampling = Subsampling(
            fe["num_mel_bins"], spec["subsampling_channels"], d, spec["subsampling_factor"]
        )
        self.encoder = torchaudio.models.Conformer(
            input_dim=d,
            num_heads=spec["num_heads"],
            ffn_dim=spec["ffn_dim"],
            num_layers=spec["num_layers"],
            depthwise_conv_kernel_size=spec["conv_kernel"],
            dropout=spec["dropout"],
        )
        self.head, self.blank = spec["head"], blank
        self.ctc_weight, self.log_floor = spec["ctc_weight"], fe["log_floor"]
        self.hop = fe["hop_length"]
        if "ctc" in self.head:
            self.ctc = nn.Linear(d, vocab)
        if "rnnt" in self.head:
            p = spec["predictor_dim"]
            self.predictor = StatelessPredictor(vocab, p, spec["context_size"], blank)
            self.joiner = Joiner(d, p, spec["joiner_dim"], vocab)

    def features(self, audio: torch.Tensor) -> torch.Tensor:
        """(B, S) float32 audio -> (B, T, F) normalised, augmented log-mel features."""
        x = (torch.log(self.mel(audio) + self.log_floor) - CMVN_MEAN) / CMVN_STD  # (B, F, T)
        if self.specaug is not None:
            x = self.specaug(x[:, None])[:, 0]
        return x.transpose(1, 2)

    def forward(self, audio, audio_len, labels, label_len, autocast) -> torch.Tensor:
        with torch.autocast(audio.device.type, enabled=False):
            feats = self.features(audio)
        with autocast:
            x, lengths = self.subsampling(feats, audio_len // self.hop + 1)
            enc, lengths = self.encoder(x, lengths)
            ctc_logits = self.ctc(enc) if "ctc" in self.head else None
            joint = self.joiner(enc, self.predictor(labels)) if "rnnt" in self.head else None
        loss = 0.0
        if joint is not None:
            loss = torchaudio.functional.rnnt_loss(
                joint.float(), labels, lengths.int(), label_len, blank=self.blank
            )
        if ctc_logits is not None:
            log_probs = F.log_softmax(ctc_logits.float(), dim=-1).transpose(0, 1)  # (T, B, V)
            ctc = F.ctc_loss(
                log_probs, labels, lengths, label_len, blank=self.blank, zero_infinity=True
            )
            loss = loss + (self.ctc_weight if joint is not None else 1.0) * ctc
        return loss


def adamw(model: nn.Module, o: dict) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (as ours), the config's settings."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": o["weight_decay"]},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=o["peak_lr"], betas=(o["b1"], o["b2"]), eps=o["eps"])


def run(job: dict) -> dict:
    """Builds the peer, times its train step and returns its row."""
    spec = job["spec"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    host = make_batch(job["batch"], job["seconds"], label_width=job["label_width"])
    width = int(host["label_len"].max())  # a collate pads to the batch's longest
    batch = {
        "audio": torch.from_numpy(host["audio"]).to(device),
        "audio_len": torch.from_numpy(host["audio_len"]).long().to(device),
        "labels": torch.from_numpy(np.ascontiguousarray(host["labels"][:, :width])).to(device),
        "label_len": torch.from_numpy(host["label_len"]).to(device),
    }
    frames = host["audio"].shape[1] // spec["features"]["hop_length"] + 1
    t0 = time.perf_counter()
    model = Peer(spec, job["vocab"], job["blank"], frames).to(device).train()
    opt = adamw(model, spec["optim"])
    init_s = time.perf_counter() - t0
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=job["dtype"] == "bfloat16")
    losses = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(**batch, autocast=autocast)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), spec["optim"]["clip_norm"])
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        losses.append(loss.detach())

    t0 = time.perf_counter()
    step()  # the warm-up step
    first_step_s = time.perf_counter() - t0
    times = call_times(step, job["repeats"], warmup=0)
    row = {
        "model": job["model"],
        "framework": "pytorch",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": job["dtype"],
        "num_devices": 1,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "batch": job["batch"],
        "seconds": job["seconds"],
        "label_width": width,
        "repeats": job["repeats"],
        "step_ms": 1e3 * float(np.median(times)),
        "step_ms_min": 1e3 * float(np.min(times)),
        "step_ms_max": 1e3 * float(np.max(times)),
        "init_s": init_s,
        "first_step_s": first_step_s,
        "loss_first": float(losses[0]),
        "loss_last": float(losses[-1]),
        "torch": torch.__version__,
        "torchaudio": torchaudio.__version__,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if device.type == "cuda":
        row["peak_bytes_in_use_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        row["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
    return row


def main(argv: list[str]) -> None:
    job = json.loads(argv[0])
    try:
        row = run(job)
    except torch.OutOfMemoryError as e:  # train_step records it as not fitting
        row = {
            "does_not_fit": True,
            "model": job["model"],
            "framework": "pytorch",
            "batch": job["batch"],
            "plan_mib": None,
            "limit_mib": None,
            "error": str(e).splitlines()[0][:300],
        }
    print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
