"""The run's armour, which the learning code reaches only through the host it is handed: this
process and its one boundary (boundary.py), its exits (exits.py), the table of faults (faults.py),
the other processes (peers.py), the run directory, its lock and Cloud Storage, JAX's backend and
its compilation cache. Nothing here imports the learning code."""
