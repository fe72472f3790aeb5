"""The core: pure JAX/Flax computation — the axes and the site table, the Config and Family records, the layers,
the encoder stack, the attention kernels, the hooks protocol, dropout. It imports nothing above it and never the
family registry (docs/architecture.md)."""
