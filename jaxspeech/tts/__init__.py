"""Text-to-speech: a FastSpeech2-style acoustic model (tokens -> log-mel frames) with its
length regulator and losses. Vocoders, data and training live elsewhere."""
