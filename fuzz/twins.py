"""Hand-written wrong twins: the nearest wrong variant of a correct sharded program, grounded.

Each `Twin` is a reference, a correct shard_map body and one or more wrong bodies that differ
from it by one value-semantic detail (a dtype, a conversion, signed vs unsigned, floor vs
truncating division, a device offset, a ppermute pair, a boolean op). Every body is executed
on 8 simulated CPU devices on the attacker's input sets (`fuzz.attack.input_sets`: random,
ties, +-0, large, near 2^24, near 2^31) plus the twin's own chosen inputs, and checked:
* a wrong twin must compute other numbers on some input set (else the twin is `ungrounded`,
  a defect of the twin) and must not be proven (`false_proof`);
* the correct twin must compute the reference's numbers; whether it is proven is reported
  (`proven` / `incomplete`) but is not a soundness question.
The correct twins are also subjects of the value-mutation attacker (`subjects()`, source
`twins` of benchmarks/attack.py). Written in session 9 (benchmarks/ATTACK_RESULTS.md).

Importing this module imports jax with 8 simulated CPU devices (through `fuzz.attack`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from fuzz.attack import Arg, input_sets, numbers_differ, real_subject
from fuzz.run import timed_check


@dataclass(frozen=True)
class Twin:
    """A correct sharded body and its wrong near variants, one reference."""

    name: str
    reference: Callable
    correct: Callable
    wrongs: dict[str, Callable]
    args: tuple
    out_specs: object
    mesh: tuple = (("tp", 4),)
    what: str = ""
    extra: Callable[[], list[list[np.ndarray]]] | None = field(default=None, compare=False)


@dataclass
class TwinOutcome:
    twin: str
    variant: str            # "correct" or the wrong variant's label
    status: str             # proven / incomplete / caught / false_proof / ungrounded / crash...
    numbers: str = ""       # same / ulp / differ
    inputs: str = ""
    message: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def example(t: Twin, variant: str):
    """The examples.real.catalog Example of one variant ("correct" or a wrong label)."""
    from examples.real.catalog import custom

    body = t.correct if variant == "correct" else t.wrongs[variant]
    name = t.name if variant == "correct" else f"{t.name}__{variant}"
    return custom(name, t.mesh, t.reference, body, list(t.args), t.out_specs, t.what,
                  bug=None if variant == "correct" else variant)


def _inputs(t: Twin) -> list[tuple[str, list[np.ndarray]]]:
    args = [Arg(tuple(a.shape), a.dtype, a.kind, a.high, a.fan_in) for a in t.args]
    sets = input_sets(args)
    if t.extra is not None:
        sets += [(f"chosen{k}", inputs) for k, inputs in enumerate(t.extra())]
    return sets


def judge_twin(t: Twin, timeout: int = 60) -> list[TwinOutcome]:
    """Run and check the correct twin and every wrong one (see the module docstring)."""
    sets = _inputs(t)
    good = real_subject(example(t, "correct"))
    good_run = good.compile(good.text)
    refs = [(label, inputs, good.reference(inputs)) for label, inputs in sets]
    bases = [good.run(good_run, inputs) for _, inputs, _ in refs]
    out = []
    for variant in ("correct", *t.wrongs):
        start = time.perf_counter()
        sub = good if variant == "correct" else real_subject(example(t, variant))
        compiled = good_run if variant == "correct" else sub.compile(sub.text)
        worst, where = "same", []
        for (label, inputs, ref), base in zip(refs, bases, strict=True):
            got = sub.run(compiled, inputs)
            v = numbers_differ(ref, ref if variant == "correct" else base, got)
            if v != "same":
                where.append(f"{label}:{v}")
                worst = "differ" if "differ" in (v, worst) else "ulp"
        report, err, msg = timed_check(sub.ref_text, sub.text, verify_rules=False,
                                       timeout=timeout)
        proven = report is not None and report.proven
        if proven and (variant != "correct" or worst != "same"):
            again, err2, msg2 = timed_check(sub.ref_text, sub.text, verify_rules=True,
                                            timeout=timeout)
            proven = again is not None and again.proven
            err, msg = (err2, msg2) if again is None else (err, msg)
            report = again if again is not None else report
        message = msg[-400:] if err else "" if proven or not report.diagnostics else \
            report.diagnostics[0].message[:300]
        if err in ("crash", "timeout"):
            status = err
        elif variant == "correct":
            status = ("wrong_reference" if worst == "differ" else
                      "proven" if proven else "incomplete")
        elif worst == "same":
            status = "ungrounded"
        else:
            status = "false_proof" if proven else "caught"
        out.append(TwinOutcome(t.name, variant, status, worst, ",".join(where), message,
                               time.perf_counter() - start))
    return out


# ----- the twins -----------------------------------------------------------------------------------

def twins() -> list[Twin]:
    """Every hand-written twin (built on demand: jax is imported here)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    from examples.real.programs import ArgDef

    def arg(name, shape, dtype, spec, kind="data", high=0):
        return ArgDef(name, shape, dtype, kind, spec, high)

    rows = P("tp", None)
    xf_rows = arg("x", (8, 16), "float32", rows)
    xf_cols = arg("x", (8, 16), "float32", P(None, "tp"))
    xi_rows = arg("x", (8, 16), "int32", rows)
    x8_rows = arg("x", (16, 16), "int8", rows)
    xu8_cols = arg("x", (8, 16), "uint8", P(None, "tp"))
    block = arg("x", (16, 3), "float32", P())

    def all_int8():
        return [[np.arange(-128, 128, dtype=np.int8).reshape(16, 16)]]

    def int32_edges():
        edge = np.array([-2 ** 31, -2 ** 31 + 1, -7, -5, -1, 0, 1, 5, 7, 2 ** 31 - 2,
                         2 ** 31 - 1, -2, 2, 3, -3, 100], np.int64).astype(np.int32)
        return [[np.stack([np.roll(edge, k) for k in range(8)])]]

    def sliced(offset):
        def body(x):
            return lax.dynamic_slice_in_dim(x, offset(lax.axis_index("tp")), 4)
        return body

    def ring(perm, trips=3):
        def body(x):
            def step(_, carry):
                acc, blk = carry
                blk = lax.ppermute(blk, "tp", perm)
                return acc + blk, blk
            return lax.fori_loop(0, trips, step, (x, x))[0]
        return body

    def ring_sum(x):
        return jnp.tile(jnp.sum(x.reshape(4, 2, 16), axis=0), (4, 1))

    def iota_slice(dtype):
        def body(x):
            mine = lax.dynamic_slice_in_dim(jnp.arange(512, dtype=dtype),
                                            lax.axis_index("tp") * 128, 128)
            return jnp.where(mine[None, :] < dtype(100), x, 0.0)
        return body

    def columns(modulo):
        def body(x):
            cols = lax.axis_index("tp") * 128 + jnp.arange(128)
            cols = cols % modulo if modulo else cols
            return x * cols[None, :].astype(jnp.float32)
        return body

    def columns_of(table):
        def body(x):
            mine = lax.dynamic_slice_in_dim(table(), lax.axis_index("tp") * 128, 128)
            return x * mine[None, :].astype(jnp.float32)
        return body

    wide = arg("x", (4, 512), "float32", P(None, "tp"))
    next1 = [(j, (j + 1) % 4) for j in range(4)]
    next2 = [(j, (j + 2) % 4) for j in range(4)]

    def count_ref(x):
        return jnp.sum((x > 0).astype(jnp.int32), axis=1)

    def local_count(dtype):
        def body(x):
            local = jnp.sum((x > 0).astype(dtype), axis=1, dtype=dtype)
            return lax.psum(local.astype(jnp.int32), "tp")
        return body

    return [
        Twin("tw_int8_through_float", lambda x: x.astype(jnp.uint8),
             lambda x: x.astype(jnp.int16).astype(jnp.uint8),
             {"through_f16": lambda x: x.astype(jnp.float16).astype(jnp.uint8),
              "through_f32": lambda x: x.astype(jnp.float32).astype(jnp.uint8)},
             (x8_rows,), rows, what="int8 -> uint8 wraps; through a float it saturates at 0",
             extra=all_int8),
        Twin("tw_uint8_through_float", lambda x: x.astype(jnp.int8),
             lambda x: x.astype(jnp.int32).astype(jnp.int8),
             {"through_f32": lambda x: x.astype(jnp.float32).astype(jnp.int8),
              "through_bf16": lambda x: x.astype(jnp.bfloat16).astype(jnp.int8)},
             (xu8_cols,), P(None, "tp"), what="uint8 -> int8 wraps; through a float it saturates"),
        Twin("tw_int8_increment", lambda x: x.astype(jnp.int32) + 1,
             lambda x: x.astype(jnp.int32) + 1,
             {"add_in_int8": lambda x: (x + jnp.int8(1)).astype(jnp.int32)},
             (x8_rows,), rows, what="x + 1 in int8 wraps at 127", extra=all_int8),
        Twin("tw_floor_division", lambda x: x // 4, lambda x: x // 4,
             {"truncating": lambda x: lax.div(x, 4),
              "logical_shift": lambda x: lax.shift_right_logical(x, 2)},
             (xi_rows,), rows, what="floor division of negatives", extra=int32_edges),
        Twin("tw_floor_modulo", lambda x: x % 5, lambda x: x % 5,
             {"truncating": lambda x: lax.rem(x, 5), "divisor_sign": lambda x: x % -5},
             (xi_rows,), rows, what="floor modulo of negatives", extra=int32_edges),
        Twin("tw_unsigned_compare",
             lambda x: (x.astype(jnp.uint32) < 7).astype(jnp.int32),
             lambda x: (x.astype(jnp.uint32) < 7).astype(jnp.int32),
             {"signed": lambda x: (x < 7).astype(jnp.int32)},
             (xi_rows,), rows, what="unsigned compare of negatives", extra=int32_edges),
        Twin("tw_unsigned_divide",
             lambda x: (x.astype(jnp.uint32) // 3).astype(jnp.int32),
             lambda x: (x.astype(jnp.uint32) // 3).astype(jnp.int32),
             {"signed": lambda x: lax.div(x, 3)},
             (xi_rows,), rows, what="unsigned division of negatives", extra=int32_edges),
        Twin("tw_int16_through_bf16", lambda x: x.astype(jnp.int16).astype(jnp.int32),
             lambda x: x.astype(jnp.int16).astype(jnp.int32),
             {"through_bf16": lambda x: x.astype(jnp.int16).astype(jnp.bfloat16)
              .astype(jnp.int32)},
             (xi_rows,), rows, what="int16 does not fit bf16's 8-bit significand"),
        Twin("tw_bool_count", count_ref, local_count(jnp.int32),
             {"or_not_add": lambda x: lax.psum(lax.reduce(x > 0, False, lax.bitwise_or, (1,))
                                               .astype(jnp.int32), "tp"),
              "all_not_any": lambda x: lax.pmin(jnp.all(x > 0, axis=1).astype(jnp.int32),
                                                "tp")},
             (xf_cols,), P(), what="count of x > 0: booleans add as or"),
        Twin("tw_bool_sum_float", lambda x: ((x > 0) | (x < 1)).astype(jnp.float32),
             lambda x: jnp.maximum(x > 0, x < 1).astype(jnp.float32),
             {"added_as_numbers": lambda x: (x > 0).astype(jnp.float32)
              + (x < 1).astype(jnp.float32),
              "min_is_and": lambda x: jnp.minimum(x > 0, x < 1).astype(jnp.float32)},
             (xf_rows,), rows, what="or of booleans: max on i1, not + of the indicators"),
        Twin("tw_select_constants", lambda x: jnp.where(x > 0, 3.0, 1.0),
             lambda x: 1.0 + 2.0 * (x > 0).astype(jnp.float32),
             {"compare_ge": lambda x: 1.0 + 2.0 * (x >= 0).astype(jnp.float32),
              "bf16_constant": lambda x: jnp.where(x > 0, jnp.bfloat16(1 + 2 ** -8 + 2 ** -30),
                                                   jnp.bfloat16(0)).astype(jnp.float32)},
             (xf_rows,), rows, what="a select of constants as an affine indicator"),
        Twin("tw_device_offset", lambda x: x, sliced(lambda i: ((2 * i - 1) // 2 + 1) * 4),
             {"clamped_end": sliced(lambda i: i * 4 + 1),
              "truncating_division": sliced(lambda i: (lax.div(2 * i - 1, 2) + 1) * 4),
              "sign_off_by_one": sliced(lambda i: (i + jnp.sign(i - 1)) * 4),
              "xor_one": sliced(lambda i: (i ^ 1) * 4)},
             (block,), P("tp"), what="each device slicing its own rows at a computed offset"),
        Twin("tw_ring_loop", ring_sum, ring(next1),
             {"shift_two": ring(next2), "two_trips": ring(next1, 2),
              "swapped_pairs": ring([(0, 1), (1, 0), (2, 3), (3, 2)])},
             (arg("x", (8, 16), "float32", rows),), rows,
             what="ring all-reduce: ppermute carried over a fori_loop"),
        Twin("tw_narrow_iota", lambda x: jnp.where(jnp.arange(512)[None, :] < 100, x, 0.0),
             iota_slice(jnp.int16),
             {"int8_iota": iota_slice(jnp.int8), "uint8_iota": iota_slice(jnp.uint8)},
             (wide,), P(None, "tp"), what="a device's slice of an iota of 512 in int8 / uint8 "
             "wraps"),
        Twin("tw_uint8_iota_reference",
             lambda x: x * jnp.arange(512, dtype=jnp.uint8)[None, :].astype(jnp.float32),
             columns(256), {"unwrapped": columns(0), "modulo_255": columns(255)},
             (wide,), P(None, "tp"), what="the reference's uint8 iota of 512 restarts at 256"),
        Twin("tw_bf16_iota_reference",
             lambda x: x * jnp.arange(512, dtype=jnp.bfloat16)[None, :].astype(jnp.float32),
             columns_of(lambda: jnp.arange(512).astype(jnp.bfloat16)),
             {"exact_positions": columns_of(lambda: jnp.arange(512, dtype=jnp.float32)),
              "int8_positions": columns_of(lambda: jnp.arange(512).astype(jnp.int8))},
             (wide,), P(None, "tp"), what="a bf16 iota of 512 rounds its odd positions "
             "above 256"),
        Twin("tw_float_constant_to_int",
             lambda x: x + jnp.full(x.shape, 3e9, jnp.float32).astype(jnp.int32),
             lambda x: x + jnp.int32(2 ** 31 - 1),
             {"wrapped": lambda x: x + jnp.int32(3_000_000_000 - 2 ** 32)},
             (xi_rows,), rows, what="a float constant beyond int32 converts to INT_MAX"),
        Twin("tw_compare_rounded", lambda x: jnp.where(x + 1.0 > x, x, 0.0),
             lambda x: jnp.where(x < 1.0 + x, x, 0.0),
             {"decided_over_reals": lambda x: x,
              "ge_for_gt": lambda x: jnp.where(x + 1.0 >= x, x, 0.0)},
             (xf_rows,), rows, what="x + 1 > x is false in f32 for |x| >= 2^24",
             extra=lambda: [[np.float32(2.0 ** 24) * np.arange(-64, 64, dtype=np.float32)
                             .reshape(8, 16)]]),
        Twin("tw_narrow_count", count_ref, local_count(jnp.int32),
             {"int8_local": local_count(jnp.int8)},
             (arg("x", (4, 1024), "float32", P(None, "tp")),), P(),
             what="a local count over 256 columns in int8 wraps"),
        *rounding_twins(),
    ]


def _near_2_24(low: float, high: float):
    """Chosen inputs: rows (8, 16) starting with `low`, `high` (then zeros): values just below
    2^24 that `+ 2.0` rounds to one f32 value."""
    def make():
        row = np.array([low, high] + [0.0] * 14, np.float32)
        return [[np.tile(row, (8, 1))]]
    return make


def _near_smallest_normal():
    """Chosen inputs: rows (8, 16) whose left half is just above its right half, both near
    f32's smallest normal (1.2e-38): their difference is subnormal, which XLA's CPU flushes to
    zero."""
    def make():
        left = np.float32(1.17549435e-38) * np.float32(1.25)
        right = np.nextafter(np.float32(1.17549435e-38), np.float32(1))
        row = np.array([left] * 8 + [right] * 8, np.float32)
        return [[np.tile(row, (8, 1))]]
    return make


def _ulps_below(value: float):
    """Chosen inputs: the 128 f32 values just below `value`."""
    def make():
        out = np.empty(128, np.float32)
        below = np.float32(value)
        for k in range(128):
            below = np.nextafter(below, np.float32(-np.inf))
            out[k] = below
        return [[out.reshape(8, 16)]]
    return make


def rounding_twins() -> list[Twin]:
    """Session 10: decisions on values float arithmetic computed, which the exact reals decide
    otherwise (benchmarks/ATTACK_RESULTS.md, tenth session): argmax / top_k / sort of `x + 2`
    (ties made by rounding), compares and converts of folded float constants, a double
    rounding f32 -> bf16, float positions past 2^24, and the neighbours of `x + 1 > x` the
    fix covers (is_finite, !=, bf16, floor, astype)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    from examples.real.programs import ArgDef

    rows, cols = P("tp", None), P(None, "tp")
    xf_rows = ArgDef("x", (8, 16), "float32", "data", rows, 0)
    xf_cols = ArgDef("x", (8, 16), "float32", "data", cols, 0)
    xi_rows = ArgDef("x", (8, 16), "int32", "data", rows, 0)
    ties = _near_2_24(2.0 ** 24 - 2, 2.0 ** 24 - 1)
    reversed_ties = _near_2_24(2.0 ** 24 - 1, 2.0 ** 24 - 2)

    def full(x, value):
        return jnp.full(x.shape, value, jnp.float32)

    def summed(x):  # 2^24 + 1.0 in f32: 2^24, folded exactly: 2^24 + 1
        return full(x, 2.0 ** 24) + full(x, 1.0)

    def twice_rounded(x):  # 1.01171875 - 2^-25: 1.01171875 in f32, a bf16 tie
        return full(x, 1 + 2 ** -7 + 2 ** -8) + full(x, -2.0 ** -25)

    def positions(offset: float, bound: float):
        def body(x):
            pos = (lax.axis_index("tp") * 4 + jnp.arange(4)).astype(jnp.float32) + offset
            return jnp.where(pos[None, :] < jnp.float32(bound), x, 0.0)
        return body

    def prefix(n: int):
        return lambda x: jnp.where((lax.axis_index("tp") * 4 + jnp.arange(4))[None, :] < n,
                                   x, 0.0)

    return [
        Twin("tw_argmax_rounded", lambda x: jnp.argmax(x + 2.0, axis=1).astype(jnp.int32),
             lambda x: jnp.argmax(2.0 + x, axis=1).astype(jnp.int32),
             {"unshifted": lambda x: jnp.argmax(x, axis=1).astype(jnp.int32),
              "argmin_negated": lambda x: jnp.argmin(-x, axis=1).astype(jnp.int32)},
             (xf_rows,), P("tp"), what="argmax(x + 2): 2^24-2 and 2^24-1 tie in f32",
             extra=ties),
        Twin("tw_top_k_rounded", lambda x: lax.top_k(x + 2.0, 2)[1],
             lambda x: lax.top_k(2.0 + x, 2)[1],
             {"unshifted": lambda x: lax.top_k(x, 2)[1]},
             (xf_rows,), rows, what="top_k(x + 2).indices: ties made by rounding", extra=ties),
        Twin("tw_argsort_rounded",
             lambda x: jnp.argsort(x + 2.0, axis=1, stable=True).astype(jnp.int32),
             lambda x: jnp.argsort(2.0 + x, axis=1, stable=True).astype(jnp.int32),
             {"unshifted": lambda x: jnp.argsort(x, axis=1, stable=True).astype(jnp.int32)},
             (xf_rows,), rows, what="a stable argsort of x + 2: rounded ties keep their order",
             extra=reversed_ties),
        Twin("tw_constant_compare",
             lambda x: jnp.where(summed(x) > full(x, 2.0 ** 24), x, 0.0),
             lambda x: jnp.where(summed(x) >= full(x, 2.0 ** 25), x, 0.0),
             {"decided_over_reals": lambda x: x},
             (xf_rows,), rows, what="f32 constants 2^24 + 1.0 fold to 2^24, not above it"),
        Twin("tw_constant_indicator",
             lambda x: x + (summed(x) > full(x, 2.0 ** 24)).astype(jnp.float32),
             lambda x: x + (summed(x) == full(x, 2.0 ** 25)).astype(jnp.float32),
             {"decided_over_reals": lambda x: x + 1.0},
             (xf_rows,), rows, what="a compare of folded f32 constants as a number"),
        Twin("tw_constant_to_int", lambda x: x + summed(x).astype(jnp.int32),
             lambda x: x + jnp.int32(2 ** 24),
             {"exact_sum": lambda x: x + jnp.int32(2 ** 24 + 1)},
             (xi_rows,), rows, what="(2^24 + 1.0).astype(int32) of f32 constants is 2^24"),
        Twin("tw_double_rounding",
             lambda x: x + twice_rounded(x).astype(jnp.bfloat16).astype(jnp.float32),
             lambda x: x + jnp.float32(1 + 2 ** -6),
             {"single_rounding": lambda x: x + jnp.float32(1 + 2 ** -7),
              "reduce_precision": lambda x: x + lax.reduce_precision(
                  full(x, 1 + 2 ** -7 + 2 ** -8) - 2.0 ** -25, exponent_bits=8,
                  mantissa_bits=7) * 0.0 + jnp.float32(1 + 2 ** -7)},
             (xf_rows,), rows, what="f32 then bf16 rounds twice: 1.015625, not 1.0078125"),
        Twin("tw_float_positions", lambda x: jnp.where(
                 jnp.arange(16).astype(jnp.float32)[None, :] + 2.0 ** 24
                 < jnp.float32(2.0 ** 24 + 9), x, 0.0),
             prefix(7), {"exact_positions": prefix(9),
                         "float_positions": positions(2.0 ** 24, 2.0 ** 24 + 10)},
             (xf_cols,), cols, what="float positions past 2^24 round: a mask of 7, not 9"),
        Twin("tw_float_positions_exact", lambda x: jnp.where(jnp.arange(16)[None, :] < 9, x, 0.0),
             positions(0.5, 9.0), {"off_by_one": positions(0.5, 8.0)},
             (xf_cols,), cols, what="a causal-style mask on float positions (exact: proven)"),
        Twin("tw_compare_neighbours", lambda x: (x + 1.0 != x).astype(jnp.float32),
             lambda x: (1.0 + x != x).astype(jnp.float32),
             {"decided_over_reals": lambda x: x - x + 1.0,
              "bf16_sum": lambda x: (x.astype(jnp.bfloat16) + jnp.bfloat16(1)
                                     != x.astype(jnp.bfloat16)).astype(jnp.float32),
              "is_finite": lambda x: jnp.isfinite(x * 3e38).astype(jnp.float32)},
             (xf_rows,), rows, what="x + 1 != x is false in f32 for |x| >= 2^24",
             extra=lambda: [[np.float32(2.0 ** 24) * np.arange(-64, 64, dtype=np.float32)
                             .reshape(8, 16)]]),
        Twin("tw_floor_rounded", lambda x: jnp.floor(jnp.abs(x) + 0.5),
             lambda x: jnp.floor(0.5 + jnp.abs(x)),
             {"round_half_away": lambda x: lax.round(jnp.abs(x),
                                                     lax.RoundingMethod.AWAY_FROM_ZERO),
              "astype": lambda x: (jnp.abs(x) + 0.5).astype(jnp.int32).astype(jnp.float32)
              * 0.0 + lax.round(jnp.abs(x), lax.RoundingMethod.AWAY_FROM_ZERO)},
             (xf_rows,), rows, what="floor(|x| + 0.5) is 1 at the f32 just below 0.5",
             extra=_ulps_below(0.5)),
        Twin("tw_exp_approximate",
             lambda x: jnp.where(jnp.exp(x * 0.0 + jnp.float32(-9.998800277709961))
                                 > jnp.float32(4.5454427890945226e-05), x, 0.0),
             lambda x: jnp.where(x != x, x, 0.0),  # noqa: PLR0124
             {"exact_exp": lambda x: x},
             (xf_rows,), rows, what="XLA's exp is not correctly rounded: exp(-9.9988003) in f32 "
             "is 4.5454428e-05 on CPU, below the exact value (and its correct rounding)"),
        Twin("tw_flushed_difference",
             lambda x: (x[:, :8] > x[:, 8:]).astype(jnp.float32),
             lambda x: (x[:, 8:] < x[:, :8]).astype(jnp.float32),
             {"difference_sign": lambda x: (x[:, :8] - x[:, 8:] > 0).astype(jnp.float32),
              "sign_of_difference": lambda x: jnp.maximum(jnp.sign(x[:, :8] - x[:, 8:]), 0.0)},
             (xf_rows,), rows, what="x - y > 0 is not x > y: XLA's CPU flushes a subnormal "
             "difference to zero", extra=_near_smallest_normal()),
        Twin("tw_flushed_product",
             lambda x: jnp.where(jnp.clip(x, 1.0, 2.0) * jnp.float32(1e-39) > 0, x + 1.0, 0.0),
             lambda x: jnp.where(0 < jnp.float32(1e-39) * jnp.clip(x, 1.0, 2.0), x + 1.0, 0.0),
             {"decided_over_reals": lambda x: x + 1.0,
              "sign_over_reals": lambda x: jnp.where(
                  jnp.sign(jnp.clip(x, 1.0, 2.0)) > 0, x + 1.0, 0.0)},
             (xf_rows,), rows, what="a positive product with a subnormal constant is 0 on "
             "XLA's CPU (it reads the constant as zero)"),
        Twin("tw_flushed_square",
             lambda x: jnp.where(jnp.square(jnp.clip(x, 1e-20, 2e-20)) > 0, x + 1.0, 0.0),
             lambda x: jnp.where(0 < jnp.square(jnp.clip(x, 1e-20, 2e-20)), x + 1.0, 0.0),
             {"decided_over_reals": lambda x: x + 1.0},
             (xf_rows,), rows, what="a square of 1e-20 is subnormal: XLA's CPU flushes it "
             "to 0"),
        Twin("tw_int_plus_one", lambda x: (x + 1 > x).astype(jnp.int32),
             lambda x: (1 + x > x).astype(jnp.int32),
             {"decided": lambda x: x - x + 1,
              "unsigned": lambda x: (x.astype(jnp.uint32) + 1
                                     > x.astype(jnp.uint32)).astype(jnp.int32)},
             (xi_rows,), rows, what="x + 1 > x wraps at INT_MAX"),
    ]


def subjects(only: str = "") -> list:
    """(source, name, factory) of the correct twins as subjects of the mutation attacker."""
    out = []
    for t in twins():
        ex = example(t, "correct")
        out.append(("twins", ex.name, lambda ex=ex: real_subject(ex)))
    return [s for s in out if only in s[1]]
