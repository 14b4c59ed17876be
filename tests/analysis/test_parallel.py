"""Rule-instance checks in worker processes (`analysis/instance/parallel.py`): the same
verdicts, counts, diagnostics and dumped queries as the serial checks, on bundled programs
(one proven with many instances, one with a refuted instance, one whose instances Z3 cannot
decide); the pool is really used, not started for few queries, survives a dying worker, and
the default number of workers follows the free cores."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from entangle_mlir.analysis import solver
from entangle_mlir.analysis.budget import Budget
from entangle_mlir.analysis.instance import parallel
from entangle_mlir.analysis.instance.checker import DEFAULT_CHECKER
from entangle_mlir.driver import load_program
from entangle_mlir.mlir.ir import context
from entangle_mlir.passes import PASSES
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline
from tests.shared import EXAMPLES_MLIR

_WALK = ("entangle-normalize,entangle-import-shardings,"
         "entangle-infer-relations{annotate=false reuse-layers=true},entangle-check-refinement")

CASES = {
    "proven": ("gpt2_block_dp2_tp4", ""),
    "refuted": ("megatron_mlp_tp4", "inject-fault=stablehlo.broadcast_in_dim"),
    "refuted reference": ("rmsnorm_hidden_tp4", "inject-fault=reference:stablehlo.add"),
    "unknown": ("rmsnorm_hidden_tp4", "rlimit=1"),
}


class _Pools:
    """Counts the pools started (a spy on ProcessPoolExecutor)."""

    def __init__(self) -> None:
        self.started = 0
        real = parallel.ProcessPoolExecutor

        def start(*args, **kwargs):
            self.started += 1
            return real(*args, **kwargs)

        self.start = start


@pytest.fixture
def pools(monkeypatch) -> _Pools:
    spy = _Pools()
    monkeypatch.setattr(parallel, "ProcessPoolExecutor", spy.start)
    monkeypatch.setattr(parallel, "MIN_PARALLEL", 4)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 16)
    return spy


@pytest.fixture
def fresh_checker():
    """The module-wide checker emptied for the test (each run checks afresh), then restored."""
    saved = (dict(DEFAULT_CHECKER.cache), dict(DEFAULT_CHECKER.plans),
             dict(DEFAULT_CHECKER.stats), DEFAULT_CHECKER.spent)
    yield
    DEFAULT_CHECKER.clear()
    DEFAULT_CHECKER.cache.update(saved[0])
    DEFAULT_CHECKER.plans.update(saved[1])
    DEFAULT_CHECKER.stats.update(saved[2])
    DEFAULT_CHECKER.spent = saved[3]


def _verify(name: str, options: str, jobs: int, dump: Path, monkeypatch) -> dict:
    """The rule checks of one bundled pair with `jobs` workers, from an empty checker, every
    query dumped to `dump`: what the report says about them."""
    DEFAULT_CHECKER.clear()
    monkeypatch.setattr(solver, "_dump_names", {})
    solver.set_dump_dir(dump)
    ref = EXAMPLES_MLIR / f"{name}.ref.mlir"
    program = load_program(str(ref), str(ref.with_name(f"{name}.sharded.mlir")))
    state = PassState(program.sharded_module, program.sharded_file, program=program)
    try:
        with context():
            run_pipeline(parse_pipeline(f"{_WALK},entangle-verify-rules{{jobs={jobs} {options}}}",
                                        PASSES), state)
    finally:
        solver.follow_env_dump_dir()
    report = state.report
    return {
        "verdict": report.verdict,
        "mode": report.mode,
        "counts": report.stats["rule_instances"],
        "by walk": report.stats.get("rule_instances_by_walk"),
        "diagnostics": [(d.message, str(d.loc), d.category) for d in report.diagnostics],
        "unchecked": [(u.walk, u.op_name, str(u.loc), u.reason) for u in report.unchecked],
        "dumps": {p.name: _declared(p.read_text()) for p in sorted(dump.iterdir())},
    }


def _declared(smt: str) -> list[str]:
    """A dumped query's header and declarations (Z3 names its let-bindings by internal ids,
    which differ from run to run in one process: the rest of the text is not comparable)."""
    return [line for line in smt.splitlines() if line.startswith(("; entangle", "(declare"))]


@pytest.mark.parametrize("case", CASES)
def test_parallel_checks_say_what_serial_ones_say(case, pools, fresh_checker, tmp_path,
                                                  monkeypatch) -> None:
    name, options = CASES[case]
    serial = _verify(name, options, 1, tmp_path / "serial", monkeypatch)
    assert pools.started == 0
    two = _verify(name, options, 2, tmp_path / "parallel", monkeypatch)
    assert pools.started == 1, "the instances were not checked in a pool"
    assert two == serial
    counts = serial["counts"]
    assert sum(counts.values()) > 20 and serial["dumps"]
    if case == "proven":
        assert counts["proved"] == sum(counts.values()) and serial["verdict"] == "proven"
    elif case.startswith("refuted"):
        assert counts["refuted"] > 0 and serial["verdict"] == "not proven"
        walk = "in the reference walk" if case.endswith("reference") else "was refuted"
        assert any(walk in d[0] for d in serial["diagnostics"])
    else:
        assert counts["unknown"] > 0 and serial["verdict"] == "not proven"


_DEFAULTS = (parallel.MIN_PARALLEL, parallel.MIN_PARALLEL_WORK)


def test_little_work_starts_no_pool(pools, fresh_checker, tmp_path, monkeypatch) -> None:
    """At the default thresholds, a Megatron MLP's 45 queries (0.05 s) are proved here: a
    pool would cost more than it saves; an attention block's start one."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL", _DEFAULTS[0])
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", _DEFAULTS[1])
    serial = _verify("megatron_mlp_tp4", "", 1, tmp_path / "a", monkeypatch)
    two = _verify("megatron_mlp_tp4", "", 2, tmp_path / "b", monkeypatch)
    assert pools.started == 0 and two == serial
    _verify("attention_tp4", "", 2, tmp_path / "c", monkeypatch)
    assert pools.started == 1


def _dying_worker(part: list[int]) -> list:
    os._exit(3)


def test_a_dying_worker_costs_time_not_results(pools, fresh_checker, tmp_path,
                                               monkeypatch) -> None:
    serial = _verify("megatron_mlp_tp4", "inject-fault=stablehlo.broadcast_in_dim", 1,
                     tmp_path / "a", monkeypatch)
    monkeypatch.setattr(parallel, "_run_chunk", _dying_worker)
    two = _verify("megatron_mlp_tp4", "inject-fault=stablehlo.broadcast_in_dim", 2,
                  tmp_path / "b", monkeypatch)
    assert pools.started == 1 and two == serial


def _hung_worker(part: list[int]) -> list:
    time.sleep(3600)
    return []


def test_a_hung_worker_is_stopped_and_its_queries_proved_here(pools, fresh_checker, tmp_path,
                                                              monkeypatch) -> None:
    serial = _verify("rmsnorm_hidden_tp4", "", 1, tmp_path / "a", monkeypatch)
    monkeypatch.setattr(parallel, "_run_chunk", _hung_worker)
    monkeypatch.setattr(parallel, "patience", lambda jobs: 0.5)
    start = time.perf_counter()
    two = _verify("rmsnorm_hidden_tp4", "", 2, tmp_path / "b", monkeypatch)
    assert pools.started == 1 and two == serial
    assert time.perf_counter() - start < 30
    for _ in range(50):  # the hung workers were stopped
        if not multiprocessing.active_children():
            break
        time.sleep(0.1)
    assert not multiprocessing.active_children()


def _mlp_instances() -> list:
    """The rule instances of the Megatron MLP example's sharded walk, as `check_batch` takes
    them."""
    ref = EXAMPLES_MLIR / "megatron_mlp_tp4.ref.mlir"
    program = load_program(str(ref), str(ref.with_name("megatron_mlp_tp4.sharded.mlir")))
    state = PassState(program.sharded_module, program.sharded_file, program=program)
    with context():
        run_pipeline(parse_pipeline(_WALK, PASSES), state)
    items = [(r.info, r.inputs, r.outputs, state.walks["sharded"].mesh if r.manual_axes
              else None) for r in state.walks["sharded"].records if r.outputs]
    return items


def test_over_the_budget_nothing_is_begun(pools, fresh_checker, tmp_path,
                                          monkeypatch) -> None:
    items = _mlp_instances()
    for jobs in (1, 2):
        DEFAULT_CHECKER.clear()
        assert list(parallel.check_batch(items, jobs=jobs, budget=Budget(-1.0))) == [None] * len(items)
        assert not DEFAULT_CHECKER.stats or all(s.checks == 0
                                                for s in DEFAULT_CHECKER.stats.values())


def test_the_workers_cpu_time_is_counted_in_the_budget(pools, fresh_checker) -> None:
    """A budget counts the CPU seconds the workers report for the queries taken (in order), so
    where it runs out does not depend on `jobs`: serially every query's time is this process's
    own, in a pool the workers' reports stand for it."""
    items = _mlp_instances()
    DEFAULT_CHECKER.clear()
    budget = Budget(3600.0)
    results = list(parallel.check_batch(items, jobs=2, budget=budget))
    assert pools.started and all(r is not None for r in results)
    assert budget.spent_elsewhere > 0.0


def test_a_budget_counts_cpu_time_not_waiting() -> None:
    """Sleeping spends no CPU time; working does; time spent elsewhere is added."""
    budget = Budget(0.05)
    time.sleep(0.2)
    assert not budget.over()
    budget.spend(0.04)
    assert not budget.over()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert budget.over() and budget.spent() >= 0.09


def test_other_threads_do_not_spend_a_budget() -> None:
    """A budget counts the CPU time of the thread that made it: another thread of the process
    working (a test runner's, a cluster client's) spends none of it, and a budget read from
    another thread still counts its maker's work (the general tier runs on its own thread)."""
    import threading

    budget = Budget(0.05)

    def spin() -> None:
        deadline = time.thread_time() + 0.2
        while time.thread_time() < deadline:
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    assert budget.spent() < 0.05, budget.spent()
    mine = Budget(0.05)
    read = []
    deadline = time.thread_time() + 0.1
    while time.thread_time() < deadline:
        pass
    reader = threading.Thread(target=lambda: read.append(mine.spent()))
    reader.start()
    reader.join()
    assert read[0] >= 0.09


@pytest.mark.parametrize("cores,load,jobs", [
    (2, 0.1, 2),   # idle: both cores (this process itself not counted)
    (2, 1.3, 2),   # this process and a little more
    (2, 2.0, 1),   # one other process busy: one core free
    (2, 6.0, 1),
    (8, 3.0, 6),
    (1, 0.0, 1),
])
def test_default_workers_are_the_free_cores(cores, load, jobs, monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert parallel.free_cores() == jobs
    assert parallel.resolve_jobs(None) == parallel.resolve_jobs(0) == jobs
    assert parallel.resolve_jobs(3) == 3
