# Two entry points (see README): `make demo` and `make test`. Both idempotent; so is
# `make demo-tts`, the text-to-speech demo on the same corpus.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
DEMO_DATA := data/demo
DEMO_RUN := runs/demo
# Hours of synthetic speech: 9 since 2026-11-27 (configs/demo.py's short-utterance phase
# and augmentation start were measured on them). DEMO_HOURS=3 (the default before; ~2 min
# faster) was measured with DEMO_CONFIG="configs/demo.py --config.data.short_first_steps=0
# --config.waveform_aug.start_epoch=3" (docs/results/asr.md, 1a).
DEMO_HOURS ?= 9.0
DEMO_CONFIG ?= configs/demo.py
DEMO_TOKENIZER ?= char
DEMO_VOCAB ?= 128
# The demo corpus (9 h) prepares fastest in one in-memory Beam worker; big corpora use the
# multi-process DirectRunner (the default) or a distributed runner.
DEMO_BEAM_ARGS ?= --direct_running_mode=in_memory --direct_num_workers=1
DEMO_NATURAL ?= 80
# Share of the training utterances that speak a natural sentence (data_prep/demo/synth.py).
# 0.5: natural speech far better than with the grammar only (0), the grammar's test split
# a little worse; 0.25: natural speech worse, test about the same; 0.75: both worse
# (docs/results/asr.md, section 1a).
DEMO_NATURAL_SHARE ?= 0.5
NATURAL_SPLITS := test_natural_clean test_natural_noisy
# Beam of the evaluation with the trigram LM: 8 for the transducer (32: no better, and
# slower), 32 for a CTC variant (DEMO_CONFIG=configs/demo.py:ctc).
DEMO_LM_BEAM ?= 8
# The text-to-speech demo: FastSpeech2 (configs/tts.py) on the demo corpus's phonemes and
# a Vocos vocoder (configs/vocoder.py) on its audio, evaluated on its tts_heldout split
# with the recognizer of DEMO_RUN, vocoded by Griffin-Lim and by the Vocos;
# DEMO_VOCODER_CONFIG=configs/vocoder.py:hifigan trains the HiFi-GAN vocoder instead.
DEMO_TTS_RUN := runs/demo-tts
DEMO_TTS_CONFIG ?= configs/tts.py
DEMO_VOCODER_RUN := runs/demo-vocoder
DEMO_VOCODER_CONFIG ?= configs/vocoder.py
# The vocoder learns from the synthesizer's own teacher-forced log-mel of this many train
# utterances (spread over the split; half the 9-hour corpus's 9,450) and from the others'
# recorded log-mel: the recognizer's CER 14.99% against Griffin-Lim's 14.82% (level),
# DNSMOS OVRL 2.87 against 2.70 (docs/results/tts.md, "Two frames a decoder position"); with the
# synthesizer before it, the recordings' log-mel alone and the synthesizer's alone were
# level with Griffin-Lim too ("Ground-truth-aligned frames"). 0: the recordings' log-mel only.
DEMO_GTA_UTTERANCES ?= 4725
DEMO_GTA := $(DEMO_TTS_RUN)/gta-train.npz
comma := ,
space := $(subst ,, )

.PHONY: demo demo-tts test install install-dev install-onnx install-cuda install-gpuplan gpu-plan \
    gpu-check-wheels install-peer lint format clean-demo

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip uv

# uv resolves and installs the whole stack in seconds where pip takes minutes.
# [lm]: KenLM's Python module, for the demo's evaluation with a language model.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/activate
	$(UV) pip install --python $(PY) --quiet -e '.[lm]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(UV) pip install --python $(PY) --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# The ONNX converter's own environment (`jaxspeech.export --format onnx` runs it in a
# subprocess). jax2onnx >= 0.13.1 requires orbax-checkpoint < 0.11.37 and the main
# install resolves orbax-checkpoint 0.12.x, so the two cannot share one environment;
# the older jax2onnx releases without that bound do not convert our model on jax 0.10.
# The converter imports only the model code (jax, flax, numpy, librosa), pinned to the
# main install's versions so that it converts the same computation.
ONNX_VENV := .venv-onnx
JAX2ONNX := jax2onnx==0.17.1
$(ONNX_VENV)/.installed: pyproject.toml $(VENV)/.installed
	$(PYTHON) -m venv --without-pip $(ONNX_VENV)
	$(UV) pip freeze --python $(PY) | grep -iE '^(jax|jaxlib|flax|numpy|librosa|ml-dtypes|onnx|onnxruntime)==' > $(ONNX_VENV)/constraints.txt
	$(UV) pip install --python $(ONNX_VENV)/bin/python --quiet -c $(ONNX_VENV)/constraints.txt \
	  '$(JAX2ONNX)' jax jaxlib flax numpy librosa onnx onnxruntime
	touch $@

install-onnx: $(ONNX_VENV)/.installed

# NVIDIA GPUs (CUDA 12 driver >= 525): the CUDA build of jax in .venv, then the device
# check (the GPUs jaxspeech sees, and an all-reduce over them).
install-cuda: $(VENV)/.installed
	$(UV) pip install --python $(PY) --quiet -e '.[cuda]'
	$(PY) -m jaxspeech.devices

# The GPU plan's environment (benchmarks/gpu_plan.py: the train step compiled for an H100
# on this CPU machine, no GPU needed): jax's CUDA 12 plugin and PJRT at the main install's
# exact jax version (~180 MB; its `with-cuda` extra, the nvidia-* libraries, is not needed
# to compile), beside the project and its dependencies pinned to the main install's
# versions, so that the plan compiles the computation the main install runs.
GPUPLAN_VENV := .venv-gpuplan
$(GPUPLAN_VENV)/.installed: pyproject.toml $(VENV)/.installed
	$(PYTHON) -m venv --without-pip $(GPUPLAN_VENV)
	$(UV) pip freeze --python $(PY) | grep -v '^-e ' > $(GPUPLAN_VENV)/constraints.txt
	jax_version=$$($(PY) -c 'import jax; print(jax.__version__)') && \
	$(UV) pip install --python $(GPUPLAN_VENV)/bin/python --quiet -c $(GPUPLAN_VENV)/constraints.txt \
	  -e . "jax-cuda12-plugin==$$jax_version" "jax-cuda12-pjrt==$$jax_version"
	touch $@

install-gpuplan: $(GPUPLAN_VENV)/.installed

# Conformer S, M, L compiled for an H100 on this machine: launches, loops, custom calls,
# temporaries (benchmarks/results/gpu_plan.json; six compiles of 1.5-5 min each on 2
# cores). GPU_PLAN_ARGS adds options, e.g.
# GPU_PLAN_ARGS="--models L --variant none:model.conformer.remat=none --tree main:HEAD".
GPU_PLAN_ARGS ?=
gpu-plan: $(GPUPLAN_VENV)/.installed
	$(GPUPLAN_VENV)/bin/python benchmarks/gpu_plan.py $(GPU_PLAN_ARGS)

# benchmarks/gpu_check.sh on a GPU machine that cannot install from a registry (Python
# 3.12, jax + CUDA, flax, optax, orbax, torch already there): the cp312 wheels of
# jaxspeech's other imports, at the main install's versions, carried into
# .gpu-check/wheels (~15 MB) and installed there with --target.
GPU_CHECK_DIR := .gpu-check
GPU_CHECK_PACKAGES := grain array-record cloudpickle librosa lazy-loader soundfile cffi pycparser \
    soxr audioread pooch decorator platformdirs ml-collections portpicker zstandard \
    tensorboardx rapidfuzz
gpu-check-wheels: $(VENV)/.installed
	rm -rf $(GPU_CHECK_DIR)/wheels && mkdir -p $(GPU_CHECK_DIR)/wheels
	$(UV) pip freeze --python $(PY) | grep -iE '^($(subst $(space),|,$(GPU_CHECK_PACKAGES)))==' \
	  > $(GPU_CHECK_DIR)/wheels/requirements.txt
	$(VENV)/bin/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  -r $(GPU_CHECK_DIR)/wheels/requirements.txt -d $(GPU_CHECK_DIR)/wheels

# The PyTorch peer of benchmarks/train_step.py --peer (benchmarks/lib/torch_peer.py:
# torchaudio's Conformer and RNN-T loss), run in a subprocess with this venv's python.
# Every torchaudio wheel on PyPI links CUDA's libraries (libc10_cuda, libcudart), so it
# cannot load beside a CPU-only torch; torchaudio 2.11.1 asks for torch >= 2.11, and the
# CUDA build of torch 2.14.1 runs it on a CPU too (5.5 GB in the venv; 3.6-5.8 min on a
# 2-core VM whose disk caches its wheels, otherwise ~3 GB of downloads). pip, not uv: pip
# reads the machine's wheel caches (find-links). PEER_PACKAGES picks other releases.
PEER_VENV := .venv-peer
PEER_PACKAGES ?= torch==2.14.1 torchaudio==2.11.1 numpy
$(PEER_VENV)/.installed:
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet $(PEER_PACKAGES)
	$(PEER_VENV)/bin/python -c 'import torch, torchaudio; print("peer: torch", torch.__version__, "torchaudio", torchaudio.__version__)'
	touch $@

install-peer: $(PEER_VENV)/.installed

# Order-only on the install: reinstalling after a pyproject.toml change must not
# re-synthesize (or re-prepare) a corpus that is already there.
SYNTH_ARGS = --output $(DEMO_DATA)/raw --hours $(DEMO_HOURS) --seed 0 \
    --natural_share $(DEMO_NATURAL_SHARE)
$(DEMO_DATA)/raw/.done: | $(VENV)/.installed
	$(PY) -m data_prep.demo.synth $(SYNTH_ARGS)
	touch $@
# A corpus made earlier with other settings (an older default share) is refused, not
# trained on: its stamp would otherwise skip the synthesis.
CHECK_CORPUS = $(PY) -m data_prep.demo.synth --check $(SYNTH_ARGS)

# The splits are independent Beam jobs (each stages into its own directory; only train
# writes the tokenizer), so they run side by side; any failure fails the target.
$(DEMO_DATA)/shards/.done: $(DEMO_DATA)/raw/.done
	pids=""; for split in train dev test; do \
	  $(PY) -m data_prep.prepare --format manifest --input $(DEMO_DATA)/raw/$$split/manifest.jsonl \
	    --output $(DEMO_DATA)/shards --split $$split \
	    --tokenizer $(DEMO_TOKENIZER) --vocab_size $(DEMO_VOCAB) $(DEMO_BEAM_ARGS) & \
	  pids="$$pids $$!"; \
	done; \
	status=0; for p in $$pids; do wait $$p || status=1; done; exit $$status
	touch $@

# The natural-text test splits (data_prep/demo/natural.py): sentences of a book, voices
# no other split uses, clean and with 15-25 dB noise; prepared after the others (they
# need no tokenizer of their own).
$(DEMO_DATA)/natural/.done: | $(VENV)/.installed
	rm -rf $(DEMO_DATA)/natural
	$(PY) -m data_prep.demo.natural --output $(DEMO_DATA)/natural --utterances $(DEMO_NATURAL)
	touch $@

$(DEMO_DATA)/shards/.natural: $(DEMO_DATA)/shards/.done $(DEMO_DATA)/natural/.done
	pids=""; for split in $(NATURAL_SPLITS); do \
	  $(PY) -m data_prep.prepare --format manifest \
	    --input $(DEMO_DATA)/natural/$$split/manifest.jsonl --output $(DEMO_DATA)/shards \
	    --split $$split --tokenizer $(DEMO_TOKENIZER) $(DEMO_BEAM_ARGS) & \
	  pids="$$pids $$!"; \
	done; \
	status=0; for p in $$pids; do wait $$p || status=1; done; exit $$status
	touch $@

demo: $(DEMO_DATA)/shards/.done $(DEMO_DATA)/shards/.natural
	$(CHECK_CORPUS)
	$(PY) -m jaxspeech.train --config $(DEMO_CONFIG) --workdir $(DEMO_RUN) \
	    --config.data.dir=$(DEMO_DATA)/shards
	$(PY) -m jaxspeech.evaluate --workdir $(DEMO_RUN) --data $(DEMO_DATA)/shards \
	    --split test,$(subst $(space),$(comma),$(NATURAL_SPLITS))
	$(PY) -m data_prep.lm --data $(DEMO_DATA)/shards --split train --order 3 \
	    --output $(DEMO_RUN)/lm/train-3gram.arpa
	$(PY) -m jaxspeech.evaluate --workdir $(DEMO_RUN) --data $(DEMO_DATA)/shards \
	    --split test,$(subst $(space),$(comma),$(NATURAL_SPLITS)) \
	    --beam $(DEMO_LM_BEAM) --lm $(DEMO_RUN)/lm/train-3gram.arpa

# The text-to-speech split (data_prep/demo/synth.py --tts_heldout: unseen sentences by
# training speakers), prepared after the others with its phonemes required. A corpus
# synthesized before the manifests had phonemes (its prepared train split has no
# phonemes.json) or before this split cannot train or evaluate a synthesizer: one line says
# to rebuild it (its train, dev and test audio come back byte-identical).
$(DEMO_DATA)/shards/.tts_heldout: $(DEMO_DATA)/shards/.done
	@if [ ! -f $(DEMO_DATA)/shards/train/phonemes.json ]; then \
	  echo "make demo-tts: $(DEMO_DATA) was synthesized before the demo corpus had phonemes: remove it (rm -rf $(DEMO_DATA)) and rerun make demo-tts" >&2; exit 1; \
	elif [ ! -f $(DEMO_DATA)/raw/tts_heldout/manifest.jsonl ]; then \
	  echo "make demo-tts: $(DEMO_DATA) was synthesized before the demo corpus had a tts_heldout split: remove it (rm -rf $(DEMO_DATA)) and rerun make demo-tts" >&2; exit 1; \
	fi
	$(PY) -m data_prep.prepare --format manifest \
	    --input $(DEMO_DATA)/raw/tts_heldout/manifest.jsonl --output $(DEMO_DATA)/shards \
	    --split tts_heldout --tokenizer $(DEMO_TOKENIZER) --require_phonemes $(DEMO_BEAM_ARGS)
	touch $@

# The recognizer that transcribes the synthesized speech: `make demo`'s run, reused when
# DEMO_RUN holds one (its config.json), else trained first by `make demo` (after the
# corpus check above, so that a stale corpus stops the target before any training).
$(DEMO_RUN)/config.json: | $(DEMO_DATA)/shards/.tts_heldout
	@echo "make demo-tts: no recognizer run in $(DEMO_RUN): training it first (make demo)"
	$(MAKE) demo

# Trains the synthesizer and the vocoder (the trainer evaluates each on tts_heldout at the
# end), then scores the speech synthesized for tts_heldout, vocoded by Griffin-Lim and by
# the vocoder, the recognizer of DEMO_RUN transcribing it.
demo-tts: $(DEMO_DATA)/shards/.tts_heldout $(DEMO_RUN)/config.json
	$(CHECK_CORPUS)
	$(PY) -m jaxspeech.train --config $(DEMO_TTS_CONFIG) --workdir $(DEMO_TTS_RUN) \
	    --config.data.dir=$(DEMO_DATA)/shards
ifneq ($(DEMO_GTA_UTTERANCES),0)
	$(PY) -m jaxspeech.synthesize --workdir $(DEMO_TTS_RUN) --data $(DEMO_DATA)/shards \
	    --gta_split train --gta_max_utterances $(DEMO_GTA_UTTERANCES) --output $(DEMO_GTA)
endif
	$(PY) -m jaxspeech.train --config $(DEMO_VOCODER_CONFIG) --workdir $(DEMO_VOCODER_RUN) \
	    --config.data.dir=$(DEMO_DATA)/shards \
	    $(if $(filter-out 0,$(DEMO_GTA_UTTERANCES)),--config.vocoder.gta_mels=$(DEMO_GTA))
	$(PY) -m jaxspeech.evaluate --workdir $(DEMO_TTS_RUN) --data $(DEMO_DATA)/shards \
	    --split tts_heldout --asr_workdir $(DEMO_RUN) --vocoder_workdir $(DEMO_VOCODER_RUN)

# JAXSPEECH_REQUIRE_ONNX: the ONNX tests fail, not skip, if the converter is missing.
# worksteal: each worker starts on one contiguous half of the tests (a module's tests stay
# together, so its module-scoped fixtures, such as finished tiny runs, are built once, not
# on both workers) and an idle worker takes tests from the other's queue.
test: $(VENV)/.installed-dev $(ONNX_VENV)/.installed
	JAXSPEECH_REQUIRE_ONNX=1 $(PY) -m pytest -q -n 2 --dist worksteal --durations=20 tests

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean-demo:
	rm -rf $(DEMO_DATA) $(DEMO_RUN) $(DEMO_TTS_RUN)
