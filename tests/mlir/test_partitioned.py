"""Programs partitioned by XLA's SPMD partitioner (jit with shardings), checked by entangle.

* every function of `examples/partitioned.py` lowered by `check_partitioned`'s path: proven, or
  pinned as `xfail(strict=True)` with the library change it waits for;
* the same programs EXECUTED per device (`run_per_device`: N simulated CPU devices as replicas)
  match the reference, so what is checked is what XLA runs;
* mutations mirroring real partitioner bugs change the numbers (execution), are never proven,
  and are flagged at the mutated op;
* per-device layouts from every `mhlo.sharding` form, HLO dumps through `entangle check`;
* minimal reproducers of each missing library feature (strict xfails, for the lead).
"""

from __future__ import annotations

import functools
import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import expected_per_device, run_per_device
from examples.partitioned import (
    CASES,
    MUTATION_FILE,
    MUTATIONS,
    Mutation,
    lower,
    mesh,
    mutated,
)
from tests.shared import check_unprovable, needs_jaxlib

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")

BY_NAME = {case.name: case for case in CASES}


@functools.cache
def lowered(name: str) -> tuple[str, bytes]:
    """(reference text, XLA's partitioned program as StableHLO bytecode), compiled once."""
    return lower(BY_NAME[name])


# ----- what each failing case waits for (library changes, not in the files this suite owns) ----

XFAIL_CASES: dict[str, str] = {}

PARTITIONED_BEFORE_0_10 = {
    "shift_sharded": needs_jaxlib((0, 10), "older XLA partitions the roll of a split dim "
                                  "with an all_to_all over both mesh axes, which has no rule"),
    "take_sharded_table": needs_jaxlib((0, 10), "older XLA clamps the ids against a "
                                       "device-dependent offset table, which has no rule"),
}
"""Corpus functions whose partitioning by an older XLA is not proven: the verdict depends on
the jax that lowers them (the partitioned programs themselves run like the reference)."""

REFERENCE_RUN_BEFORE_0_10 = {
    "uneven_rows": needs_jaxlib((0, 10), "older jax refuses to run the reference: its "
                                "with_sharding_constraint of 10 rows on 4 devices raises "
                                "'not divisible'"),
}


def _params(names, xfails, marks=None):
    marks = marks or {}
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=xfails[n]))
            if n in xfails else pytest.param(n, marks=marks[n]) if n in marks else n
            for n in names]


# ----- the corpus: proven ----------------------------------------------------------------------

@pytest.mark.parametrize("name", _params([c.name for c in CASES], XFAIL_CASES,
                                         PARTITIONED_BEFORE_0_10))
def test_partitioned_function_is_proven(name: str) -> None:
    ref, sharded = lowered(name)
    report = check_texts(ref, sharded, ref_file=f"<{name}: reference>",
                         sharded_file=f"<{name}: partitioned by XLA>")
    assert report.proven, report.render_text()
    counts = report.stats.get("rule_instances", {})
    assert counts.get("refuted", 0) == 0 and counts.get("unknown", 0) == 0, report.mode


def test_the_corpus_covers_the_issue() -> None:
    """At least 25 functions proven (not pinned as xfail), on 1-D and 2-D meshes of up to 8."""
    proven = [c for c in CASES if c.name not in XFAIL_CASES]
    assert len(proven) >= 25, [c.name for c in proven]
    meshes = {c.mesh for c in proven}
    assert {"x4", "x8", "dp2_tp4", "dp4_tp2"} <= meshes
    for needed in ("transformer2_dp_tp", "mlp_backward", "attention_heads", "layernorm_hidden",
                   "take_sharded_indices", "embedding_hidden_split", "pad_sharded_dim",
                   "cumsum_sharded_dim", "fused_qkv_split", "roll_sharded"):
        assert needed in {c.name for c in proven}


def test_check_partitioned_front_end() -> None:
    """The public entry point, with out_shardings and an already jitted function."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from entangle_mlir.jax import assert_partitioned_refines, check_partitioned

    m = mesh("dp2_tp4")
    x = jax.ShapeDtypeStruct((8, 16), np.float32, sharding=NamedSharding(m, P("dp", "tp")))
    w = jax.ShapeDtypeStruct((16, 32), np.float32, sharding=NamedSharding(m, P("tp", None)))

    def f(x, w):
        return jax.numpy.tanh(x @ w).sum(axis=1)

    report = check_partitioned(f, x, w, out_shardings=NamedSharding(m, P("dp")))
    assert report.proven, report.render_text()
    assert report.outputs[0].rho == "concat over 'd0' along dim 0"
    jitted = jax.jit(f, out_shardings=NamedSharding(m, P("dp")))
    assert_partitioned_refines(jitted, x, w)


def test_readme_checks_a_jitted_function_in_five_lines(capsys) -> None:
    """The README's snippet runs as written: five lines after the imports and the simulated
    devices' setting, and it proves."""
    from tests.shared import REPO

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Checking XLA's automatic partitioning")[1]
    code = section.split("```python\n")[1].split("```")[0]
    lines = [line for line in code.splitlines() if line.strip()]
    body = [line for line in lines
            if not line.startswith(("import ", "from ", 'os.environ["XLA_FLAGS"]'))]
    assert len(body) == 5, body
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README snippet
    printed = capsys.readouterr().out
    assert printed.startswith("verified"), printed
    assert "result#0 = concat over 'd0' along dim 0" in printed


# ----- execution: the checked programs are what XLA runs ---------------------------------------

def _random_args(case, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for aval in case.avals():
        if np.issubdtype(aval.dtype, np.integer):
            out.append(rng.integers(-3, 16, aval.shape).astype(aval.dtype))
        else:
            out.append(rng.standard_normal(aval.shape).astype(aval.dtype))
    return out


def _reference_outputs(case, args) -> list[np.ndarray]:
    with jax.set_mesh(mesh(case.mesh)):
        out = jax.jit(case.fn)(*args)
    out = out if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o) for o in out]


def _max_error(program, case, args) -> float:
    expected = expected_per_device(program, _reference_outputs(case, args))
    got = run_per_device(program, *args)
    worst = 0.0
    for device_got, device_want in zip(got, expected):
        for g, w in zip(device_got, device_want):
            if g.shape != w.shape:
                return float("inf")
            worst = max(worst, float(np.max(np.abs(g - w), initial=0.0)))
    return worst


@pytest.mark.parametrize("name", _params([c.name for c in CASES], {},
                                         REFERENCE_RUN_BEFORE_0_10))
def test_partitioned_program_executes_like_the_reference(name: str) -> None:
    case = BY_NAME[name]
    _, sharded = lowered(name)
    assert _max_error(sharded, case, _random_args(case)) < 1e-3


# ----- mutations --------------------------------------------------------------------------------

def _wrong_mask_offset(module) -> str:
    """The row offsets the padding mask of the uneven shard is built from are wrong for the
    last device (8 instead of 9): its row labels shift and the mask keeps a padding row. The
    offset table, the row index (iota + offset) and the mask compare are marked."""
    import numpy as np
    from jaxlib.mlir import ir

    from examples.partitioned import _mark, _ops, _users

    for table in _ops(module, "stablehlo.constant"):
        rtype = ir.RankedTensorType(table.results[0].type)
        if rtype.shape != [4] or str(rtype.element_type) != "i32":
            continue
        values = np.array(ir.DenseIntElementsAttr(table.attributes["value"]))
        old = values.tolist()
        values[-1] -= 1
        table.attributes["value"] = ir.DenseIntElementsAttr.get(values.astype(np.int32))
        _mark(table, 8)
        for add in _ops(module, "stablehlo.add"):
            if ir.RankedTensorType(add.results[0].type).element_type == ir.IntegerType.get_signless(
                    32):
                _mark(add, 8)
                for user in _users(add):
                    _mark(user, 8)
        return f"mask row offsets {old} -> {values.tolist()}"
    raise ValueError("no offset table")


def _all_to_all_group_order(module) -> str:
    """The reshard's all_to_all lists its group in another order: chunks go to the wrong
    devices."""
    import numpy as np
    from jaxlib.mlir import ir

    from examples.partitioned import _mark, _ops

    op = _ops(module, "stablehlo.all_to_all")[0]
    op.attributes["replica_groups"] = ir.DenseIntElementsAttr.get(
        np.array([[0, 2, 1, 3]], dtype=np.int64))
    _mark(op, 9)
    return "all_to_all replica groups [[0, 2, 1, 3]]"


def _pad_halo_wrong_way(module) -> str:
    """`jnp.pad` of the split rows: the halo row each device should get from its left
    neighbour comes from its right one (the first collective_permute's pairs reversed)."""
    from examples.partitioned import swap_permute_pairs

    return swap_permute_pairs(module, 0)


def _cumsum_window_stride(module) -> str:
    """The cumsum of the split columns: each device reads its 19-column window at 3 * b
    instead of 4 * b (the offset's stride constant is wrong). The constant, the offset it
    scales and the dynamic_slice reading at it are marked."""
    import numpy as np
    from jaxlib.mlir import ir

    from examples.partitioned import _mark, _ops, _users

    for const in _ops(module, "stablehlo.constant"):
        value = np.array(ir.DenseElementsAttr(const.attributes["value"]))
        if value.shape != () or int(value) != 4:
            continue
        const.attributes["value"] = ir.DenseElementsAttr.get(np.array(3, dtype=np.int32))
        _mark(const, 10)
        for user in _users(const):
            _mark(user, 10)
            for read in _users(user):
                _mark(read, 10)
        return "window offset stride 4 -> 3"
    raise ValueError("no stride constant")


def _qkv_wrong_read_offset(module) -> str:
    """The fused qkv split: the table of each device's read offset into its q rows has a wrong
    entry (device 2 reads at 0 instead of 8: the zeros of a halo nobody sent it). The table
    and the ops that carry its entry into the read are marked."""
    import numpy as np
    from jaxlib.mlir import ir

    from examples.partitioned import _mark, _ops, _users

    for table in _ops(module, "stablehlo.constant"):
        values = np.array(ir.DenseElementsAttr(table.attributes["value"]))
        if values.tolist() != [0, 8, 8, 0]:
            continue
        table.attributes["value"] = ir.DenseElementsAttr.get(
            np.array([0, 8, 0, 0], dtype=np.int32))
        marked = [table]
        for _ in range(3):
            marked = [user for op in marked for user in _users(op)]
            for op in marked:
                _mark(op, 11)
        _mark(table, 11)
        return "q read offsets [0, 8, 8, 0] -> [0, 8, 0, 0]"
    raise ValueError("no read offset table")


MUTATIONS_HERE = [
    Mutation("qkv_wrong_read_offset", "fused_qkv_split", _qkv_wrong_read_offset,
             "a device reads its q head at a wrong offset into the rows routed to it"),
    Mutation("cumsum_window_stride", "cumsum_sharded_dim", _cumsum_window_stride,
             "the cumsum's device windows start 3 columns apart instead of 4"),
    Mutation("pad_halo_wrong_way", "pad_sharded_dim", _pad_halo_wrong_way,
             "the padded split dim's left halo comes from the right neighbour"),
    Mutation("wrong_mask_offset", "uneven_sum", _wrong_mask_offset,
             "the uneven shard's padding mask is built from a wrong row offset"),
    Mutation("all_to_all_group_order", "concat_sharded_dim", _all_to_all_group_order,
             "the rows-to-columns reshard sends chunks in another device order"),
]
BY_MUTATION = {m.name: m for m in MUTATIONS + MUTATIONS_HERE}
MUTATION_NOT_LOCATED: dict[str, str] = {}


@functools.cache
def mutated_program(name: str) -> tuple[str, str]:
    mutation = BY_MUTATION[name]
    return mutated(mutation, lowered(mutation.case)[1])


@pytest.mark.parametrize("name", sorted(BY_MUTATION))
def test_mutation_changes_the_numbers(name: str) -> None:
    mutation = BY_MUTATION[name]
    case = BY_NAME[mutation.case]
    args = _random_args(case, seed=1)
    assert _max_error(lowered(mutation.case)[1], case, args) < 1e-3
    text, _ = mutated_program(name)
    assert _max_error(text, case, args) > 1e-2


@pytest.mark.parametrize("name", sorted(BY_MUTATION))
def test_mutation_is_not_proven(name: str) -> None:
    text, what = mutated_program(name)
    report = check_texts(lowered(BY_MUTATION[name].case)[0], text)
    assert not report.proven, f"{what}: {report.render_text()}"


@pytest.mark.parametrize("name", _params(sorted(BY_MUTATION), MUTATION_NOT_LOCATED))
def test_mutation_is_flagged_at_the_mutated_op(name: str) -> None:
    text, what = mutated_program(name)
    report = check_texts(lowered(BY_MUTATION[name].case)[0], text, verify_rules=False)
    first = report.diagnostics[0]
    assert first.loc is not None and first.loc.file == MUTATION_FILE, (
        f"{what}: {report.render_text()}")


SWEPT = ("matmul_contracting_scatter", "layernorm_hidden", "max_sharded_dim", "mlp_dp_tp",
         "pad_sharded_dim", "cumsum_sharded_dim", "fused_qkv_split")


@pytest.mark.parametrize("name", SWEPT)
def test_generic_mutants_that_change_the_numbers_are_never_proven(name: str) -> None:
    """Soundness sweep (the whole proven corpus: `python -m examples.partitioned --sweep`)."""
    from examples.partitioned import apply_sweep_mutant, sweep_mutants

    case = BY_NAME[name]
    ref, sharded = lowered(name)
    args = _random_args(case, seed=3)
    tried = 0
    for what, index, kind in sweep_mutants(sharded):
        text = apply_sweep_mutant(sharded, index, kind)
        if text is None:
            continue
        tried += 1
        if not _max_error(text, case, args) <= 1e-3:
            report = check_unprovable(ref, text)
            assert not report.proven, f"{what} changes the numbers but is proven"
    assert tried


# ----- Shardy's own pipeline (sdy-propagation-pipeline ... sdy-convert-global-to-local) ---------

SHARDY_PROVEN = ("matmul_contracting", "matmul_2d_rows_contract", "mlp_dp_tp", "attention_heads",
                 "layernorm_hidden", "sum_sharded_dim", "transpose_sharded",
                 "concat_sharded_dim", "take_sharded_indices", "scatter_add_cols",
                 "embedding_grad_tokens", "transformer2_dp_tp", "mlp_backward")
"""Corpus functions whose Shardy partitioning is checked here (34 of the 48 prove; the
pipeline itself fails on 12: slices, pads, cumsum and halos, which sdy-convert-global-to-local
rejects in jaxlib 0.10.2; max/softmax hit the Shardy bug below)."""


SHARDY_LOCAL = needs_jaxlib((0, 10), "Shardy's sdy-convert-global-to-local pass")


@functools.cache
def shardy_lowered(name: str, pipeline: str | None = None) -> str:
    """Shardy's per-device program of a corpus function (the pipeline in a subprocess)."""
    from entangle_mlir.mlir.xla import SHARDY_PIPELINE, shardy_partition

    case = BY_NAME[name]
    with jax.set_mesh(mesh(case.mesh)):
        jitted = jax.jit(case.fn, out_shardings=case.out_shardings())
        text = jitted.lower(*case.avals()).as_text()
    return shardy_partition(text, pipeline or SHARDY_PIPELINE)


def _shardy_error(name: str, local: str) -> float:
    from entangle_mlir.mlir.program import adopted_shardy_text

    case = BY_NAME[name]
    return _max_error(adopted_shardy_text(local, lowered(name)[0]), case, _random_args(case))


@SHARDY_LOCAL
@pytest.mark.parametrize("name", SHARDY_PROVEN)
def test_shardy_pipeline_output_is_proven(name: str) -> None:
    """`entangle check` reads Shardy's per-device output (sdy.sharding on local shapes) like
    XLA's; what it proves executes like the reference."""
    local = shardy_lowered(name)
    assert "sdy.manual_computation" not in local and "sdy.sharding" in local
    report = check_texts(lowered(name)[0], local)
    assert report.proven, report.render_text()
    assert _shardy_error(name, local) < 1e-3


@SHARDY_LOCAL
@pytest.mark.parametrize("name, changes", [("max_sharded_dim", True),
                                           ("softmax_sharded_dim", False)])
def test_shardy_max_reduction_is_summed(name: str, changes: bool) -> None:
    """A Shardy bug found by the checker (jaxlib 0.10.2): with `enable-full-version`, a max
    over a split dim is finished by an all_reduce that ADDS the partial maxima. Flagged at
    that all_reduce (Shardy gives it the location of the reduce it completes). Execution: the max changes; softmax does not (it is invariant to the
    value its stabilizer subtracts), but its intermediate is wrong, so it is not proven either.
    Should Shardy get fixed, both programs prove and this test fails: then move them to
    SHARDY_PROVEN."""
    local = shardy_lowered(name)
    assert (_shardy_error(name, local) > 1e-2) is changes
    report = check_texts(lowered(name)[0], local, verify_rules=False)
    assert not report.proven
    first = report.diagnostics[0]
    assert first.message.startswith("all_reduce sums over") and first.message.endswith(
        "but the value is a partial max: the reduction kind is wrong"), report.render_text()
    assert first.category == "wrong_reducer" and first.loc is not None


@SHARDY_LOCAL
def test_shardy_default_pipeline_drops_the_reduction() -> None:
    """Without `enable-full-version`, sdy-insert-explicit-reshards leaves the sum over a split
    dim unreduced: no all_reduce at all. Not proven, flagged at the reduce; the numbers
    differ."""
    from entangle_mlir.mlir.xla import SHARDY_PIPELINE

    default = SHARDY_PIPELINE.replace("{enable-full-version=true}", "")
    local = shardy_lowered("sum_sharded_dim", default)
    assert "all_reduce" not in local
    assert _shardy_error("sum_sharded_dim", local) > 1e-2
    report = check_texts(lowered("sum_sharded_dim")[0], local, verify_rules=False)
    assert not report.proven
    assert "partial sum" in report.diagnostics[0].message, report.render_text()


@SHARDY_LOCAL
def test_shardy_pipeline_failures_are_input_errors() -> None:
    """Ops sdy-convert-global-to-local rejects (here a slice of a split dim) abort the pass:
    a clean InputError naming the failure, never a crash of the caller."""
    from entangle_mlir.core.diagnostics import InputError

    with pytest.raises(InputError, match="Shardy's pipeline failed"):
        shardy_lowered("slice_sharded")


# ----- per-device layouts from mhlo.sharding (hand-written programs, no XLA) -------------------

REF_ROWS = """
func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}"""

SHARDED_ROWS = """
module @sharded attributes {mhlo.num_partitions = 8 : i32{MODULE_ATTRS}} {
  func.func private @add.clone(%a: tensor<f32>, %b: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.add %a, %b : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @main(%x: tensor<4x4xf32>{X}, %w: tensor<4x4xf32>{W}) -> (tensor<4x4xf32>{OUT}) {
    %0 = stablehlo.dot %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %1 = mhlo.copy %0 : tensor<4x4xf32>
    %2 = "stablehlo.all_reduce"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<{GROUPS}> : tensor<2x4xi64>{GLOBAL}}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %2 : tensor<4x4xf32>
  }
}"""

X_DP_TP = "{devices=[2,4]<=[8]}"
W_TP = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
OUT_DP = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
TP_GROUPS = "[[0, 1, 2, 3], [4, 5, 6, 7]]"


def sharded_rows(x=X_DP_TP, w=W_TP, out=OUT_DP, groups=TP_GROUPS, module_attrs="",
                 arg_attrs=True, global_ids=True) -> str:
    def attr(text):
        return f' {{mhlo.sharding = "{text}"}}' if arg_attrs and text else ""

    return (SHARDED_ROWS.replace("{X}", attr(x)).replace("{W}", attr(w))
            .replace("{OUT}", attr(out)).replace("{GROUPS}", groups)
            .replace("{MODULE_ATTRS}", module_attrs)
            .replace("{GLOBAL}", ", use_global_device_ids" if global_ids else ""))


def check_rows(**kwargs):
    return check_texts(REF_ROWS, sharded_rows(**kwargs), verify_rules=False)


def test_iota_tile_assignment_with_transpose_and_replicated_last_dim() -> None:
    report = check_rows()
    assert report.proven, report.render_text()
    assert report.mesh == "d0=2 x d1=2 x d2=2"
    assert report.outputs[0].rho == "concat over 'd0' along dim 0"


def test_explicit_device_lists_and_subgroup_replication() -> None:
    report = check_rows(x="{devices=[2,4]0,1,2,3,4,5,6,7}",
                        w="{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dims={replicated}}",
                        out="{devices=[2,1,4]<=[8] last_tile_dims={replicated}}")
    assert report.proven, report.render_text()


def test_module_level_spmd_shardings() -> None:
    """No arg/result attributes: mhlo.spmd_parameters_shardings / mhlo.spmd_output_sharding."""
    attrs = (f', mhlo.spmd_parameters_shardings = ["{X_DP_TP}", "{W_TP}"], '
             f'mhlo.spmd_output_sharding = "{OUT_DP}"')
    report = check_rows(module_attrs=attrs, arg_attrs=False)
    assert report.proven, report.render_text()


def test_a_wrong_parameter_layout_is_not_proven() -> None:
    # w's blocks assigned in the wrong device order: device d holds rows of block d % 4.
    report = check_rows(w="{devices=[4,1,2]<=[8] last_tile_dim_replicate}")
    assert not report.proven


@pytest.mark.parametrize("sharding, reason", [
    ("{maximal device=0}", "maximal sharding"),
    ("{manual}", "manual sharding"),
    ("{devices=[2,2,2]<=[8] last_tile_dims={manual}}", "partially manual sharding"),
    ("{unknown}", "unknown sharding"),
])
def test_unsupported_shardings_are_clean_verdicts(sharding: str, reason: str) -> None:
    report = check_rows(x=sharding)
    assert not report.proven
    assert reason in report.diagnostics[0].message
    assert report.diagnostics[0].category == "unsupported"


def test_unsupported_result_sharding() -> None:
    report = check_rows(out="{maximal device=3}")
    assert not report.proven and "maximal sharding" in report.diagnostics[0].message


def test_replicated_parameters() -> None:
    ref = """
func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = stablehlo.tanh %x : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<4x4xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{replicated}"}) {
    %0 = stablehlo.tanh %x : tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}"""
    report = check_texts(ref, sharded, verify_rules=False)
    assert report.proven and report.outputs[0].rho == "replicated on every device"


def test_devices_counted_from_the_result_sharding() -> None:
    """XLA's program for a shard_map manual over some axes, fed a replicated input, states its
    devices only through its result's sharding (no mhlo.num_partitions): it runs on 4 devices,
    each returning its block of the reference (jax's test_partial_auto_ppermute shape)."""
    sharded = """
module attributes {mhlo.spmd_output_sharding = "{devices=[4]<=[4]}"} {
  func.func @main(%x: tensor<8xf32> {mhlo.sharding = "{replicated}"}) -> tensor<2xf32> {
    %c = stablehlo.constant dense<2> : tensor<ui32>
    %p = stablehlo.partition_id : tensor<ui32>
    %o = stablehlo.multiply %p, %c : tensor<ui32>
    %0 = stablehlo.dynamic_slice %x, %o, sizes = [2] : (tensor<8xf32>, tensor<ui32>) -> tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}"""
    x = np.arange(8, dtype=np.float32)
    got = run_per_device(sharded, x)
    want = expected_per_device(sharded, [x])
    assert len(got) == len(want) == 4
    for device, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(g[0], x[2 * device:2 * device + 2])
        np.testing.assert_array_equal(w[0], g[0])


@pytest.mark.parametrize("groups, proven", [
    (TP_GROUPS, True),
    ("[[3, 2, 1, 0], [7, 6, 5, 4]]", True),    # same groups, other order: same sum
    ("[[0, 4, 1, 5], [2, 6, 3, 7]]", False),   # (dp, d1): sums blocks of different rows
    ("[[0, 1, 2, 4], [3, 5, 6, 7]]", False),   # no mesh axes at all
])
def test_dense_replica_groups(groups: str, proven: bool) -> None:
    report = check_rows(groups=groups)
    assert report.proven is proven, report.render_text()


def test_replica_groups_without_a_channel_are_bad_input() -> None:
    from entangle_mlir.core.diagnostics import InputError

    # With a channel handle and no use_global_device_ids, the groups list partition ids within
    # each replica (one replica here): still the same devices, so this may prove; without the
    # channel handle they are replica ids (cross-replica), out of range with one replica.
    # (XLA refuses replica ids beyond the one replica: bad input, test_exact_regions.py)
    text = sharded_rows(global_ids=False).replace(
        "channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, ", "")
    with pytest.raises(InputError, match="no channel_handle, so the groups are replica ids"):
        check_texts(REF_ROWS, text, verify_rules=False)


# ----- HLO dumps through the CLI ----------------------------------------------------------------

def _dump(name: str, directory, keep_shardings: bool):
    import glob
    import shutil

    case = BY_NAME[name]
    options = {"xla_dump_to": str(directory / "dump"), "xla_dump_hlo_pass_re": "spmd-partitioning",
               "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True,
               "xla_keep_shardings_after_spmd": keep_shardings}
    with jax.set_mesh(mesh(case.mesh)):
        jitted = jax.jit(case.fn, out_shardings=case.out_shardings())
        jitted.lower(*case.avals()).compile(compiler_options=options)
    out = {}
    for path in glob.glob(str(directory / "dump" / "*after_spmd-partitioning*")):
        ext = "hlo.pb" if path.endswith(".pb") else "hlo.txt"
        out[ext] = str(directory / f"{name}.{ext}")
        shutil.copy(path, out[ext])
    ref = directory / f"{name}.ref.mlir"
    ref.write_text(lowered(name)[0])
    return str(ref), out


def test_cli_reads_hlo_proto_and_text(tmp_path, entangle) -> None:
    ref, dumps = _dump("matmul_2d_rows_contract", tmp_path, keep_shardings=True)
    for ext in ("hlo.pb", "hlo.txt"):
        run = entangle("check", ref, dumps[ext])
        assert run.code == 0, run.text
        assert "result#0 = concat over 'd0' along dim 0" in run.out


def test_cli_hlo_text_without_output_sharding(tmp_path, entangle) -> None:
    """Plain HLO text does not record the output sharding: bad input, one line naming the flag
    that keeps it and the proto dump; the proto dump of the same program has it."""
    ref, dumps = _dump("matmul_2d_rows_contract", tmp_path, keep_shardings=False)
    run = entangle("check", ref, dumps["hlo.txt"])
    assert run.code == 2 and len(run.text.strip().splitlines()) == 1, run.text
    assert "--xla_keep_shardings_after_spmd=true" in run.text and "hlo.pb" in run.text, run.text
    assert entangle("check", ref, dumps["hlo.pb"]).code == 0


def test_hlo_text_with_iota_replica_groups(tmp_path, entangle) -> None:
    """XLA prints replica groups in the iota form; jaxlib's converter makes them dense."""
    ref = tmp_path / "ref.mlir"
    ref.write_text(REF_ROWS)
    hlo = tmp_path / "rows.hlo.txt"
    hlo.write_text("""HloModule rows, num_partitions=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4,4] parameter(0), sharding={devices=[2,4]<=[8]}
  w = f32[4,4] parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  d = f32[4,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT r = f32[4,4] all-reduce(d), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=add, sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
}
""")
    run = entangle("check", str(ref), str(hlo))
    assert run.code == 0, run.text


def test_bad_hlo_inputs_are_exit_2(tmp_path, entangle) -> None:
    ref = tmp_path / "ref.mlir"
    ref.write_text(REF_ROWS)
    garbage = tmp_path / "x.hlo.pb"
    garbage.write_bytes(b"\x08\x96\x01\xff\xff")
    broken = tmp_path / "x.hlo.txt"
    broken.write_text("HloModule m\nENTRY main { oops }\n")
    for path in (garbage, broken):
        run = entangle("check", str(ref), str(path))
        assert run.code == 2, run.text
        assert "Traceback" not in run.text


def test_hlo_loading_does_not_import_jax(tmp_path) -> None:
    """`entangle check` on an HLO dump converts it with jaxlib alone."""
    import subprocess
    import sys

    hlo = tmp_path / "m.hlo.txt"
    hlo.write_text("HloModule m, num_partitions=2\n\nENTRY main {\n"
                   "  x = f32[2] parameter(0), sharding={devices=[2]<=[2]}\n"
                   "  ROOT t = f32[2] tanh(x), sharding={devices=[2]<=[2]}\n}\n")
    code = ("import sys; from entangle_mlir.mlir.load import load_file; "
            f"m = load_file({str(hlo)!r}); assert 'stablehlo.tanh' in str(m); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- minimal reproducers of missing library features (strict xfails, for the lead) ----------

def _check(ref: str, sharded: str, verify_rules: bool = True):
    return check_texts(ref, sharded, verify_rules=verify_rules)


def test_offset_table() -> None:
    """XLA's offsets: a constant table indexed by partition_id (was a known issue)."""
    ref = """
func.func @main(%x: tensor<16x12xf32>) -> tensor<16x12xf32> {
  return %x : tensor<16x12xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<16x12xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x12xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) {
    %table = stablehlo.constant dense<[0, 4, 8, 12]> : tensor<4xi32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %t = stablehlo.dynamic_slice %table, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %off = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %x, %off, %c0, sizes = [4, 12] : (tensor<16x12xf32>, tensor<i32>, tensor<i32>) -> tensor<4x12xf32>
    return %0 : tensor<4x12xf32>
  }
}"""
    report = _check(ref, sharded)
    assert report.proven, report.render_text()


def test_repro_unit_dim_reshape() -> None:
    ref = """
func.func @main(%x: tensor<32xf32>) -> tensor<32xf32> {
  %0 = stablehlo.reshape %x : (tensor<32xf32>) -> tensor<1x32xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<1x32xf32>, tensor<f32>) -> tensor<32xf32>
  return %1 : tensor<32xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
    %0 = stablehlo.reshape %x : (tensor<8xf32>) -> tensor<1x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<1x8xf32>, tensor<f32>) -> tensor<8xf32>
    return %1 : tensor<8xf32>
  }
}"""
    report = _check(ref, sharded)
    assert report.proven, report.render_text()


def scatter_columns(rows: int, cols: int, count: int, devices: int) -> tuple[str, str]:
    """(reference, per-device program) of a scatter-add whose operand and updates have their
    columns split over `devices` (each device adds its columns of the updated rows)."""
    scatter = ('"stablehlo.scatter"(%x, %i, %u) <{scatter_dimension_numbers = '
               '#stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], '
               'scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({\n'
               '    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n'
               '      %s = stablehlo.add %a, %b : tensor<f32>\n'
               '      stablehlo.return %s : tensor<f32>\n    })')

    def types(c):
        return (f"tensor<{rows}x{c}xf32>", f"tensor<{count}x1xi32>", f"tensor<{count}x{c}xf32>")

    x, i, u = types(cols)
    ref = (f"func.func @main(%x: {x}, %i: {i}, %u: {u}) -> {x} {{\n"
           f"  %0 = {scatter} : ({x}, {i}, {u}) -> {x}\n  return %0 : {x}\n}}")
    x, i, u = types(cols // devices)
    split = f'{{mhlo.sharding = "{{devices=[1,{devices}]<=[{devices}]}}"}}'
    sharded = (f"module attributes {{mhlo.num_partitions = {devices} : i32}} {{\n"
               f"  func.func @main(%x: {x} {split}, %i: {i} "
               f'{{mhlo.sharding = "{{replicated}}"}}, %u: {u} {split}) -> ({x} {split}) {{\n'
               f"  %0 = {scatter} : ({x}, {i}, {u}) -> {x}\n  return %0 : {x}\n  }}\n}}")
    return ref, sharded


def test_scatter_columns() -> None:
    """A scatter-add with the columns of operand and updates split (small enough for the
    rule-instance check at its real shape)."""
    report = _check(*scatter_columns(8, 4, 3, 2))
    assert report.proven, report.render_text()
    assert report.outputs[0].rho == "concat over 'd0' along dim 1"


@pytest.mark.parametrize("name", ["scatter_add_cols", "update_slice_rows"])
def test_scatter_walk_proves_xla_programs(name: str) -> None:
    """The walk (rules) proves XLA's scatters; their rule-instance checks are pinned below."""
    ref, sharded = lowered(name)
    report = _check(ref, sharded, verify_rules=False)
    assert report.proven, f"{name}: {report.render_text()}"


def test_scatter_instance_is_checked_at_a_reduced_shape() -> None:
    """A 16x8 scatter-add with 6 symbolic indices timed out at its real shape: gather/scatter
    instances are reduced 16x earlier than other ops (instance.checker.INDEXED_REDUCTION)."""
    report = _check(*scatter_columns(16, 8, 6, 4))
    assert report.proven, report.render_text()
    assert report.stats["rule_instances"].get("unknown", 0) == 0


def test_scatter_without_index_vector_dim() -> None:
    """`x.at[:, 2:4].set(y)` prints its scatter without index_vector_dim (default 0): the
    instance check reads it as 0, like the rule (it used to fail to build the query)."""
    ref, sharded = lowered("update_slice_rows")
    assert "scatter_dims_to_operand_dims = [1]>" in ref
    report = _check(ref, sharded)
    assert report.proven, report.render_text()
    assert report.stats["rule_instances"].get("unknown", 0) == 0


@pytest.mark.parametrize("keeper, proven", [("0", True), ("5", False)])
def test_device_select(keeper: str, proven: bool) -> None:
    """`select(broadcast(partition_id != k), zeros, x)`: XLA keeps a scatter-add's operand on
    device k only, so that the all_reduce counts it once (a partial sum of x). With k = 5 no
    device keeps it and x is lost."""
    ref = """
func.func @main(%x: tensor<8x2xf32>, %u: tensor<8x2xf32>) -> tensor<8x2xf32> {
  %0 = stablehlo.add %x, %u : tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}"""
    # x is replicated, u a partial sum over both devices (as from a local scatter of tokens):
    # x is kept on device 0 only, so the all_reduce adds it once.
    sharded = """
module attributes {mhlo.num_partitions = 2 : i32} {
  func.func @main(%x: tensor<8x2xf32> {mhlo.sharding = "{replicated}"}, %u: tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"}) -> (tensor<8x2xf32> {mhlo.sharding = "{replicated}"}) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %c0 = stablehlo.constant dense<0> : tensor<ui32>
    %p = stablehlo.compare NE, %pid, %c0 : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %pb = stablehlo.broadcast_in_dim %p, dims = [] : (tensor<i1>) -> tensor<8x2xi1>
    %zero = stablehlo.constant dense<0.0> : tensor<8x2xf32>
    %mine = stablehlo.select %pb, %zero, %x : tensor<8x2xi1>, tensor<8x2xf32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %z = stablehlo.constant dense<0> : tensor<i32>
    %placed = stablehlo.dynamic_update_slice %zero, %u, %off, %z : (tensor<8x2xf32>, tensor<4x2xf32>, tensor<i32>, tensor<i32>) -> tensor<8x2xf32>
    %sum = stablehlo.add %mine, %placed : tensor<8x2xf32>
    %r = "stablehlo.all_reduce"(%sum) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<8x2xf32>) -> tensor<8x2xf32>
    return %r : tensor<8x2xf32>
  }
}"""
    sharded = sharded.replace("%c0 = stablehlo.constant dense<0> : tensor<ui32>",
                              f"%c0 = stablehlo.constant dense<{keeper}> : tensor<ui32>")
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    u = np.ones((8, 2), np.float32)
    outs = run_per_device(sharded, x, u)
    assert all(np.array_equal(out[0], x + u) for out in outs) is proven
    report = _check(ref, sharded)
    assert report.proven is proven, report.render_text()


def test_reduce_window_along_an_unsplit_dim() -> None:
    """jnp.cumsum along the columns with the rows split: the window keeps the layout."""
    ref, sharded = lowered("cumsum_unsharded_dim")
    report = _check(ref, sharded)
    assert report.proven, report.render_text()
    assert report.outputs[0].rho == "concat over ('d0', 'd1') along dim 0"


def test_repro_cumsum_sharded_dim() -> None:
    """cumsum along a split dim: XLA all_gathers, pads by 15 and each device takes a 19-column
    window at offset 4 * d (overlapping windows of the split columns, zeros before column 0),
    then a 16-wide reduce_window leaves exactly its block (rules/kinds/window.py)."""
    ref, sharded = lowered("cumsum_sharded_dim")
    report = _check(ref, sharded)
    assert report.proven, report.render_text()


def test_repro_halo_roll() -> None:
    ref, sharded = lowered("roll_sharded")   # slice 3:4, collective_permute, slice 0:3, concat
    report = _check(ref, sharded)
    assert report.proven, report.render_text()


def test_all_to_all_reshard() -> None:
    """all_to_all with split_dimension == concat_dimension (XLA's reshard from rows to
    columns), executed and proven; without its transpose it is neither."""
    ref = """
func.func @main(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  return %x : tensor<8x4xf32>
}"""
    # Rows split over 4 devices -> columns split over 4 devices (XLA's form of the reshard).
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<8x1xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) {
    %0 = stablehlo.reshape %x : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
    %1 = "stablehlo.all_to_all"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    %2 = stablehlo.transpose %1, dims = [1, 0, 2] : (tensor<2x4x1xf32>) -> tensor<4x2x1xf32>
    %3 = stablehlo.reshape %2 : (tensor<4x2x1xf32>) -> tensor<8x1xf32>
    return %3 : tensor<8x1xf32>
  }
}"""
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    got = run_per_device(sharded, x)
    assert all(np.array_equal(got[d][0], x[:, d:d + 1]) for d in range(4))
    report = _check(ref, sharded)
    assert report.proven, report.render_text()
    wrong = sharded.replace("%2 = stablehlo.transpose %1, dims = [1, 0, 2] : (tensor<2x4x1xf32>) "
                            "-> tensor<4x2x1xf32>\n", "").replace(
        "%3 = stablehlo.reshape %2 : (tensor<4x2x1xf32>)", "%3 = stablehlo.reshape %1 : "
        "(tensor<2x4x1xf32>)")
    assert wrong != sharded
    got = run_per_device(wrong, x)
    assert not all(np.array_equal(got[d][0], x[:, d:d + 1]) for d in range(4))
    assert not _check(ref, wrong).proven


@pytest.mark.parametrize("bound", [10, 11])
def test_iota_mask(bound: int) -> None:
    """Sum of the first 10 of 16 values split over 4 devices: each device masks the rows of its
    block that are >= 10 (XLA's padding mask for a 10-row value); masking at 11 is wrong."""
    ref = """
func.func @main(%x: tensor<16xf32>) -> tensor<f32> {
  %0 = stablehlo.slice %x [0:10] : (tensor<16xf32>) -> tensor<10xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<10xf32>, tensor<f32>) -> tensor<f32>
  return %1 : tensor<f32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<4xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %offs = stablehlo.broadcast_in_dim %off, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %iota = stablehlo.iota dim = 0 : tensor<4xi32>
    %rows = stablehlo.add %iota, %offs : tensor<4xi32>
    %c10 = stablehlo.constant dense<10> : tensor<4xi32>
    %keep = stablehlo.compare LT, %rows, %c10 : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %zeros = stablehlo.constant dense<0.0> : tensor<4xf32>
    %m = stablehlo.select %keep, %x, %zeros : tensor<4xi1>, tensor<4xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%m init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %r = "stablehlo.all_reduce"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    return %r : tensor<f32>
  }
}"""
    sharded = sharded.replace("dense<10> : tensor<4xi32>", f"dense<{bound}> : tensor<4xi32>")
    x = np.arange(16, dtype=np.float32)
    correct = all(float(out[0]) == float(x[:10].sum()) for out in run_per_device(sharded, x))
    assert correct is (bound == 10)
    report = _check(ref, sharded)
    assert report.proven is correct, report.render_text()


@PARTITIONED_BEFORE_0_10["take_sharded_table"]
def test_masked_gather_states_its_assumption() -> None:
    """The gather from a row-split table is proven for valid ids, and the report says so."""
    ref, sharded = lowered("take_sharded_table")
    report = _check(ref, sharded)
    assert report.proven, report.render_text()
    assert any("holds valid indices, 0 <= value < 16" in note for note in report.notes)


def _silu_program() -> tuple[str, object]:
    """`silu(x @ w)` on a 2 x 4 mesh of Auto axes: jax lowers `jax.nn.silu` to a func.call."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    grid = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
    avals = [jax.ShapeDtypeStruct(s, np.float32, sharding=NamedSharding(grid, p))
             for s, p in (((8, 16), P("dp", None)), ((16, 32), P(None, "tp")))]
    fn = jax.jit(lambda x, w: jax.nn.silu(x @ w))
    return fn.lower(*avals).as_text(), avals


@SHARDY_LOCAL
def test_shardy_pipeline_inlines_calls() -> None:
    """Shardy's propagation gives a call's results local shapes its callee's signature lacks:
    calls are inlined first, and the per-device program is proven and runs like `silu(x@w)`."""
    from entangle_mlir.mlir.program import adopted_shardy_text
    from entangle_mlir.mlir.xla import shardy_partition

    text, avals = _silu_program()
    assert "call @silu" in text
    local = shardy_partition(text)
    reference = jax.jit(lambda x, w: jax.nn.silu(x @ w)).lower(
        *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]).as_text()
    report = check_texts(reference, local)
    assert report.proven, report.render_text()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(a.shape).astype(np.float32) for a in avals]
    program = adopted_shardy_text(local, reference)
    want = [np.asarray(jax.nn.silu(args[0] @ args[1]))]
    for device in zip(run_per_device(program, *args), expected_per_device(program, want)):
        for got, expect in zip(*device):
            assert np.max(np.abs(got - expect)) < 1e-4


@SHARDY_LOCAL
def test_shardy_pipeline_failure_shows_the_whole_error(monkeypatch) -> None:
    """A failing pipeline's error is the MLIR diagnostic with every note, not its last line
    nor the subprocess's traceback (here: the call left in, as before the inlining)."""
    from entangle_mlir.core.diagnostics import InputError
    from entangle_mlir.mlir import xla

    monkeypatch.setattr(xla, "_without_calls", lambda text: text)
    with pytest.raises(InputError) as failure:
        xla.shardy_partition(_silu_program()[0])
    message = str(failure.value)
    assert "'func.call' op result type mismatch" in message
    assert "function result types" in message and "op result types" in message
    assert "Traceback" not in message and 'File "<string>"' not in message


def test_shardy_pipeline_needs_jaxlib_0_10() -> None:
    """On a jaxlib without sdy-convert-global-to-local, shardy_partition says so (InputError)
    instead of failing inside the pass parser."""
    from entangle_mlir.core.diagnostics import InputError
    from entangle_mlir.mlir.compat import has_shardy_global_to_local

    if has_shardy_global_to_local():
        pytest.skip("this jaxlib has the pass (the tests above run Shardy's pipeline)")
    with pytest.raises(InputError, match=r"not in jaxlib .* \(it is from jaxlib 0.10\)"):
        shardy_lowered("sum_sharded_dim")


@pytest.mark.parametrize("start", [0, 1])
def test_slice_pushdown(start: int) -> None:
    """XLA computes `tanh(x[:10])` on the padded 12 rows and slices at the end: slices are
    pushed toward the leaves, so both orders meet (slicing rows 1..10 does not)."""
    ref = """
func.func @main(%x: tensor<12x4xf32>) -> tensor<10x4xf32> {
  %0 = stablehlo.slice %x [0:10, 0:4] : (tensor<12x4xf32>) -> tensor<10x4xf32>
  %1 = stablehlo.tanh %0 : tensor<10x4xf32>
  return %1 : tensor<10x4xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<3x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<10x4xf32> {mhlo.sharding = "{replicated}"}) {
    %0 = stablehlo.tanh %x : tensor<3x4xf32>
    %1 = "stablehlo.all_gather"(%0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<3x4xf32>) -> tensor<12x4xf32>
    %2 = stablehlo.slice %1 [START:LIMIT, 0:4] : (tensor<12x4xf32>) -> tensor<10x4xf32>
    return %2 : tensor<10x4xf32>
  }
}"""
    sharded = sharded.replace("START", str(start)).replace("LIMIT", str(start + 10))
    x = np.random.default_rng(0).standard_normal((12, 4)).astype(np.float32)
    got = run_per_device(sharded, x)
    assert all(np.allclose(out[0], np.tanh(x[start:start + 10])) for out in got)
    report = _check(ref, sharded)
    assert report.proven is (start == 0), report.render_text()


@pytest.mark.parametrize("constant, proven", [("0.353553385", True), ("0.353553414", False),
                                               ("0.353553", False)])
def test_reciprocal(constant: str, proven: bool) -> None:
    """XLA rewrites `x / c` into `x * float32(1 / c)`: exactly that rounding of the constant is
    proven, with the assumption stated; a constant one float32 ulp off is not."""
    ref = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<2.82842708> : tensor<4xf32>
  %0 = stablehlo.divide %x, %c : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<1xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<1xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
    %c = stablehlo.constant dense<CONSTANT> : tensor<1xf32>
    %0 = stablehlo.multiply %x, %c : tensor<1xf32>
    return %0 : tensor<1xf32>
  }
}""".replace("CONSTANT", constant)
    x = np.array([1.0, -2.0, 3.0, 1000.0], np.float32)
    got = np.concatenate([out[0] for out in run_per_device(sharded, x)])
    assert np.allclose(got, x / np.float32(2.82842708), rtol=1e-5)  # all close, ...
    xla = x * (np.float32(1) / np.float32(2.82842708))  # XLA's rewrite, rounded in float32
    assert np.array_equal(got, xla) is proven
    report = _check(ref, sharded)
    assert report.proven is proven, report.render_text()
    assert any("XLA's exact constant rounding" in note for note in report.notes) is proven


def test_nan_constant() -> None:
    """A NaN constant (jnp.take's default fill value) is data in the Z3 model: its rule
    instance is proved, never refuted (the reproducer's xfail was its own assertion matching
    '0 refuted' in the rendered report)."""
    ref = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %n = stablehlo.constant dense<0x7FC00000> : tensor<4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<4xf32>
  %p = stablehlo.compare GT, %x, %z : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  %0 = stablehlo.select %p, %x, %n : tensor<4xi1>, tensor<4xf32>
  return %0 : tensor<4xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<1xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<1xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
    %n = stablehlo.constant dense<0x7FC00000> : tensor<1xf32>
    %z = stablehlo.constant dense<0.0> : tensor<1xf32>
    %p = stablehlo.compare GT, %x, %z : (tensor<1xf32>, tensor<1xf32>) -> tensor<1xi1>
    %0 = stablehlo.select %p, %x, %n : tensor<1xi1>, tensor<1xf32>
    return %0 : tensor<1xf32>
  }
}"""
    report = _check(ref, sharded)
    assert report.stats["rule_instances"].get("refuted", 0) == 0, report.render_text()
    assert report.proven, report.render_text()


REPLICA_ID = ("stablehlo.replica_id has no rule: in a program compiled with num_replicas=N and "
              "one partition (the form run_per_device executes) it is the device id, like "
              "partition_id in an SPMD program (in num_partitions=N programs it is always 0)")


def test_repro_replica_id() -> None:
    ref = """
func.func @main(%x: tensor<16x12xf32>) -> tensor<16x12xf32> {
  return %x : tensor<16x12xf32>
}"""
    sharded = """
module attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 4 : i32} {
  func.func @main(%x: tensor<16x12xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x12xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) {
    %rid = stablehlo.replica_id : tensor<ui32>
    %i = stablehlo.convert %rid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %x, %off, %c0, sizes = [4, 12] : (tensor<16x12xf32>, tensor<i32>, tensor<i32>) -> tensor<4x12xf32>
    return %0 : tensor<4x12xf32>
  }
}"""
    report = _check(ref, sharded)
    assert report.proven, report.render_text()


# ----- meshes whose sizes are not in ascending prime order -------------------------------------

def test_synthesized_mesh_follows_the_shardings() -> None:
    from entangle_mlir.mlir.per_device import layout_of, synthesize_mesh

    params = ["{devices=[3,2]<=[6]}", "{devices=[2,1,3]<=[3,2]T(1,0) last_tile_dim_replicate}"]
    mesh = synthesize_mesh(6, params)
    assert mesh.describe() == "d0=3 x d1=2"
    assert layout_of(params[0], 2, mesh).tiling == (("d0",), ("d1",))
    assert layout_of(params[1], 2, mesh).tiling == (("d1",), ())
    assert synthesize_mesh(6).describe() == "d0=2 x d1=3"       # no hint: ascending
    assert synthesize_mesh(8, params[:0]).describe() == "d0=2 x d1=2 x d2=2"


def test_mesh_note_names_jax_axes() -> None:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from entangle_mlir.jax import check_partitioned

    m = mesh("dp4_tp2")
    x = jax.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(m, P("dp", "tp")))
    report = check_partitioned(lambda x: x * 2.0, x, out_shardings=NamedSharding(m, P("dp", "tp")),
                               verify_rules=False)
    assert report.proven
    assert "the program's mesh axes as jax's: ('d0', 'd1') = 'dp', 'd2' = 'tp'" in report.notes


MESH_ORDER = ("a 3 x 2 mesh: XLA's device ids are row-major over (dp=3, tp=2), but the walker "
              "synthesizes d0=2 x d1=3 (ascending primes), under which tp's tiles follow no "
              "axes; infer.Walker._per_device should pass the parameter and result shardings to "
              "per_device.synthesize_mesh(n, shardings), which then picks d0=3 x d1=2")


def test_repro_mesh_3x2() -> None:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from entangle_mlir.jax import check_partitioned

    m = jax.make_mesh((3, 2), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def arg(shape, *spec):
        return jax.ShapeDtypeStruct(shape, np.float32, sharding=NamedSharding(m, P(*spec)))

    report = check_partitioned(lambda x, w: jax.numpy.tanh(x @ w), arg((6, 12), "dp", "tp"),
                               arg((12, 6), "tp", None), out_shardings=NamedSharding(m, P("dp")))
    assert report.proven, report.render_text()


# ----- Z3 instance checks of the per-device select (rules/kinds/shifted.device_select) ---------

@pytest.mark.parametrize("keep, axes", [((1, 0, 0, 0), ("d0", "d1")), ((0, 1, 0, 1), ("d1",)),
                                        ((1, 1, 0, 0), ("d0",)), ((1, 1, 1, 0), None)])
def test_device_select_instances(keep: tuple[int, ...], axes) -> None:
    """select(device predicate, zeros, x) on a 2 x 2 mesh (device = 2 * d0 + d1): x kept on
    exactly one device of every group along some axes is a partial sum over them, proved by
    Z3; claiming x replicated instead is refuted. Kept on three devices: no such axes."""
    from dataclasses import replace as dc_replace

    from entangle_mlir.analysis.instance.checker import InstanceChecker
    from entangle_mlir.core import terms as T
    from entangle_mlir.core.mesh import Mesh
    from entangle_mlir.core.relations import Opaque, Rel, Shifted
    from entangle_mlir.mlir.opinfo import OpInfo, TensorType
    from entangle_mlir.rules import RULES, RuleContext

    mesh = Mesh((("d0", 2), ("d1", 2)))
    ctx = RuleContext(mesh, mesh.names)
    x = T.make_arg(7_000_001, (2, 3), "f32")
    pred = Shifted(Rel(T.make_splat(0, (2, 3), "i1"), ((), ()), poly=frozenset({0, 1})),
                   tuple(1 - k for k in keep))
    zeros = Rel(T.make_splat(0, (2, 3), "f32"), ((), ()), poly=frozenset({0, 1}))
    ins = [pred, zeros, Rel(x, ((), ()))]
    info = OpInfo("stablehlo.select", {}, [TensorType((2, 3), "i1"), TensorType((2, 3), "f32"),
                                           TensorType((2, 3), "f32")], [TensorType((2, 3), "f32")])
    outs = RULES["stablehlo.select"](info, ins, ctx)
    checker = InstanceChecker(timeout_ms=20_000)
    if axes is None:
        assert isinstance(outs[0], Opaque), outs
        return
    assert isinstance(outs[0], Rel) and outs[0].partial == axes, outs
    assert checker.check(info, ins, outs, mesh, ctx).status == "proved"
    wrong = [dc_replace(outs[0], partial=(), kind="")]
    assert checker.check(info, ins, wrong, mesh, ctx).status == "refuted"


@pytest.mark.parametrize("offsets, proven", [((0, -4, -8, -12), True), ((0, -4, -8, -8), False)])
def test_scatter_into_blocks_instances(offsets: tuple[int, ...], proven: bool) -> None:
    """scatter(table block, ids - offset(device), updates) on 4 devices (XLA's scatter into a
    row-split table): with offset = 4 * block index, Z3 proves it is the block of the global
    scatter (out-of-block rows are skipped as whole windows, as XLA does) and refutes a wrong
    claim; a wrong offset is reported, not proven."""
    from dataclasses import replace as dc_replace

    from entangle_mlir.analysis.instance.checker import InstanceChecker
    from entangle_mlir.core import terms as T
    from entangle_mlir.core.mesh import Mesh
    from entangle_mlir.core.relations import Opaque, Rel, Shifted
    from entangle_mlir.mlir.opinfo import OpInfo, TensorType
    from entangle_mlir.rules import RULES, RuleContext

    mesh = Mesh((("d0", 2), ("d1", 2)))
    ctx = RuleContext(mesh, mesh.names)
    table = Rel(T.make_arg(7_100_001, (16, 2), "f32"), (("d0", "d1"), ()))
    ids = Shifted(Rel(T.make_arg(7_100_002, (3, 1), "i32"), ((), ())), offsets)
    updates = Rel(T.make_arg(7_100_003, (3, 2), "f32"), ((), ()))
    attrs = {"update_window_dims": (1,), "inserted_window_dims": (0,),
             "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1, "reducer": "add"}
    info = OpInfo("stablehlo.scatter", attrs, [TensorType((4, 2), "f32"),
                                               TensorType((3, 1), "i32"),
                                               TensorType((3, 2), "f32")],
                  [TensorType((4, 2), "f32")])
    ins = [table, ids, updates]
    outs = RULES["stablehlo.scatter"](info, ins, ctx)
    if not proven:
        assert isinstance(outs[0], Opaque) and outs[0].category == "wrong_offset", outs
        return
    checker = InstanceChecker(timeout_ms=60_000)
    assert checker.check(info, ins, outs, mesh, ctx).status == "proved"
    wrong = [dc_replace(outs[0], term=T.make_add(outs[0].term, table.term))]
    assert checker.check(info, ins, wrong, mesh, ctx).status == "refuted"
