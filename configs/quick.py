"""A first run in seconds: the default recipe, shorter, on the MNIST files this project carries.

  python train.py --config=configs/quick.py

Measured on the test set, seeds 0 / 1 / 2: 98.41 / 98.45 / 98.47% (mean 98.44%), 6.1 s launch to
exit on 2 Intel Xeon cores (`python -m benchmarks.recipes --also=configs/fast.py,configs/quick.py`,
2026-11-25).
"""

import ml_collections

from configs import default


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """configs/default.py, shorter: a first look at the real test accuracy."""
  config = default.get_config(splits)
  config.num_epochs = 3
  # Batch 256 trains an epoch about 20% faster on a CPU than 128; on the validation split, 3
  # epochs scored 98.08% at 256 and 98.16% at 128, and 2 epochs at 128 97.87%.
  config.batch_size = 256
  return config
