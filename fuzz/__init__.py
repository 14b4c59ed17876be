"""Differential fuzzing of entangle: random shard_map programs (correct by construction and
mutated), executed on simulated devices and checked. `gen` builds programs without jax; `run`
lowers, executes and classifies them; `strategies` wraps the generator for hypothesis."""

from fuzz.gen import (
    GenOptions,
    Program,
    RandomChooser,
    generate,
    generate_seed,
    mutate,
    program_mutations,
)

__all__ = ["GenOptions", "Program", "RandomChooser", "generate", "generate_seed", "mutate",
           "program_mutations"]
