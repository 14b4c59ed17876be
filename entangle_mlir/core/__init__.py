"""The foundation: reference terms, relations, meshes, dtypes and the vocabulary of verdicts.

Nothing here knows MLIR ops, rules, passes or Z3."""
