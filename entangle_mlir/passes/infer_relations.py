"""entangle-infer-relations: one forward walk per function; attaches `entangle.relation`.

With a reference/sharded pair both are walked; without one (a module of sharded functions
only), every function is walked so each op's relation can still be printed and CHECKed.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir

from entangle_mlir.analysis.infer import Walker
from entangle_mlir.analysis.layer_reuse import LayerIndex, walk_with_fallback
from entangle_mlir.core.relations import Rel
from entangle_mlir.core.terms import single_scaled
from entangle_mlir.mlir.ir import context
from entangle_mlir.mlir.per_device import is_per_device
from entangle_mlir.mlir.program import func_name, functions
from entangle_mlir.passes.pipeline import ModulePass, PassState
from entangle_mlir.rules.base import ReferenceTerms


@dataclass
class InferRelationsPass(ModulePass):
    name = "entangle-infer-relations"
    summary = "infer each op's relation to the reference; attach entangle.relation"
    annotate: bool = True
    reuse_layers: bool = False

    def apply(self, state: PassState) -> None:
        """`reuse_layers`: walk each repeated layer once (`analysis/layer_reuse.py`); only for
        a reference/sharded pair. Ops of the other layers then get no relation. Where reuse
        cannot be followed, both programs are walked again as `layer_reuse.fallback` says."""
        program = state.program
        if program is not None:
            targets = [("reference", program.ref_func, program.ref_module, program.ref_file),
                       ("sharded", program.sharded_func, program.sharded_module,
                        program.sharded_file)]
        else:
            targets = [(func_name(f), f, state.module, state.file)
                       for f in functions(state.module)
                       if "sym_visibility" not in f.attributes]
        # XLA's per-device programs round constants (x / 768 becomes x * f32(1/768)), so
        # their layers meet the reference's only up to rounding (reported in a note).
        layers = LayerIndex(rounding=is_per_device(program.sharded_module,
                                                   program.sharded_func)) \
            if self.reuse_layers and program is not None else None
        walk_with_fallback(lambda index: self._walk(state, targets, index), layers,
                           restart=state.layers_reused.clear)

    def _walk(self, state: PassState, targets: list, layers: LayerIndex | None) -> None:
        reference = None
        for key, func, module, file in targets:
            walk = Walker(func, module, file, reference, layers).run()
            if layers is not None:
                state.layers_reused[key] = layers.summarized
                layers.summarized = 0
            if key == "reference":
                # Terms and their unscaled bases: a sharded value may differ from the
                # reference's by a scale still pending (a pmean's 1/n) yet name the same view.
                computed = [v.term for v in walk.values.values() if isinstance(v, Rel)]
                if layers is not None:
                    computed += layers.templates
                    layers.reference_outputs = [v.term for v in walk.outputs
                                                if isinstance(v, Rel)]
                reference = ReferenceTerms.of(t for term in computed
                                              for t in (term, single_scaled(term)[1]))
            state.walks[key] = walk
            if self.annotate and module is state.module:
                _annotate(walk)


def _annotate(walk) -> None:
    with context():
        for record in walk.records:
            op = record.info.op
            if op is None or not record.outputs:
                continue
            text = "; ".join(v.describe() for v in record.outputs)
            op.attributes["entangle.relation"] = ir.StringAttr.get(text)
