"""The text front end of speech synthesis: English text written out as words
(`normalize`), spoken by espeak-ng through its C library (`espeak`), its phoneme events
aligned to the audio (`phonemes`), and the demo corpus's voices (`demo_speakers`). The demo
corpus (`data_prep.demo`) is made with it and the synthesizer (`tts.frontend`) reads text
with it, so a sentence is phonemized at inference exactly as the corpus's were.
"""
