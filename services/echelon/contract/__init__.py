"""The contract's hand-written half, beside the generated `v1`: what both ends agree on."""
