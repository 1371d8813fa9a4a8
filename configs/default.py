"""Default: a 784-512-512-10 MLP, dropout and ±1-pixel shifts, AdamW with warmup and cosine decay.

  python train.py --config=configs/default.py            # MNIST's 60,000 training images (TFDS)

Measured on the carried split (append --config.data.source=idx --config.data.dir=data/mnist
--config.data.train_split='test[:8000]' --config.data.eval_split='test[8000:]'): final eval
accuracy 98.55% / 98.30% / 98.60% for seeds 0 / 1 / 2, about 0.3 s per epoch on 2 CPU cores.
The full-dataset run was not measured: this project's machines cannot download it.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The starting point every other config copies and adjusts."""
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.num_epochs = 30
  config.batch_size = 128  # Global: split evenly over devices when data parallel.
  config.eval_batch_size = 1000
  config.optimizer = 'adamw'  # sgd | momentum | adam | adamw
  config.learning_rate = 2e-3
  config.momentum = 0.9  # For optimizer=momentum (Nesterov).
  config.weight_decay = 1e-4  # For optimizer=adamw.
  config.schedule = 'cosine'  # constant | cosine (decays to zero at the last step).
  config.warmup_epochs = 1.0
  config.parallel = 'auto'  # auto | jit | mesh | pmap (auto: mesh when there are several devices).
  config.num_devices = 0  # Devices the run must find, all processes together; 0: those present.
  config.checkpoint_every_epochs = 1  # And always at the end of the run and when stopped by a signal.
  config.max_checkpoints_to_keep = 3
  config.dtype = 'float32'  # float32 | bfloat16 (activations and matmuls; parameters stay float32).
  config.profile_epoch = 0  # Traces this epoch with jax.profiler into the run directory; 0: off.
  config.eval_only = False  # True: evaluate the newest good checkpoint on data.eval_split, no training.

  config.model = ml_collections.ConfigDict()
  config.model.hidden_sizes = (512, 512)
  config.model.dropout_rate = 0.2

  config.data = ml_collections.ConfigDict()
  config.data.source = 'tfds'  # tfds | idx
  config.data.dir = ''  # idx: folder of the .gz files. tfds: optional folder of them for offline use.
  config.data.tfds_data_dir = ''  # Where TFDS keeps prepared data; '' is TFDS's default.
  config.data.train_split = 'train'
  config.data.eval_split = 'test'
  config.data.max_shift = 1  # Training images move by up to this many pixels each way (0: off).
  return config
