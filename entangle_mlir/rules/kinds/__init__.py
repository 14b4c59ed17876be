"""Value kinds that cut across op families: halo windows, device blocks, shifted, reordered and
returning values."""
