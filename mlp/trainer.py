"""The training loop: `train_and_evaluate(config, workdir)`, the library entry behind train.py."""

import os
import time

import jax
import ml_collections

from data.mnist import load_split
from mlp import config_checks
from mlp import parallel
from mlp import steps
from mlp.reporting import Reporter


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains for `config.num_epochs` epochs, evaluating after each; returns the last epoch's record."""
  config_checks.validate(config)
  executor = parallel.make_executor(config)  # Checks the devices against the config.
  train_examples = load_split(config.data, config.data.train_split)
  eval_examples = load_split(config.data, config.data.eval_split)
  primary = jax.process_index() == 0  # Only process 0 of a multi-process run writes files and logs.
  if primary:
    os.makedirs(workdir, exist_ok=True)

  steps_per_epoch = len(train_examples) // config.batch_size
  seed_key = jax.random.key(config.seed)
  init_key, run_key = jax.random.split(seed_key)
  state = executor.put_state(steps.create_train_state(config, init_key, steps_per_epoch))
  train_data = executor.put_data(train_examples)
  eval_data = executor.put_data(eval_examples)

  compile_start = time.perf_counter()
  executor.compile(state, train_data, eval_data, run_key)
  reporter = Reporter(workdir, config.num_epochs, enabled=primary)
  reporter.log(f'training on {len(train_examples):,} images ({config.data.train_split}), '
               f'evaluating on {len(eval_examples):,} ({config.data.eval_split}); '
               f'{steps_per_epoch} steps of {config.batch_size} per epoch, {executor.placement}; '
               f'compiled in {time.perf_counter() - compile_start:.1f}s')
  record: dict[str, float] = {}
  try:
    for epoch in range(1, config.num_epochs + 1):
      start = time.perf_counter()
      state, train_sums = executor.train_epoch(state, train_data, run_key, epoch)
      train_metrics = executor.metrics(train_sums)
      train_seconds = time.perf_counter() - start
      eval_metrics = executor.metrics(executor.evaluate(state, eval_data))
      record = {
          'epoch': epoch,
          'train_loss': train_metrics['loss'],
          'train_accuracy': train_metrics['accuracy'],
          'eval_loss': eval_metrics['loss'],
          'eval_accuracy': eval_metrics['accuracy'],
          'epoch_seconds': time.perf_counter() - start,
          'train_images_per_second': steps_per_epoch * config.batch_size / train_seconds,
      }
      reporter.write(record)
  finally:
    reporter.close()
  return record
