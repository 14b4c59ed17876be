"""A device's value renamed from its representative's (`symmetry.Symmetry.renamed_local`) is
kept as the renaming until its term is read (`values.Local`): it is coherent with its
representative's without being built, it builds exactly `Symmetry.rename`'s term, and a
rotation noted on it (`Symmetry.record` on a shared value) is recorded when it is built.
A value renamed from another term is not taken as coherent unbuilt."""

from __future__ import annotations

from entangle_mlir.analysis.general.symmetry import Symmetry
from entangle_mlir.analysis.general.values import Local
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.terms import make_arg, make_elementwise, make_mul

MESH = Mesh((("dp", 2), ("tp", 2)))


def _setup():
    sym = Symmetry(MESH, ("dp", "tp"))
    x = make_arg(0, (4, 4), "f32")
    sym.permute_argument(x, (("dp",), ("tp",)))
    rep = make_mul(x, make_elementwise("stablehlo.exponential", (x,), (), "f32"))
    return sym, Local("f32", (4, 4), term=rep)


def test_renamed_value_is_built_when_read():
    sym, rep = _setup()
    d = MESH.device({"dp": 1, "tp": 1})
    local = sym.renamed_local(rep, d)
    assert sym.coherent(rep, local, d)
    assert local.renamed_from(rep.term, sym.gamma[d])  # not built by the check
    gamma = sym.gamma[d]
    assert sym.memo.get(gamma, {}).get(rep.term.serial) is None
    term = local.term
    assert term is sym.rename(rep.term, gamma)
    assert term is not rep.term


def test_noted_rotation_is_recorded_when_built():
    sym, rep = _setup()
    d1, d2 = MESH.device({"dp": 0, "tp": 1}), MESH.device({"dp": 1, "tp": 1})
    local = sym.renamed_local(rep, d1)
    sym.record(rep, local, d2)  # the caller established local = rep renamed by gamma_d2
    assert sym.coherent(rep, local, d2)
    term = local.term
    assert sym.memo[sym.gamma[d2]][rep.term.serial] is term


def test_renaming_of_another_term_is_not_coherent_unbuilt():
    sym, rep = _setup()
    d = MESH.device({"dp": 1, "tp": 0})
    other = Local("f32", (4, 4), term=make_elementwise("stablehlo.exponential",
                                                       (rep.term,), (), "f32"))
    local = sym.renamed_local(other, d)
    assert not sym.coherent(rep, local, d)
