"""The text-to-speech task (FastSpeech2-style): the acoustic model (tokens -> log-mel
frames) with its length regulator and losses, its batches, objective, trainer task,
evaluation, export, run loading, and speech from text (`synthesis`, `frontend`: what
`python -m jaxspeech.synthesize` runs). It hears its audio through the vocoder's declared
interface (`jaxspeech.vocoder.inference`) or Griffin-Lim (`jaxspeech.audio.griffin_lim`)."""
