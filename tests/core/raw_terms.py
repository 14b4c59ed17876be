"""What the normal-form lemma tests share: terms written with raw nodes (`intern`, which the
builders' normal forms do not touch) for the side before an identity, and the two Z3 verdicts
a lemma asks of `check_term_equality`."""

from __future__ import annotations

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.terms import Term, intern

F32 = "f32"


def raw(op: str, args, attrs, shape, dtype: str = F32) -> Term:
    return intern(op, tuple(args), attrs, tuple(shape), dtype)


def raw_slice(term: Term, starts, limits) -> Term:
    shape = tuple(b - a for a, b in zip(starts, limits))
    return raw("slice", (term,), (tuple(starts), tuple(limits), (1,) * len(shape)), shape,
               term.dtype)


def raw_concat(pieces, dim: int) -> Term:
    shape = list(pieces[0].shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    return raw("concatenate", pieces, (dim,), shape, pieces[0].dtype)


def proved(a: Term, b: Term, name: str = "normal_form.lemma") -> bool:
    return check_term_equality(a, b, name).status == "proved"


def refuted(a: Term, b: Term, name: str = "normal_form.must_fail") -> bool:
    return check_term_equality(a, b, name).status == "refuted"
