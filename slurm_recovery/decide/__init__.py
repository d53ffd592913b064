"""The decision core: evidence in, advice out. Pure functions, no I/O, deterministic."""
