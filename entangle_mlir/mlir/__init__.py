"""Loading programs: MLIR and XLA HLO text, the reference/sharded pair, op descriptions and
per-device shardings."""
