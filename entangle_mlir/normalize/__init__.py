"""Exact rewrites run before the walk: bad-input validation, unit and token dims, numerical idioms,
online softmax and its backward, polynomials, loop unrolling."""
