"""entangle-normalize: programs XLA would reject are bad input (`validate.py`); inline func.calls so every rule sees plain ops; shard_maps that pass device-local values to one another merged (`manual_merge.py`: jax.grad of a shard_map'd function); ring attention loops (a while
whose body is one online-softmax step over blocks passed by collective_permute) are folded by
their invariant (`ring_fold.py`), and a differentiated ring's pair of loops (the forward
storing residuals, the backward reading them back) too (`ring_pair.py`), other ring loops (constant trip count) are unrolled and the
residuals their gradient's loops store and read back forwarded (`unroll.py`);
converts to their operand's own type are dropped; reductions over unit dims (jax's transposes with one sequence / head per device) become
reshapes (`unit_dims.py`);
per-token computations on flattened `(batch, seq)` keep both dims (`token_dims.py`); numerical
idioms (psum as all_gather + sum, log-sum-exp shifts) take one form (`idioms.py`,
`rewrites.py`).

The deprecated `stablehlo.dot` is read as a dot_general by `opinfo.describe`, and copies are
transparent to the walk, so neither needs rewriting here.
"""

from __future__ import annotations

from dataclasses import dataclass

from entangle_mlir.mlir.ir import ops_in_order
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.finite import Finiteness, judging
from entangle_mlir.normalize.idioms import drop_identity_converts
from entangle_mlir.normalize.manual_merge import merge_manual_computations
from entangle_mlir.normalize.max_cotangent import zero_max_cotangents
from entangle_mlir.normalize.rewrites import rewrite_idioms
from entangle_mlir.normalize.ring_fold import fold_ring_loops
from entangle_mlir.normalize.ring_pair import fold_ring_pairs
from entangle_mlir.normalize.token_dims import split_token_dims
from entangle_mlir.normalize.unit_dims import fold_unit_dims
from entangle_mlir.normalize.unroll import forward_residuals, unroll_ring_loops
from entangle_mlir.normalize.validate import validate_module
from entangle_mlir.passes.pipeline import ModulePass, PassState


@dataclass
class NormalizePass(ModulePass):
    name = "entangle-normalize"
    summary = ("inline func.call ops (jax helpers such as _where, tril); exact rewrites to one "
               "form (unit dims, flattened tokens, numerical idioms)")

    assume_no_overflow: bool = False
    """Take sums and products of finite values as finite (`finite.Finiteness`); a proof that
    relies on it lists `finite.NO_OVERFLOW` among its assumptions."""

    def apply(self, state: PassState) -> None:
        state.finiteness = Finiteness(self.assume_no_overflow)
        with judging(state.finiteness):
            self._normalize(state)

    def _normalize(self, state: PassState) -> None:
        modules = {id(state.module): (state.module, state.file)}
        if state.program is not None:
            for module, file in ((state.program.ref_module, state.program.ref_file),
                                 (state.program.sharded_module, state.program.sharded_file)):
                modules[id(module)] = (module, file)
        for module, file in modules.values():
            with module.context:
                validate_module(module, file)
        listed = []
        for module, file in modules.values():
            inline_calls(module, file)
            state.finiteness.file = file
            with module.context:
                merge_manual_computations(module)
                # One walk lists the ops; each rewrite filters the list, and a rewrite that
                # changes the module makes the next one walk afresh.
                ops = ops_in_order(module)
                if fold_ring_pairs(module, ops, state.notes, file):
                    ops = ops_in_order(module)
                if fold_ring_loops(module, ops, state.notes, file):
                    ops = ops_in_order(module)
                if unroll_ring_loops(module, ops):
                    forward_residuals(module)
                    ops = ops_in_order(module)
                if drop_identity_converts(module, ops):
                    ops = ops_in_order(module)
                if fold_unit_dims(module, ops):
                    ops = ops_in_order(module)
                if zero_max_cotangents(module, ops):
                    ops = ops_in_order(module)
                if rewrite_idioms(module, ops):
                    ops = None
            listed.append(ops)
        module = next(iter(modules.values()))[0]
        with module.context:
            split_token_dims([m for m, _ in modules.values()], listed)
