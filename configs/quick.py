"""A first run in seconds: the default recipe, shorter, on the MNIST files this project carries.

  python train.py --config=configs/quick.py

Measured: see README.md's results.
"""

import ml_collections

from configs import default


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """configs/default.py, shorter: a first look at the real test accuracy."""
  config = default.get_config(splits)
  config.num_epochs = 3
  return config
