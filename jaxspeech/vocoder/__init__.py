"""The neural vocoder task (HiFi-GAN): the generator, its discriminators and losses, its
batches, objective, trainer task, evaluation, export and run loading. `inference` is the
interface other tasks may import: a trained vocoder turning log-mels into audio."""
