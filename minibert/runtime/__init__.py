"""The runtime: the Model users hold, and what it takes to run one — compiled programs and their static keys,
padding and length buckets, host↔device moves, the persistent compilation cache. The core computes; the runtime
compiles (docs/architecture.md)."""
