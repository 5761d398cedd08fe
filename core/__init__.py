"""The shared base under lowering and runtime: the program (parsing, loading, `CocoError`),
value layout across ranks, numerics (rounding, tolerances) and the counter-based RNG.

It imports only the dialects; everything above (passes, lowering, runtime, the front end and
the tools) may import it (test/unit/test_layers.py holds the contract)."""
