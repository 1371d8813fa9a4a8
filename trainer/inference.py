"""A finished run as a classifier: its newest good checkpoint, under the config saved with it."""

import jax
import ml_collections
import numpy as np

from errors import UserError
from trainer import checkpoints
from trainer.checkpoints import Checkpoints, Restored
from trainer.run_setup import make_mesh, predict_logits, state_template
from trainer.storage import RunDirectory


def restore_run(workdir: str) -> tuple[ml_collections.ConfigDict, Restored]:
  """The run's config and its newest checkpoint that restores and verifies, on one device.

  Raises UserError when `workdir` holds no checkpoint, or only damaged ones.
  """
  missing = UserError(f'no checkpoint in {RunDirectory(workdir)}; pass the --workdir of a '
                      'trained run, or train one first: python train.py --config=configs/quick.py '
                      f'--workdir={workdir}')
  flat = checkpoints.saved_config(workdir)
  if flat is None:
    raise missing
  config = checkpoints.config_from_flat(flat)
  config.parallel, config.num_devices = 'jit', 0  # One device here, whatever the run trained on.
  mesh = make_mesh(config)
  with Checkpoints(workdir, config, read_only=True) as saved:
    restored = saved.restore(state_template(config, mesh, steps_per_epoch=1))
  if restored is None:
    raise missing
  return config, restored


def probabilities(config: ml_collections.ConfigDict, restored: Restored,
                  images: np.ndarray) -> np.ndarray:
  """float32 [N, 10] class probabilities of uint8 images [N, 784], by evaluation's forward pass."""
  logits = predict_logits(restored.state, images, config)
  return np.asarray(jax.nn.softmax(logits, axis=1))
