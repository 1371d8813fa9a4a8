"""Fast: the default MLP to 99% in under half the default's time, 12 epochs with label smoothing.

  python train.py --config=configs/fast.py               # train on 60,000, score the 10,000 test images
  python train.py --config=configs/fast.py:validation    # train[:50000], score train[50000:]

Chosen on the validation split, seeds 0-2 (docs/fast.md): the fastest recipe tried whose mean
there cleared 99.0% by at least 0.05 points (99.10%). Measured: see README.md's results.
"""

import ml_collections

from configs import default


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """configs/default.py in 12 epochs of 256: smoothed labels instead of dropout, a higher rate."""
  config = default.get_config(splits)
  config.num_epochs = 12
  config.batch_size = 256  # About 20% faster an epoch on a CPU than 128.
  config.learning_rate = 3e-3
  config.model.dropout_rate = 0.0  # With smoothed labels, dropout cost 0.11 points at 12 epochs.
  config.label_smoothing = 0.1  # +0.15 points at 12 epochs with dropout, +0.36 without.
  return config
