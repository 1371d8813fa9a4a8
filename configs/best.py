"""Best: a 784-1024-1024-10 MLP on randomly distorted digits (affine and elastic), 200 epochs.

  python train.py --config=configs/best.py               # train on 60,000, score the 10,000 test images
  python train.py --config=configs/best.py:validation    # train[:50000], score train[50000:]

Chosen on the validation split (docs/best.md: 99.45%, seed 0). Test accuracy, seeds 0 / 1 / 2:
99.30% / 99.31% / 99.26% (mean 99.29%), 1394-1441 s each on 2 idle CPU cores (seed 0: 1840 s,
tests running beside it): `python -m benchmarks.recipes --config=configs/best.py --recipes=config`.
Short of the 99.4% it aims at: docs/best.md says what to try next.
"""

import ml_collections

from configs import default


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """configs/default.py, wider and longer, on digits distorted anew each epoch."""
  config = default.get_config(splits)
  config.num_epochs = 200
  config.model.hidden_sizes = (1024, 1024)
  config.model.dropout_rate = 0.0  # The distortions regularize enough: validation chose none.
  config.data.max_shift = 0  # The distortion's translation moves digits by any fraction instead.
  config.data.distort.update(rotation=12.0, scale=0.12, shear=8.0, translate=2.0,
                             elastic_alpha=15.0, elastic_sigma=6.0)
  return config
