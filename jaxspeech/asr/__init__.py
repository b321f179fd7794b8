"""The speech-recognition task: its trainer task (`task.AsrTask`). ASR's models, decoders,
losses and evaluation stay in the core rooms (`models`, `decoding`, `losses`,
`evaluation`): distillation, long-form serving, export and the parallel tests share them."""
