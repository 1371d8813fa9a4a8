"""Scripts that measure the trainer against the usual per-batch loop and the hardware."""
