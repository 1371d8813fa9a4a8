"""Model, train state, step functions and the training loop (imports stay light: see mlp/errors.py)."""
