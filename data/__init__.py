"""MNIST loading: TFDS or canonical IDX files, turned into device-ready uint8 arrays."""
