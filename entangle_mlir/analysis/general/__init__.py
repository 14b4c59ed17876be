"""The general tier: a shard_map program expanded per device and decided exactly, behind the
layout tier (docs/architecture.md, "General tier").

`tier.run_general_tier` runs it: `expand.py` walks the program per device, `decide.py`
decides each equality. Importing this package costs nothing (the pass imports `tier` only
where the layout tier did not prove the program: it loads z3 and the semantics).
"""

MAX_DEVICES = 64
"""The most devices the general tier expands (a refusal beyond, not a guess)."""
