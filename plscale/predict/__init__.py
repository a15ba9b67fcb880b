"""Pure models shared by `plscale estimate` and every lab's predictions: model presets and
parameter counts, memory per rank, collective bandwidth. No torch."""
