"""Checking many rule instances, in worker processes where that pays (`check_batch`).

Planning an instance (its abstraction, reduced shape, proof-cache key) is cheap and stays in
this process, in order, so the plan and proof caches fill as in a serial run; proving the
planned queries (building the symbolic instance, then Z3: about 95% of the stage) runs in a
pool of worker processes. The workers are forked after planning: they inherit the planned
instances as they are in memory (terms, relations, Z3's context), so nothing is pickled on
the way in, and each query is built exactly as a serial run builds it: the same terms with the
same serial numbers, the same Z3 variables and expressions (the SMT-LIB text differs only in
the names Z3 gives shared subterms, which differ between two serial runs too), the same
verdict under the same work limit (Z3 objects do not pickle; terms rebuilt in another
process would be numbered, and so named and ordered, differently). Back come plain results and the queries to
dump; this process records them in instance order (caches, statistics, dump files named as a
serial run names them).

Identical queries are proved once (the first; the others are the proof cache's hits, as in a
serial run). The pool starts only for enough work (`MIN_PARALLEL_WORK`: smaller programs
never pay a fork), and only where a fork is possible (POSIX) and the checker has no budget of
its own (its budget caps each query by what earlier ones spent: a serial notion). The
largest queries are sent first. How many workers: `jobs` (1: serial), or by default the cores this process may use that are
free (`free_cores`: the CPU affinity less the last minute's load average of other processes).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from entangle_mlir.analysis.budget import Budget
from entangle_mlir.analysis.instance.checker import (
    DEFAULT_CHECKER,
    InstanceChecker,
    Pending,
    Planned,
    run_pending,
)
from entangle_mlir.analysis.instance.common import instance_size
from entangle_mlir.analysis.solver import WALL_SLACK, ProofResult, capture_dumps, write_dump
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Value
from entangle_mlir.mlir.opinfo import OpInfo

Item = tuple[OpInfo, Sequence[Value], Sequence[Value], Mesh | None]
"""One instance: the op, its input values, its output values, the mesh (None: global)."""

MIN_PARALLEL = 24
"""The fewest instances a batch is planned for a pool for (fewer are checked one by one)."""

MIN_PARALLEL_WORK = 2048
"""The least work a pool is started for: the pending queries' instance sizes (elements of
their largest tensors, `instance_size`) added up. Starting two workers (forking this process)
and shutting them down take 10 to 60 ms here; the demo's programs, a few hundred instances
each, break even near 1500 (the layer norms and MLPs, under 800, ran 5-40% slower in a
pool; the attention block, 2500, 1.36x faster)."""

CHUNK_MAX = 4
"""The most queries sent to a worker at once (fewer round trips; small, for balance: query
costs vary a hundredfold)."""

_FORK_WARNING = r".*(fork\(\) was called|multi-threaded, use of fork\(\))"

_JOBS: list[Pending] = []
"""What forked workers read: the pending queries of the current batch."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def free_cores() -> int:
    """The cores this process may run on that other processes leave free: the affinity less
    the last minute's load average, this process's own share (1) not counted, rounded."""
    cores = available_cores()
    try:
        others = max(0.0, os.getloadavg()[0] - 1.0)
    except (AttributeError, OSError):  # pragma: no cover - no load average
        return 1
    return max(1, min(cores, round(cores - others)))


def resolve_jobs(jobs: int | None) -> int:
    """Worker processes for `jobs`: itself when positive, else (None, 0: automatic)
    `free_cores()`."""
    return jobs if jobs is not None and jobs > 0 else free_cores()


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def check_batch(items: Sequence[Item], *, jobs: int | None = None,
                budget: Budget | None = None,
                checker: InstanceChecker | None = None) -> Iterator[ProofResult | None]:
    """The result of each instance, in order, as `checker.check` gives it (default: the
    module-wide checker); None for an instance not checked within `budget` (CPU seconds:
    this process's and those the workers report for the queries taken so far, in order, so
    where the budget ends does not depend on the machine's load nor on `jobs`).
    `jobs`: worker processes (None or 0: `free_cores`; 1: serial, in this process)."""
    checker = checker or DEFAULT_CHECKER
    workers = resolve_jobs(jobs)
    if workers <= 1 or checker.budget_s is not None or len(items) < MIN_PARALLEL \
            or not can_fork():
        yield from _serial(items, budget, checker)
        return
    yield from _parallel(items, budget, checker, workers)


def _over(budget: Budget | None) -> bool:
    return budget is not None and budget.over()


def _serial(items: Sequence[Item], budget: Budget | None, checker: InstanceChecker
            ) -> Iterator[ProofResult | None]:
    for info, ins, outs, mesh in items:
        yield None if _over(budget) else checker.check(info, ins, outs, mesh)


def _parallel(items: Sequence[Item], budget: Budget | None, checker: InstanceChecker,
              workers: int) -> Iterator[ProofResult | None]:
    """Plan every instance here, prove the distinct pending queries in a pool, finish in
    order (see the module's docstring)."""
    planned: list[Planned] = []
    known: list[ProofResult | None] = []  # the proof cache's answer at planning time
    job_of: list[int | None] = []  # the index of the query each instance waits for
    first: dict = {}  # proof-cache key -> its query's index (later ones are duplicates)
    jobs: list[Pending] = []
    for info, ins, outs, mesh in items:
        if _over(budget):
            break
        p = checker.plan(info, ins, outs, mesh)
        planned.append(p)
        hit = checker.cached(p) if isinstance(p.outcome, Pending) else None
        known.append(hit)
        job = None
        if isinstance(p.outcome, Pending) and hit is None:
            key = p.outcome.key
            job = first.get(key) if key is not None else None
            if job is None:
                job = len(jobs)
                jobs.append(p.outcome)
                if key is not None:
                    first[key] = job
        job_of.append(job)
    results = _Results(jobs, budget, workers)
    try:
        for index, p in enumerate(planned):
            if isinstance(p.outcome, ProofResult) or known[index] is not None:
                yield checker.finish(p, known[index] or p.outcome)
                continue
            job = job_of[index]
            if jobs[job] is not p.outcome:  # a duplicate: proved by its first instance
                hit = checker.cached(p)
                if hit is not None:
                    yield checker.finish(p, hit)
                    continue
            outcome = None if _over(budget) else results.get(job, p.outcome)
            if outcome is None:
                p.stats.checks -= 1  # not taken within the budget: not a check
                yield None
                continue
            result, dumps, seconds, cpu = outcome
            if budget is not None:
                budget.spend(cpu)
            for name, text in dumps:
                write_dump(name, text)
            yield checker.finish(p, result, seconds)
        for _ in range(len(planned), len(items)):
            yield None
    finally:
        results.close()


class _Results:
    """The pool's results by query index. A query asked for again (the duplicate of one
    whose result is not cached: unknown) is proved here, in order; so is every query left
    when the pool cannot start, a worker dies, or one hangs past any query's budget (the
    workers are then stopped)."""

    def __init__(self, jobs: list[Pending], budget: Budget | None, workers: int) -> None:
        self.jobs = jobs
        self.budget = budget
        self.taken: set[int] = set()
        self.chunks: list[tuple[list[int], Future]] = []
        self.where: dict[int, tuple[int, int]] = {}  # query -> (its chunk, its place there)
        self.pool: ProcessPoolExecutor | None = None
        sizes = [instance_size(p.info, p.ins, p.outs) for p in jobs]
        if sum(sizes) < MIN_PARALLEL_WORK:
            return
        global _JOBS
        _JOBS = jobs
        size = max(1, min(CHUNK_MAX, len(jobs) // (workers * 16)))
        # the largest first (a query's time grows with its tensors' size): one large query
        # begun last would keep one worker busy while the other has nothing left
        order = sorted(range(len(jobs)), key=lambda j: -sizes[j])
        parts = [order[lo:lo + size] for lo in range(0, len(order), size)]
        self.where = {job: (k, place) for k, part in enumerate(parts)
                      for place, job in enumerate(part)}
        gc.freeze()  # the workers' collector leaves the inherited heap alone (no copying)
        try:
            with warnings.catch_warnings():
                # jax (when loaded) and Python 3.12 warn that a multithreaded process forks:
                # the workers run Python and Z3 only, never XLA's or MLIR's threads' code.
                warnings.filterwarnings("ignore", _FORK_WARNING, RuntimeWarning)
                warnings.filterwarnings("ignore", _FORK_WARNING, DeprecationWarning)
                self.pool = ProcessPoolExecutor(min(workers, len(jobs)),
                                                mp_context=multiprocessing.get_context("fork"))
                self.chunks = [(part, self.pool.submit(_run_chunk, part)) for part in parts]
        except OSError:  # no fork (process limits): everything is proved here
            self._stop()
        finally:
            gc.unfreeze()

    def get(self, job: int, pending: Pending):
        """(result, dumps, seconds, worker CPU seconds) of query `job`, or None when the
        budget ran out before it could be proved here."""
        if job in self.taken or not self.chunks:
            return self._here(pending)
        self.taken.add(job)
        k, place = self.where[job]
        part, future = self.chunks[k]
        try:
            return future.result(timeout=patience([self.jobs[j] for j in part]))[place]
        except Exception:  # noqa: BLE001 - a worker died or hung, or the pool broke
            self._stop()
            return self._here(pending)

    def _here(self, pending: Pending):
        if _over(self.budget):
            return None
        start = time.perf_counter()
        return run_pending(pending), [], time.perf_counter() - start, 0.0

    def _stop(self) -> None:
        """Give up on the pool: stop its workers; the rest is proved here."""
        self.chunks = []
        if self.pool is not None:
            for process in list((getattr(self.pool, "_processes", None) or {}).values()):
                process.terminate()
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None

    def close(self) -> None:
        """Stop the pool: its workers are gone when every query was answered; when the
        caller stopped early, the queries not begun are cancelled (the running ones end on
        their own)."""
        global _JOBS
        if self.pool is not None:
            done = all(future.done() for _, future in self.chunks)
            self.pool.shutdown(wait=done, cancel_futures=not done)
        _JOBS = []


def patience(jobs: list[Pending]) -> float:
    """How long to wait for a worker's answer to `jobs` before taking it for hung: every
    Z3 call they may make (a claim, its vacuity check, an overflow check) at its wall-clock
    backstop, plus a minute for building the queries."""
    return 60.0 + sum(3 * WALL_SLACK * p.timeout_ms / 1000 for p in jobs)


def _run_chunk(part: list[int]) -> list:
    """In a worker: prove these queries of the batch it was forked with (each with its wall
    and CPU seconds; the budget is kept by the process that reads them, in order)."""
    out: list = []
    for job in part:
        start, cpu = time.perf_counter(), time.process_time()
        with capture_dumps() as dumps:
            result = run_pending(_JOBS[job])
        out.append((result, dumps, time.perf_counter() - start, time.process_time() - cpu))
    return out
