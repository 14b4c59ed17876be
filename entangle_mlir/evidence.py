"""Evidence for a "not proven" verdict: run both programs on one random input and show that
the numbers differ (JAX front-end only; needs as many devices as the mesh)."""

from __future__ import annotations

import math

import numpy as np


def output_evidence(reference_fn, sharded_fn, avals, seed: int = 0) -> dict:
    """Max |sharded - reference| per output on seeded random normal inputs."""
    import jax

    rng = np.random.default_rng(seed)
    try:
        args = []
        for aval in avals:
            value = rng.standard_normal(aval.shape).astype(aval.dtype)
            sharding = getattr(aval, "sharding", None)
            args.append(jax.device_put(value, sharding) if sharding is not None else value)
        want = jax.tree.leaves(jax.jit(reference_fn)(*[np.asarray(a) for a in args]))
        got = jax.tree.leaves(sharded_fn(*args))
    except Exception as err:  # noqa: BLE001 - evidence is best effort, never a failure
        return {"summary": f"not available ({type(err).__name__}: {err})"}
    diffs = [float(np.max(np.abs(np.asarray(w, np.float64) - np.asarray(g, np.float64))))
             if np.shape(w) == np.shape(g) else float("inf") for w, g in zip(want, got)]
    finite = [d for d in diffs if math.isfinite(d)]
    if len(finite) != len(diffs):
        summary = (f"on a random input (seed {seed}) some outputs are not finite (inf or NaN), "
                   "so they cannot be compared numerically")
    elif max(finite, default=0.0) > 1e-5:
        summary = (f"on a random input (seed {seed}) the outputs differ by up to "
                   f"{max(finite):.3g}")
    else:
        summary = (f"on a random input (seed {seed}) the outputs agree to "
                   f"{max(finite, default=0.0):.1g}: the difference needs other inputs, or it "
                   "is beyond what was proven")
    return {"seed": seed, "max_abs_diff": [d if math.isfinite(d) else None for d in diffs],
            "summary": summary}
