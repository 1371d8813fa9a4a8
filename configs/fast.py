"""Fast: a 784-384-384-10 MLP to 99% in 0.27x the default's time, 13 epochs of 256.

  python train.py --config=configs/fast.py              # 60,000 images; scores the 10,000 test
  python train.py --config=configs/fast.py:validation   # train[:50000]; scores train[50000:]

Chosen on the validation split, seeds 0-2 (docs/fast.md): the fastest recipe tried whose mean
there cleared 99.0% by at least 0.05 points (99.07%). On the test set, seeds 0 / 1 / 2: 99.17 /
99.22 / 99.01% (mean 99.13%), 12.9 s launch to exit against the default's 47.2 s, on 2 Intel Xeon
cores (`python -m benchmarks.recipes --also=configs/fast.py,configs/quick.py`, 2026-11-25).
"""

import ml_collections

from configs import default


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """configs/default.py narrower and in 13 epochs of 256: smoothed labels instead of dropout."""
  config = default.get_config(splits)
  config.num_epochs = 13
  config.batch_size = 256  # About 20% faster an epoch on a CPU than 128.
  config.learning_rate = 3e-3
  # 0.70x the default width's time an epoch; 13 epochs of it scored 0.03 points below 12 of 512-512
  # on validation.
  config.model.hidden_sizes = (384, 384)
  # With smoothed labels, dropout cost 0.11 points at 12 epochs of 512-512.
  config.model.dropout_rate = 0.0
  config.label_smoothing = 0.1  # At 12 epochs of 512-512: +0.15 points with dropout, +0.36 without.
  return config
