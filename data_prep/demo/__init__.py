"""The synthetic espeak-ng demo corpus generator.

    python -m data_prep.demo.synth --output DIR [--hours 3] [--seed 0] [--workers N]

`synth` plans and renders the multi-speaker English corpus, `sentences` and `lexicon` make
its text, `espeak` wraps libespeak-ng, `phonemes` maps the phoneme timing espeak-ng
reports onto the rendered audio (the manifests' "phonemes" and "phoneme_ends"). The readers
of real corpora are in `data_prep.readers`, the sharding job in `data_prep.prepare`.
"""
