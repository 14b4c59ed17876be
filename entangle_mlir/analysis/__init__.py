"""The analyses over a normalized pair: the forward walk, layer reuse, valid indices, refinement
of outputs, and Z3 checks of every rule instance."""
