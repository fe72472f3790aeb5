"""What comes from and goes to files: config.json, checkpoints (strict key tables, safetensors,
sentence-transformers), tokenizers, and where a checkpoint is found (docs/architecture.md)."""
