"""TPU v3-8: data parallel over its 8 cores with pmap, global batch 1024 (128 per core per step).

  python train.py --config=configs/tpu_v3_8.py              # 60,000 images; scores the 10,000 test
  python train.py --config=configs/tpu_v3_8.py:validation   # train[:50000]; scores train[50000:]

Measured: not run on a TPU by this project (none was available). Its program is the one the tests
run on 8 simulated CPU devices under pmap, where it gives one device's numbers
(tests/test_parallel.py); its recipe is default.py's at batch 1024, with the learning rate chosen
for that batch on the validation split: 99.09% there (seed 0, on CPU, the Linen model; the NNX
model on 8 simulated devices: 99.06%). See docs/parallel.md.

The whole recipe, from a machine with the gcloud CLI. A Spot (or preemptible) TPU VM is deleted
when it is preempted, its disk with it, so the run directory lives in a bucket:

  gcloud storage buckets create gs://BUCKET --location=europe-west4
  gcloud compute tpus tpu-vm create mnist-v3-8 --zone=europe-west4-a --spot \
      --accelerator-type=v3-8 --version=tpu-ubuntu2204-base
  gcloud compute tpus tpu-vm ssh mnist-v3-8 --zone=europe-west4-a

then on the TPU VM, from a copy of this repository (the VM's service account needs the Storage
Object Admin role on the bucket). The image's python3 is 3.10, older than the stack allows, so
first a newer Python, which uv installs as ~/.local/bin/python3.12:

  python3 -m pip install --user uv && ~/.local/bin/uv python install 3.12
  make train PYTHON=$HOME/.local/bin/python3.12 ACCELERATOR=tpu CONFIG=configs/tpu_v3_8.py \\
      ARGS=--workdir=gs://BUCKET/mnist-v3-8

ACCELERATOR=tpu installs jax[tpu] (libtpu) at the version requirements.txt pins, once, with the
environment; after that, `make train` or `.venv/bin/python train.py ...` run the same.

If the VM is preempted, create it again and run the same command: the run resumes from its newest
checkpoint in the bucket, bit for bit as if never stopped. The lost VM's run lock is taken over
once silent for 120 s (--lock_stale_after); a second live run on the bucket is refused in one line.

The run stops with one line if it finds other than 8 devices (num_devices); on a machine without
a TPU add --config.num_devices=0 to run the same config on whatever is present. On a pod slice
(v3-32: 4 hosts of 8 cores) run the same command on every host with --distributed,
--config.parallel=mesh (pmap runs in one process) and --config.num_devices=32, e.g. with
`gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`; every host writes each
checkpoint to the bucket together. Its 1024-image batches divide over 32 cores (tested on 32
simulated devices).

Precision: XLA:TPU runs float32 matmuls as one bfloat16 pass by default; the first line of the
run names it. --config.matmul_precision=high (3 passes) or highest (6 passes, float32 as a CPU
computes it) costs about 3x or 6x the matmul time by XLA's pass count (not measured here).
Delete the VM afterwards: `gcloud compute tpus tpu-vm delete mnist-v3-8 --zone=europe-west4-a`.
"""

import ml_collections

from configs import default


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """The default run, spread over the 8 cores of one TPU v3-8 host."""
  config = default.get_config(splits)
  config.parallel = 'pmap'
  config.num_devices = 8
  # 128 examples per core keeps each core's matrix units busy; an epoch is 58 steps, not 468.
  config.batch_size = 1024
  # Divides over 8 cores and over a pod slice's 32 (v3-32) or more: 1000 would not.
  config.eval_batch_size = 1024
  # Chosen on the validation split (seed 0, 30 epochs, on CPU: the same math): 2e-3 98.89%,
  # 4e-3 98.97%, 6e-3 99.00%, 8e-3 99.09%, 1.1e-2 98.91%, 1.6e-2 98.73% (docs/parallel.md).
  config.learning_rate = 8e-3
  return config
