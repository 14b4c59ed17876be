"""Z3 checks of rule instances: does an op's inferred output relation really hold?

`checker.check_instance(info, in_values, out_values, mesh)` proves that, for EVERY global tensor
satisfying the input relations, running the op on each device (`semantics/`) produces values
satisfying the output relations. The query is built on small symbolic tensors:

1. every input relation's term becomes a global tensor of z3 variables (see "abstraction");
2. each device's LOCAL operand is derived from the relation's exact meaning
   (`core/relations.py`): the block of the global tensor for tiled dims (mesh axes major first;
   poly dims whole); for a partial SUM over axes P, fresh local variables on all but the last
   device of each P-group and the last one = block minus the others (so every split of the
   block is covered); for a partial MAX/MIN, fresh locals constrained (hypotheses) to have the
   block as max/min; a `DeviceScalar` is its concrete per-device integer; an `Opaque` operand
   is unconstrained;
3. the op runs per device (collectives across devices);
4. the claim: on every device, the result reduced over the output's partial axes equals the
   block of the output term (a `DeviceScalar` output equals its table entry).

On big meshes only one device per symmetric mesh axis is simulated (`devices._symmetric_axes`:
the other devices' claims are the same up to a renaming of the variables; an all_to_all is
symmetric in its own group axis by a rotation of its chunks, `devices.all_to_all_axes`, and its
checked device's operands hold only the chunks it receives), and terms are evaluated on those
devices' blocks only (`blocks.region_value`), so the cost stays nearly flat in mesh size. A
device mask's claims differ by the device's block offset, so no renaming makes them one; they
are checked in one query with the device's coordinates along the mask's axes z3 integers
(`symbolic_device`).

**Abstraction and reduced shapes.** Input terms can be whole-network DAGs, and tensors can be
large. So each input term is replaced by a fresh leaf (splat and iota constants are kept, a
poly broadcast keeps its broadcast; a term not shown finite becomes an unbounded leaf,
`terms.make_arg(finite=False)`, so a rule keeps `0 * leaf` where it kept `0 * term`), the
rule is re-run on the abstract inputs, and the real output terms must be exactly the abstract
outputs with the leaves substituted back (otherwise the real terms are used, when small). An
op the general tier states in another exact form than its rule's (`abstraction.STATED_FORMS`:
an update at concrete starts as slices and a concatenation) is last tried with that form. A
large instance of a shape-uniform op (elementwise, dot_general, reduce, transpose,
broadcast_in_dim, reshapes that only merge or split dims, concatenate, iota, splat constants,
gather/scatter, collectives, slice and pad; dynamic_slice and dynamic_update_slice at
constant in-range starts, reduced as a slice with the start moved to the shrunk rows before
the window) is then checked at a reduced shape: every local dim becomes min(size, 2) (1
stays 1; each global dim stays a multiple of its number of blocks; dims tied by the attributes
stay tied; a dim a slice cuts or a pad pads keeps its size), the rule is run again there, and
its outputs must have the same layouts and the same term skeleton as at the real shape. Other
ops are checked at their real shape when small, else "skipped" with the reason. Results are
cached by (op signature, layouts, abstract terms, shape class), so the 2nd..Nth identical layer
costs a dictionary lookup.

Assumptions, all in the direction of "not proved" rather than "wrongly proved": every divisor
met is nonzero (exact real semantics leaves x / 0 undefined; a contradictory assumption set is
reported as unknown), loop variables and loop results are arbitrary values, transcendental
functions are uninterpreted. The abstraction's substitution step trusts the term constructors
of `core/terms.py` to preserve meaning (property-tested in tests/analysis/test_instance.py).

`unknown` is never reported as proved; when Z3 answers unknown, a few concrete evaluations
with exact rationals (and pseudo-random interpretations of the uninterpreted functions) look
for a genuine counterexample before giving up.

The modules, lower first (each imports only modules above it here); callers import a name from
the module that defines it (this package re-exports nothing):

* `common`: the limits, query names, instance sizes and term costs, a value's relations and key;
* `shapes`: the reduced local shapes of a shape-uniform op;
* `abstraction`: re-running the rule, the instance on fresh leaves (`abstract_instance`);
* `reduce`: the abstract instance at a reduced shape (`reduced_info`, `reduced_instance`);
* `cache`: the keys of the proof and plan caches, and the reusable `Plan`;
* `sources`: the query's values: z3 variables or random exact rationals, leaves on demand;
* `blocks`: each device's local value of a value under its relation, a term on one block;
* `devices`: which devices' claims are checked (symmetric mesh axes), the op run on them;
* `symbolic_device`: a device-mask instance checked for every device of a class at once, the
  coordinates along its mask's axes z3 integers (`symbolic_axes`, `symbolic_claims`);
* `claims`: the claim's conjuncts (`build`);
* `solve`: the claim proved by Z3, or a concrete counterexample (`run_check`);
* `fallback`: two reference terms proved equal (`check_term_equality`);
* `checker`: `check_instance` and `InstanceChecker`: what is checked, caches, time budget;
* `parallel`: `check_batch`, many instances at once, the Z3 queries in forked worker processes.
"""
