"""Training inside minibert: the shared optimiser (optim) and, built on it, fine-tuning."""
