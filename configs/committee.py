"""Committee: three of configs/best.py's MLPs side by side in one program; their ensemble scores.

  python train.py --config=configs/committee.py              # 60,000 images; scores the 10,000 test
  python train.py --config=configs/committee.py:validation   # train[:50000]; scores train[50000:]

Ciresan et al. (2011) took a committee of seven such MLPs to 99.69%, past the single MLP's 99.65%.
Here the members are seeds 0, 1 and 2 (`num_models`, docs/members.md), each with its seed's own
random draws, and the ensemble is their mean class probabilities. On the validation split
the members scored 99.65 / 99.61 / 99.61% and the ensemble 99.69%; on the test set 99.55 / 99.51 /
99.52% (mean 99.527%) and the ensemble **99.58%**, 332 s from launch to exit on one NVIDIA H200
(jax 0.11.2, CUDA 13; 2026-11-27, docs/best.md), 0.70x three launches of best.py there one after
another. Three members, the size that fit a session's GPU time: no other size was tried. A GPU
recipe, as best.py is: on 2 AMD EPYC cores an epoch takes 92 s (best.py's 30 s), 800 about 20 hours.
"""

import ml_collections

from configs import best


def get_config(splits: str = 'test') -> ml_collections.ConfigDict:
  """configs/best.py, three models side by side."""
  config = best.get_config(splits)
  config.num_models = 3
  return config
