"""What ops compute, exactly: the executable semantics of StableHLO ops and terms, and the process
groups of collectives as the StableHLO spec defines them.

Split as StableHLO's reference interpreter splits Element, Tensor, Ops and ProcessGrid, lower
modules first (each imports only modules above it here):

* `element`: one element in its dtype's arithmetic (exact rationals, or z3 terms);
* `tensor`: arrays of elements: data movement, contraction, gather/scatter, top_k;
* `ops`: `OP_SEMANTICS`, what one op computes on one device;
* `groups`: the process groups a collective combines (imports none of the others);
* `collectives`: `COLLECTIVE_SEMANTICS`, the ops across devices, and `run_op`;
* `evaluate`: `evaluate_term`, the value of a reference term.

Everything the Z3 checks (`analysis/instance/`, the lemma tests) know about what an op or a
term computes is in these tables."""
