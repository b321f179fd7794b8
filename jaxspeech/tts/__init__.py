"""Text-to-speech: a FastSpeech2-style acoustic model (tokens -> log-mel frames) with its
length regulator and losses, and the vocoders that turn those frames into audio (Griffin-Lim
on the host; HiFi-GAN's generator, discriminators and losses). Data and training live
elsewhere."""
