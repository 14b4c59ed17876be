"""Hostile input beyond tests/test_bad_input.py: meshes that do not match the replica groups,
groups that match no mesh axes, deep nesting, extreme and huge constants, odd uses of
`entangle.refines`, special files, huge meshes, and random corruptions of valid programs.

Every run goes through the `entangle` CLI in a subprocess with a time limit and a memory limit:
it must end (no hang), with exit 0/1/2/3, without a traceback, and never say "verified" for
input that it cannot use. Input that is wrong but well-formed (groups over no mesh axes) is "not
proven" (exit 3: inconclusive, no bug claimed) with a message naming the problem.

Strict xfails pin hostile inputs that entangle does not handle yet (hangs, unbounded memory,
a silently ignored function); they turn into failures once fixed: remove the marker then.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import resource
import signal
import subprocess
import sys
import time

import pytest

from tests.shared import (
    COMBINED_ADD,
    COMBINED_MISSING_PSUM,
    EXAMPLES_MLIR,
    REF_ADD,
    REPO,
    SHARDED_ADD,
)

MEMORY_LIMIT = 3 << 30     # bytes of address space for one CLI run
TIMEOUT = 60               # CPU seconds for one CLI run
WALL_FACTOR = 10           # its wall time, in CPU budgets: a loaded machine is no hang

# The limits are set inside the child (no preexec_fn: forking a process that runs jax's
# threads can deadlock; without preexec_fn Python spawns the child without forking). A run that
# spins is stopped by its CPU limit (SIGXCPU), one that blocks by its wall time: a wall limit
# alone called a run a hang on a CI machine at load 9 (6x slower than alone).
_LIMIT = ("import resource, sys; "
          f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT})); ")


def _limited(code: str, cpu_seconds: float) -> str:
    limit = max(1, int(cpu_seconds))
    return (_LIMIT + f"resource.setrlimit(resource.RLIMIT_CPU, ({limit}, {limit + 5})); "
            + code)


_MAIN = "from entangle_mlir.cli import main; sys.exit(main(sys.argv[1:]))"


class Run:
    def __init__(self, code: int | None, out: str, err: str, seconds: float,
                 cpu_seconds: float = 0.0):
        self.code, self.out, self.err, self.seconds = code, out, err, seconds
        self.cpu_seconds = cpu_seconds

    @property
    def text(self) -> str:
        return self.out + self.err

    @property
    def finished(self) -> bool:
        return self.code is not None and self.code != -signal.SIGXCPU


def cli(*args: str, timeout: float = TIMEOUT, code: str = _MAIN) -> Run:
    """`entangle *args` (or `code`) in a subprocess bounded in memory, in `timeout` CPU
    seconds and `WALL_FACTOR` times that of wall time (not finished: killed)."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        p = subprocess.run([sys.executable, "-c", _limited(code, timeout), *map(str, args)],
                           capture_output=True, text=True, timeout=timeout * WALL_FACTOR,
                           cwd=REPO, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return Run(None, out, "", time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Run(p.returncode, p.stdout, p.stderr, time.perf_counter() - start, cpu)


def check(*files: str, verify: bool = False, timeout: float = TIMEOUT) -> Run:
    args = ["check", *files] + ([] if verify else ["--no-verify-rules"])
    return cli(*args, timeout=timeout)


def _sane(run: Run, *codes: int) -> None:
    assert run.finished, (f"no result after {run.seconds:.0f} s of wall time (a hang; exit "
                          f"{run.code}: -{int(signal.SIGXCPU)} is its CPU limit)")
    assert "Traceback" not in run.text, run.text[-3000:]
    assert run.code in codes, f"exit {run.code}:\n{run.text[-3000:]}"
    if run.code != 0:
        assert "verified" not in run.text, run.text


def _bad_input(run: Run, *needles: str) -> str:
    """Exit 2, one `error:` line naming the problem."""
    _sane(run, 2)
    lines = [ln for ln in run.text.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error: " in lines[0], run.text
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def _not_proven(run: Run, *needles: str, code: int = 1) -> None:
    """Not proven: exit 1 (a bug claimed) or, with `code=3`, inconclusive."""
    _sane(run, code)
    assert "not proven" in run.text
    for needle in needles:
        assert needle in run.text, f"{needle!r} not in:\n{run.text}"


# --- replica groups and meshes ----------------------------------------------------------------

_DOT = ("      %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : "
        "(tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>\n")
_RETURN_DOT = "      sdy.return %1 : tensor<2x4xf32>"


def _psum(groups: str, shape: str, attrs: str | None = None, mesh: str | None = None) -> str:
    """COMBINED_MISSING_PSUM with an all_reduce over `groups` after the row-parallel dot."""
    attrs = attrs if attrs is not None else (
        "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, "
        f"replica_groups = dense<{groups}> : tensor<{shape}xi64>, use_global_device_ids")
    op = (f'      %2 = "stablehlo.all_reduce"(%1) <{{{attrs}}}> ({{\n'
          "      ^bb0(%x: tensor<f32>, %y: tensor<f32>):\n"
          "        %s = stablehlo.add %x, %y : tensor<f32>\n"
          "        stablehlo.return %s : tensor<f32>\n"
          "      }) : (tensor<2x4xf32>) -> tensor<2x4xf32>\n"
          "      sdy.return %2 : tensor<2x4xf32>")
    text = COMBINED_MISSING_PSUM.replace(_DOT + _RETURN_DOT, _DOT + op)
    assert text != COMBINED_MISSING_PSUM
    if mesh:
        text = text.replace('<["tp"=4]>', mesh)
    return text


_REPLICATED_PER_DEVICE = """
module {
  func.func @ref(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    return %x : tensor<2x4xf32>
  }
  func.func @sharded(%x: tensor<2x4xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<2x4xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
%BODY%
  }
}
"""
_ALL_REDUCE_PER_DEVICE = """    %0 = "stablehlo.all_reduce"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<2x4xf32>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>"""


def test_per_device_program_without_a_device_count(write) -> None:
    """All replicated, no mhlo.num_partitions: exact on one device unless an op talks to other
    devices, which then cannot be interpreted (bad input, naming what is missing)."""
    plain = write("plain.mlir", _REPLICATED_PER_DEVICE.replace("%BODY%",
                                                               "    return %x : tensor<2x4xf32>"))
    run = check(plain)
    _sane(run, 0)
    talking = write("talking.mlir", _REPLICATED_PER_DEVICE.replace("%BODY%",
                                                                   _ALL_REDUCE_PER_DEVICE))
    run = check(talking)
    _sane(run, 2)
    assert "cannot tell the number of devices" in run.text, run.text


def test_psum_with_matching_groups_is_proven(write) -> None:
    path = write("ok.mlir", _psum("[[0, 1, 2, 3]]", "1x4"))
    run = check(path, verify=True)
    _sane(run, 0)
    assert "verified" in run.out


@pytest.mark.parametrize("groups, shape", [
    ("[[0, 2], [1, 3]]", "2x2"),          # a partition of the devices, but no mesh axis
    ("[[0, 1], [2, 3]]", "2x2"),          # an axis of a 2x2 mesh, not of tp=4
], ids=["strided", "halves"])
def test_groups_that_match_no_mesh_axes(write, groups, shape) -> None:
    path = write("g.mlir", _psum(groups, shape))
    run = check(path)
    # Groups over no mesh axes are not related to the reference, not claimed wrong: exit 3.
    _not_proven(run, "replica groups", "do not correspond to any mesh axes", f"{path}:10:",
                code=3)


@pytest.mark.parametrize("groups, shape", [
    ("[[0, 1, 2]]", "1x3"),               # not every device
    ("[[0, 1, 2, -1]]", "1x4"),           # XLA's padding id: the same groups
], ids=["partial", "padded"])
def test_groups_that_leave_a_device_out(write, groups, shape) -> None:
    """XLA's verifier refuses groups that do not name every device: bad input."""
    path = write("g.mlir", _psum(groups, shape))
    _bad_input(check(path), f"{path}:10:", "leave out flattened device ids [3]")


def test_groups_for_a_bigger_mesh_than_declared(write) -> None:
    """The collective runs over 8 devices but the mesh has 4: ids out of range, bad input."""
    path = write("g8.mlir", _psum("[[0, 1, 2, 3, 4, 5, 6, 7]]", "1x8"))
    _bad_input(check(path), f"{path}:10:", "flattened device id 4", "outside the 4")


def test_groups_over_a_2d_mesh_written_for_a_1d_one(write) -> None:
    """Mesh dp=2 x tp=2 with groups of a 1-D tp=4 program: the in_shardings no longer fit."""
    path = write("g2d.mlir", _psum("[[0, 1, 2, 3]]", "1x4", mesh='<["dp"=2, "tp"=2]>'))
    run = check(path)
    _sane(run, 1, 2)


def test_groups_with_a_device_out_of_range(write) -> None:
    path = write("oob.mlir", _psum("[[0, 1, 2, 9]]", "1x4"))
    _bad_input(check(path), f"{path}:10:", "replica")


def test_groups_with_a_repeated_device(write) -> None:
    path = write("dup.mlir", _psum("[[0, 0, 1, 2]]", "1x4"))
    _bad_input(check(path), f"{path}:10:", "more than once")


def test_replica_ids_instead_of_device_ids(write) -> None:
    """No channel: the groups are replica ids (cross_replica), and there is one replica."""
    attrs = "replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>"
    path = write("rid.mlir", _psum("", "", attrs=attrs))
    _bad_input(check(path), f"{path}:10:", "replica id 1", "no channel_handle")


def test_permuted_group_order_does_not_matter_for_all_reduce(write) -> None:
    path = write("perm.mlir", _psum("[[3, 2, 1, 0]]", "1x4"))
    _sane(check(path), 0)


@pytest.mark.parametrize("mesh, needle", [
    ('<["tp"=0]>', "axis size"),
    ('<["tp"=-4]>', "axis size"),
    ('<["tp"=2, "tp"=2]>', "duplicate axis"),
    ('<["tp"=1]>', "local shape"),
    ('<["tp"=3]>', "divisible"),
    ('<["dp"=2, "tp"=2]>', "local shape"),
], ids=["zero", "negative", "duplicate-axis", "size-1", "size-3", "2d"])
def test_mesh_that_does_not_fit_the_program(write, mesh, needle) -> None:
    path = write("mesh.mlir", COMBINED_ADD.replace('<["tp"=4]>', mesh))
    _bad_input(check(path), path, needle)


def test_huge_unused_mesh_axes(write) -> None:
    """10^12 devices declared; the computation is manual over tp only."""
    path = write("huge.mlir", COMBINED_ADD.replace(
        '<["tp"=4]>', '<["tp"=4, "x"=1000000, "y"=1000000]>'))
    run = check(path, timeout=30)
    _sane(run, 0, 1, 2)


_PID_MESH = """\
module {
  sdy.mesh @mesh = <["x"=SIZE]>
  func.func @ref(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    return %arg0 : tensor<8xf32>
  }
  func.func @sharded(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"x"} (%a: tensor<8xf32>) {
      %p = stablehlo.partition_id : tensor<ui32>
      %c = stablehlo.constant dense<0> : tensor<ui32>
      %i = stablehlo.multiply %p, %c : tensor<ui32>
      %j = stablehlo.convert %i : (tensor<ui32>) -> tensor<i32>
      %s = stablehlo.dynamic_slice %a, %j, sizes = [8] : (tensor<8xf32>, tensor<i32>) -> tensor<8xf32>
      sdy.return %s : tensor<8xf32>
    } : (tensor<8xf32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"""


def test_partition_id_on_a_big_mesh(write) -> None:
    path = write("pid.mlir", _PID_MESH.replace("SIZE", "1000000"))
    _sane(check(path, timeout=30), 0)


def test_partition_id_on_a_huge_mesh_is_bounded(write) -> None:
    path = write("pid.mlir", _PID_MESH.replace("SIZE", "1000000000"))
    run = check(path, timeout=30)
    _sane(run, 0, 1, 2)
    assert "MemoryError" not in run.text


# --- deep nesting, big and extreme constants --------------------------------------------------

def _chain(n: int, op: str = "tanh") -> str:
    g, loc = "tensor<8x4xf32>", "tensor<2x4xf32>"
    rc = "\n".join(f"    %r{i + 1} = stablehlo.{op} %r{i} : {g}" for i in range(n))
    sc = "\n".join(f"      %s{i + 1} = stablehlo.{op} %s{i} : {loc}" for i in range(n))
    return f"""module {{
  sdy.mesh @mesh = <["tp"=4]>
  func.func @ref(%arg0: {g}) -> {g} {{
    %r0 = stablehlo.add %arg0, %arg0 : {g}
{rc}
    return %r{n} : {g}
  }}
  func.func @sharded(%arg0: {g}) -> {g} attributes {{entangle.refines = @ref}} {{
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{{"tp"}}, {{}}]>] out_shardings=[<@mesh, [{{"tp"}}, {{}}]>] manual_axes={{"tp"}} (%a: {loc}) {{
      %s0 = stablehlo.add %a, %a : {loc}
{sc}
      sdy.return %s{n} : {loc}
    }} : ({g}) -> {g}
    return %0 : {g}
  }}
}}
"""


def test_deeply_nested_terms(write) -> None:
    """20000 nested tanh: every recursive walk over terms must cope (with the Z3 checks on)."""
    path = write("deep.mlir", _chain(20000))
    run = check(path, verify=True)
    _sane(run, 0)


def _chain_with_bug(n: int) -> str:
    k = n // 2
    return _chain(n).replace(f"      %s{k + 1} = stablehlo.tanh %s{k} ",
                             f"      %s{k + 1} = stablehlo.exponential %s{k} ")


def test_nested_terms_with_a_bug(write) -> None:
    path = write("deep_bug.mlir", _chain_with_bug(1000))
    _not_proven(check(path), f"{path}:")


def test_deeply_nested_terms_with_a_bug(write) -> None:
    path = write("deep_bug.mlir", _chain_with_bug(2000))
    run = check(path)
    _not_proven(run, f"{path}:")


def _calls(n: int, recursive: bool = False) -> str:
    """@sharded calls f0, which calls f1, ..., which calls f{n} (tanh)."""
    loc = "tensor<2x4xf32>"
    fns = []
    for i in range(n):
        callee = 0 if recursive and i == n - 1 else i + 1
        fns.append(f"""  func.func private @f{i}(%x: {loc}) -> {loc} {{
    %y = func.call @f{callee}(%x) : ({loc}) -> {loc}
    return %y : {loc}
  }}""")
    fns.append(f"""  func.func private @f{n}(%x: {loc}) -> {loc} {{
    %y = stablehlo.tanh %x : {loc}
    return %y : {loc}
  }}""")
    text = _chain(1).replace("%s1 = stablehlo.tanh %s0", "%s1 = func.call @f0(%s0)").replace(
        f"func.call @f0(%s0) : {loc}", f"func.call @f0(%s0) : ({loc}) -> {loc}")
    return text.rstrip().rstrip("}") + "\n".join(fns) + "\n}\n"


def test_nested_calls(write) -> None:
    path = write("calls.mlir", _calls(200))
    _sane(check(path), 0)


def test_recursive_calls(write) -> None:
    path = write("rec.mlir", _calls(3, recursive=True))
    _bad_input(check(path), path, "recursive")


def test_many_nested_calls_finish_quickly(write) -> None:
    path = write("calls.mlir", _calls(3000))
    run = check(path, timeout=20)
    _sane(run, 0)


@pytest.mark.parametrize("value", ["0x7F800000", "0xFF800000", "0x7FC00000", "3.4e38",
                                   "1.0e-45", "-0.0"],
                         ids=["inf", "-inf", "nan", "max", "denormal", "negzero"])
def test_extreme_constants(write, value) -> None:
    def add_const(text: str, g: str, x: str, indent: str) -> str:
        return (f"{indent}%c = stablehlo.constant dense<{value}> : {g}\n"
                f"{indent}%{'0' if indent == '    ' else '1'} = stablehlo.add %{x}, %c : {g}")

    text = COMBINED_ADD.replace("    %0 = stablehlo.add %arg0, %arg1 : tensor<8x4xf32>",
                                add_const(COMBINED_ADD, "tensor<8x4xf32>", "arg0", "    "))
    text = text.replace("      %1 = stablehlo.add %a, %b : tensor<2x4xf32>",
                        add_const(text, "tensor<2x4xf32>", "a", "      "))
    path = write("c.mlir", text)
    _sane(check(path, verify=True), 0, 1)


def test_huge_dense_constant(write) -> None:
    """A 2^20-element non-splat constant (about 10 MB of text) on both sides."""
    rows, cols = 1024, 1024
    rng = random.Random(0)
    values = ",".join("[" + ",".join(str(rng.randrange(-9, 10)) for _ in range(cols)) + "]"
                      for _ in range(rows))
    g, loc = f"tensor<{rows}x{cols}xf32>", f"tensor<{rows // 4}x{cols}xf32>"
    const = f"stablehlo.constant dense<[{values}]> : {g}"
    text = f"""module {{
  sdy.mesh @mesh = <["tp"=4]>
  func.func @ref(%arg0: {g}) -> {g} {{
    %c = {const}
    %r = stablehlo.multiply %arg0, %c : {g}
    return %r : {g}
  }}
  func.func @sharded(%arg0: {g}) -> {g} attributes {{entangle.refines = @ref}} {{
    %c = {const}
    %0 = sdy.manual_computation(%arg0, %c) in_shardings=[<@mesh, [{{"tp"}}, {{}}]>, <@mesh, [{{"tp"}}, {{}}]>] out_shardings=[<@mesh, [{{"tp"}}, {{}}]>] manual_axes={{"tp"}} (%a: {loc}, %b: {loc}) {{
      %s = stablehlo.multiply %a, %b : {loc}
      sdy.return %s : {loc}
    }} : ({g}, {g}) -> {g}
    return %0 : {g}
  }}
}}
"""
    path = write("bigconst.mlir", text)
    run = check(path)
    _sane(run, 0, 2)
    assert run.cpu_seconds < TIMEOUT


def test_huge_integer_offsets(write) -> None:
    """Offsets near the i64 limits in a device-dependent table (clamped, never overflow)."""
    text = _PID_MESH.replace("SIZE", "4").replace(
        "%c = stablehlo.constant dense<0> : tensor<ui32>",
        "%c = stablehlo.constant dense<4294967295> : tensor<ui32>")
    path = write("bigoff.mlir", text)
    _sane(check(path), 0, 1)


# --- entangle.refines -------------------------------------------------------------------------

def test_refines_is_not_a_symbol(write) -> None:
    path = write("r.mlir", COMBINED_ADD.replace("entangle.refines = @ref", "entangle.refines = 3"))
    _bad_input(check(path, path), f"{path}:7:", "entangle.refines")


def test_refines_names_a_nested_symbol(write) -> None:
    path = write("r.mlir", COMBINED_ADD.replace("entangle.refines = @ref",
                                                "entangle.refines = @ref::@inner"))
    _bad_input(check(path, path), "entangle.refines")


def test_combined_without_refines_json(write) -> None:
    import json

    path = write("c.mlir", COMBINED_ADD.replace(" attributes {entangle.refines = @ref}", ""))
    run = cli("check", path, "--json", "--no-verify-rules")
    assert run.code == 2 and "Traceback" not in run.text
    doc = json.loads(run.out)
    assert doc["verdict"] == "bad input" and "entangle.refines" in doc["error"]


def test_combined_without_refines_in_entangle_opt(write) -> None:
    path = write("c.mlir", COMBINED_ADD.replace(" attributes {entangle.refines = @ref}", ""))
    pipeline = ("--pass-pipeline=builtin.module(entangle-normalize,entangle-import-shardings,"
                "entangle-infer-relations,entangle-check-refinement)")
    run = cli(path, pipeline,
              code="from entangle_mlir.opt import main; sys.exit(main(sys.argv[1:]))")
    assert "Traceback" not in run.text
    assert run.code == 2, run.text
    assert "entangle.refines" in run.text


def _two_sharded(bug_first: bool) -> str:
    i = COMBINED_ADD.index("  func.func @sharded")
    j = COMBINED_ADD.rindex("}")
    good = COMBINED_ADD[i:j]
    bad = good.replace("@sharded", "@sharded_bug").replace("stablehlo.add %a, %b",
                                                           "stablehlo.subtract %a, %b")
    return COMBINED_ADD[:i] + (bad + good if bug_first else good + bad) + "}\n"


def test_two_sharded_functions_bug_first(write) -> None:
    path = write("two.mlir", _two_sharded(bug_first=True))
    _sane(check(path, path), 1, 2)


def test_two_sharded_functions_bug_second(write) -> None:
    path = write("two.mlir", _two_sharded(bug_first=False))
    _sane(check(path, path), 1, 2)


def test_function_refining_itself(write) -> None:
    path = write("self.mlir", COMBINED_ADD.replace("entangle.refines = @ref",
                                                   "entangle.refines = @sharded"))
    _bad_input(check(path, path), "entangle.refines")


# --- special files ----------------------------------------------------------------------------

def test_dev_null(write) -> None:
    _bad_input(check("/dev/null", write("s.mlir", SHARDED_ADD)), "/dev/null", "empty")


def test_proc_file(write) -> None:
    _bad_input(check("/proc/self/status", write("s.mlir", SHARDED_ADD)), "/proc/self/status")


def test_dev_zero_is_bounded(write) -> None:
    _bad_input(check("/dev/zero", write("s.mlir", SHARDED_ADD), timeout=30), "/dev/zero")


def test_fifo_does_not_hang(tmp_path, write) -> None:
    fifo = tmp_path / "pipe.mlir"
    os.mkfifo(fifo)
    _bad_input(check(str(fifo), write("s.mlir", SHARDED_ADD), timeout=10), str(fifo))


def test_symlink_loop(tmp_path, write) -> None:
    loop = tmp_path / "loop.mlir"
    os.symlink(loop, loop)
    _bad_input(check(str(loop), write("s.mlir", SHARDED_ADD)), str(loop))


def test_unreadable_file(write) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    path = write("secret.mlir", REF_ADD)
    os.chmod(path, 0)
    _bad_input(check(path, write("s.mlir", SHARDED_ADD)), path)


# --- random corruptions of valid programs (in process: fast) ----------------------------------

def _corrupt(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    op = rng.choice(["flip", "delete_line", "dup_line", "truncate", "swap_lines", "junk",
                     "token"])
    if op == "flip":
        i = rng.randrange(len(text))
        return text[:i] + chr(rng.randrange(32, 127)) + text[i + 1:]
    if op == "delete_line":
        del lines[rng.randrange(len(lines))]
    elif op == "dup_line":
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif op == "truncate":
        return text[:rng.randrange(len(text))]
    elif op == "swap_lines":
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "junk":
        i = rng.randrange(len(text))
        junk = rng.choice(["{", "}", "(", ")", "<", ">", "%", "@", ",", ":", '"', "-1",
                           "tensor<", "x", "\x00", "\u00e9"])
        return text[:i] + junk + text[i:]
    else:
        tokens = ["4", "2", "8", "f32", "i32", '"tp"', "%a", "%b", "%1", "[0]", "[1]", "add",
                  "dot_general", "all_reduce", "0", "1", "tensor<2x4xf32>"]
        old, new = rng.choice(tokens), rng.choice(tokens)
        hits = [i for i in range(len(text)) if text.startswith(old, i)]
        if hits:
            i = rng.choice(hits)
            return text[:i] + new + text[i + len(old):]
    return "\n".join(lines)


def test_random_corruptions_never_crash(tmp_path) -> None:
    """300 single corruptions of valid programs: a verdict or bad input, never an exception."""
    from entangle_mlir.cli import main

    sources = [COMBINED_ADD, COMBINED_MISSING_PSUM, _psum("[[0, 1, 2, 3]]", "1x4"),
               (EXAMPLES_MLIR / "megatron_mlp_tp4.sharded.mlir").read_text()]
    ref = str(EXAMPLES_MLIR / "megatron_mlp_tp4.ref.mlir")
    rng = random.Random(20240601)
    path = tmp_path / "fz.mlir"
    problems = []
    for k in range(300):
        which = rng.randrange(len(sources))
        text = _corrupt(rng, sources[which])
        path.write_text(text, errors="surrogateescape")
        args = ["check", str(path), "--no-verify-rules"]
        if which == len(sources) - 1:
            args.insert(1, ref)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = main(args)
        except SystemExit as e:
            code = e.code
        except BaseException as e:  # noqa: BLE001
            problems.append(f"#{k}: {type(e).__name__}: {e}\n{text[:2000]}")
            continue
        if code not in (0, 1, 2, 3) or "Traceback" in out.getvalue():
            problems.append(f"#{k}: exit {code}: {out.getvalue()[:500]}")
    assert not problems, "\n\n".join(problems[:3])
