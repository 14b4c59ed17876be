"""What ops compute, exactly: the executable semantics of StableHLO ops and terms, and the process
groups of collectives as the StableHLO spec defines them."""
