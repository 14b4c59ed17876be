"""The pytest plugin (`entangle_check` fixture): a model repository's own test fails with the
diagnostic as its first line, and passes on a proven program (both grounded by running)."""

from __future__ import annotations

import importlib.metadata
import textwrap

pytest_plugins = ["pytester"]

MODEL = textwrap.dedent('''
    import os
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    SPECS = (P(None, "tp"), P("tp", None))
    SHAPES = ((8, 16), (16, 8))


    def reference(x, w):
        return jnp.tanh(x @ w)


    def body(x, w):
        return jnp.tanh(jax.lax.psum(x @ w, "tp"))


    def body_missing_psum(x, w):
        return jnp.tanh(x @ w)   # BUG: the partial sums are never summed


    def sharded(fn):
        mesh = jax.make_mesh((4,), ("tp",))
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=SPECS, out_specs=P(),
                                     check_vma=False))


    def avals():
        mesh = jax.make_mesh((4,), ("tp",))
        return [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
                for s, p in zip(SHAPES, SPECS)]


    def run(fn):
        rng = np.random.default_rng(0)
        x, w = (rng.standard_normal(s).astype(np.float32) for s in SHAPES)
        placed = [jax.device_put(v, a.sharding) for v, a in zip((x, w), avals())]
        return np.asarray(reference(x, w)), np.asarray(sharded(fn)(*placed))
''')

TESTS = textwrap.dedent('''
    import numpy as np
    from model import avals, body, body_missing_psum, reference, run, sharded


    def test_grounding():
        want, got = run(body)
        assert np.allclose(want, got, rtol=1e-4, atol=1e-5)
        want, got = run(body_missing_psum)
        assert not np.allclose(want, got, rtol=1e-2)


    def test_correct(entangle_check):
        report = entangle_check.refines(reference, sharded(body), *avals(), verify_rules=False)
        assert report.proven


    def test_buggy(entangle_check):
        entangle_check.refines(reference, sharded(body_missing_psum), *avals(),
                               verify_rules=False)
''')


def test_the_plugin_is_installed_with_entangle() -> None:
    found = [e for e in importlib.metadata.entry_points(group="pytest11")
             if e.value == "entangle_mlir.pytest_plugin"]
    assert found, "pyproject declares the pytest11 entry point; reinstall (pip install -e .)"


def test_fixture_passes_and_fails_with_the_diagnostic_first(pytester) -> None:
    pytester.makepyfile(model=MODEL, test_model=TESTS)
    # the plugin comes from the installed entry point, as in a model repository
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=2, failed=1)
    text = result.stdout.str()
    # the failure's first line is the diagnostic at the user's BUG line
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "test_buggy" in line and "_" in line)
    first = next(line for line in lines[start + 1:] if line.strip())
    assert "model.py:" in first and "error:" in first, text
    assert "partial sum over 'tp'" in first, text
    # no entangle frames in the failure
    assert "entangle_mlir/pytest_plugin.py" not in text and "entangle_mlir/jax.py" not in text
