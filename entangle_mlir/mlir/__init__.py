"""Loading programs: MLIR and XLA HLO text, the reference/sharded pair, op descriptions and
per-device shardings.

Lower modules first: `ir` and `opinfo`, then `per_device` and `xla`, then `load` (a file in
either format) and `program` (the pair)."""
