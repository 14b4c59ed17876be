"""A normal form for data movement the term builders do not apply: what the general tier
(`analysis/general/`) needs to meet a program's per-device pieces with the reference's whole
tensors without Z3.

Every identity here is exact (a float sum split or joined over pieces is a regrouping, which
the semantics policy allows; nothing else is assumed):

* `make_concat`: nested concatenations along one dim are one; adjacent slices of one term
  along the dim join into one slice (the term itself when they cover it); empty pieces go;
  a single piece is itself;
* a slice spanning several pieces of a concatenation is the concatenation of the pieces'
  slices (the builders' `push_slice` only takes a slice inside one piece);
* a slice of a reshape that takes, in each group of dims the reshape splits or merges, a
  run of elements that is a box of the reshape's operand is the reshape of that box
  (`slice_of_reshape`: a micro-batch sliced out of a device's block is rows of the input);
* an elementwise op (same op, same attributes) of concatenations cut at the same rows is the
  concatenation of the op on the pieces, and the other way round: a concatenation of one
  elementwise op applied piece by piece is that op on the concatenated operands (for `lin`
  pieces, parts paired by equal coefficients, whatever order each piece lists them in);
* a concatenation of contractions with the same attributes and one operand in common,
  cut along a free dim of the other, is the contraction of the other operands concatenated
  along that dim;
* a `lin` whose parts are contractions (or sums) that differ only by adjacent slices of
  their operands along the contracted (summed) dim, with equal coefficients, is one
  contraction (sum) over the joined slices; so are parts whose operands' concatenation
  along the contracted dim is no concatenation in normal form (rows of one computation,
  `make_concat`), and transposes of such parts with one permutation;
* a sum over the major half of a dim split in two by a reshape is the sum of the dim's
  consecutive blocks (`sum_of_blocks`: the reference's block sums meet a psum of a tiled
  value); a reshape merging dims whose major one is concatenated is the concatenation of the
  pieces reshaped (`reshape_of_concat`: an untiled all_gather and its reshape);
* a scatter-add into zeros at constant indices whose every update window fits inside the
  operand is the sum of the updates' windows each padded with zeros to its place
  (`scatter_at_constants`: what a device's `x.at[(me + k) % n].add(u)` is once `me` is
  known; a colliding pair of windows is summed, as the scatter sums it);
* a scatter that writes (its region returns the update) at constant indices whose update
  windows fit inside the operand and are pairwise disjoint is the operand's rows around
  each window concatenated with that window's update, dim by dim
  (`scatter_replace_at_constants`: `x.at[i].set(u)` at a known i; a pipeline's outputs set
  micro-batch by micro-batch into zeros become the stacked micro-batches, which the lifts
  below meet with the whole batch's computation); overlapping windows (which write wins is
  implementation-defined) and windows out of bounds are left alone;
* a concatenation of one transpose, broadcast, dot_general or reduction applied piece by
  piece is that op of the concatenated operands, where that concatenation meets
  (`_lift_movement`);
* a sum of parts that are one contraction (sum), under the same transposes, over blocks
  of the summed dim is one contraction over the concatenated blocks, taken in an order in
  which some operand meets (`_join_groups`; any order used on both operands alike is exact);
  so is a sum of scatter-adds into zeros over blocks of their updates (`_join_scatters`).
* a square root or float convert of a constant is the splat of its exact value
  (`fold_constant`: IEEE 754 fixes both, `core/rounding.py`);
* argmax / argmin and top_k of per-block candidates, and index bounds an interval decides:
  `core/selection.py`.
* a reshape that only leaves out unit dims goes to the operands (`squeeze`): through a
  dot_general's unit batch or free dim, a transpose, elementwise ops and `lin`, broadcasts,
  reductions, a reduce_window (window 1 on the dim), a slice (on dims it keeps whole) and a
  top_k (the reference's group of one token block, cut out of its vmapped groups, meets the
  device's unbatched computation); not past a reduction to a dot's unit batch dim, nor to a
  scalar (a device's one batch row, which the other rows join along; `_sum_view`'s form);
* a reshape of a reduction takes each group of dims it splits, or merges without a reduced
  dim between them, into the operand, the rest of it staying above the reduction
  (`reshape_through_reduction`; the blocks of a flattened reduction, joined, meet the
  unflattened one), and through a broadcast it splits a dim of the broadcast operand alike
  (`make_reshape`); a reshape of a contraction takes the groups within one operand's free
  dims into that operand (`reshape_through_dot`);
* a slice of a reduction, of a reduce_window with a window of 1 on the cut dims (a cumsum
  along another dim) or of a top_k along its other dims is the op of the operand's rows
  (`slice_through`);
* a transpose putting a dot_general's rhs free dims before its lhs free dims is the dot with
  its operands swapped (`swapped_dot`);
* commuting operands (the builders sort them by serial) are lined up piece by piece before a
  concatenation lifts through an elementwise op (`_aligned`);

and for pipelines (issue 19: each micro-batch, and each row block of it, computed apart;
gradients summed step by step), each exact, at most a regrouping of a sum:

* a piece of one row along the concatenated dim is written in the form of a piece of
  several rows before a broadcast or reduction lifts (`_units_alike`); copies of one row are
  its broadcast (`_copies`); a concatenation of concatenations cut alike along another dim
  is the concatenation of its columns (`_swap_blocks`); runs of a reshape's pieces whose
  operands join along the one dim the reshape merges are joined first (`_runs_joined`);
* a sum or contraction over adjacent dims is one over them merged (`merge_summed_dims`,
  `merge_contracted_dims`); a reshape merging a reduction's adjacent kept dims, or a
  broadcast operand's dims, goes to the operand (`reshape_through_reduction`,
  `merge_through_broadcast`); a slice or reshape of a kept integer table is the table it
  gives (`_table_part`);
* zero pads are read through when sums join (`_peel`); sums of like pieces join in the
  order of the one window of an input each reads (`_unique_window_starts`);
* for a pipelined training step with tp stages (issue 21, `examples/frontier.py`'s
  `pipeline_step`): a concatenation whose pieces do not meet all at once joins its runs of
  adjacent pieces that do (`_adjacent_runs_joined`: each layer's tp column blocks; rows of
  one row each only where they move one input); a concatenation of slices cut alike is the
  slice of the concatenation (`_lift_slice`: the rotary halves of each shard's heads), one of
  pads along a dim they do not pad the pad of the concatenation (the rotary backward); a
  reduction keeping its operand's unit dims is the reshape of the reduction of the squeezed
  operand (`unit_kept_reduction`: a one-layer stage's weight gradient); the contractions of
  a sum that do not join all together join per weight they move (`_subgroups`: a
  tp-partial residual stream, attention and MLP);
* a unit dim present on one side and absent on the other (issue 21: one kv head a device
  at tp 8, one batch row a device): pieces broadcast along a dim no operand dim fills, k
  rows each, are the operands given that unit dim (`unsqueezed`, through a concatenation's
  pieces) broadcast to (pieces, k) and merged (the unsqueeze lift, `_lift_movement`); a
  reshape splitting a concatenation at its pieces splits each piece (`reshape_of_concat`);
  an elementwise op of broadcasts none of which fills a dim is the broadcast of the op
  without it (`broadcast_hoisted`: a table rebuilt from copies meets the table computed
  once); heads read at a stride are one strided slice (`_strided_rows`, each piece checked
  to be the candidate's row); pieces of k rows each that join nowhere else are stacked
  along a unit dim and merged (`_stacked_rows`: a GQA backward's per-kv-head sums, the
  reduction then keeping that unit dim before the copies it sums,
  `_reduction_keeping_unit(early=True)`); one-column contractions of two layers join layer
  by layer (`_heads_of_contractions`); commuting operands line up by a concatenation's first piece
  (`_leading`);
* one batch row a device with attention (gap 1, `pipeline_step` at dp 2 with a batch of 2):
  pieces of one row each, reshaped to (tokens, features), stack along their unit row dim
  before their runs join along seq (`_rows_stacked`); reshape pieces whose operands differ
  along one dim join along it (`_uneven_reshapes_joined`: a stage's two layers of heads next
  to one); a sum's parts pair up by the pads and transposes over them (`_moved_by`: rotary
  halves of k and q); contractions of distinct weights join in the order of the weights'
  arguments (`_orders`);
* `blocks_meet` also meets sums over every element across shapes and tiles
  (`_full_sums_meet`, `_tiled_sums_meet`), terms row block by row block where one is
  computed element by element from a concatenation (`_spine_cuts`), and one op over
  operands that meet position by position, a concatenation of pieces against the whole
  they are rows of (`congruent`: pieces whose sums came out signed apart stay a
  concatenation inside a contraction; a product's factors and a sum's parts paired by what
  they are, not by serial; a sum whose contractions joined on one side cut into the other's
  parts, `split_like`).

Since the builders order sums by serial, pieces computed alike can still come out with
different signs; `split_like` / `blocks_meet` (used by the general tier's decision) meet
them the other way: the reference's contraction is cut into the sharded sum's blocks, each
block then built from the same input windows as the sharded part.

`normal_form(term)` rebuilds a term bottom-up through these rules (memoized by serial).

The package, one module per family, each importing only the ones before it: `pieces` (row
slices, windows, the op families named), `squeeze` (unit dims left out), `slices` (slices
taken into reshapes and reductions), `concat` (`make_concat` and its lifts), `sums`
(`join_sums`), `regroup` (dims regrouped through reductions and contractions), `constants`
(constant indices and values), `rewrite` (`normal_form`, node by node), `meet`
(`blocks_meet`, `generic_element`).
"""

from entangle_mlir.core.normal_form.concat import make_concat, update_slice
from entangle_mlir.core.normal_form.meet import blocks_meet, generic_element, split_like
from entangle_mlir.core.normal_form.pieces import slice_term
from entangle_mlir.core.normal_form.rewrite import broadcast_hoisted, normal_form

__all__ = ["blocks_meet", "broadcast_hoisted", "generic_element", "make_concat", "normal_form",
           "slice_term", "split_like", "update_slice"]
