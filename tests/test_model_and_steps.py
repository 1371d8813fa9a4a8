"""The MLP, its metrics and one optimizer step, on inputs whose answers are known by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mlp import optim, randomness, steps
from mlp.model import MLP, dropout
from trainer.plan import recipe_of
from trainer.programs import create_state
from tests.conftest import make_config


def test_mlp_output_shape_and_parameter_shapes():
  model = MLP((32, 16), rngs=nnx.Rngs(params=jax.random.key(0)))
  assert model(jnp.ones((5, 28, 28))).shape == (5, 10)
  _, params = nnx.split(model, nnx.Param)
  kernels = [layer.kernel[...].shape for layer in (*model.hidden, model.out)]
  assert kernels == [(784, 32), (32, 16), (16, 10)]
  assert len(jax.tree.leaves(params)) == 6  # A kernel and a bias per layer, nothing else.


def test_dropout_only_changes_training_outputs():
  model = MLP((64,), dropout_rate=0.5, rngs=nnx.Rngs(params=jax.random.key(0)))
  x = jax.random.normal(jax.random.key(1), (4, 784))
  evaluated = [model(x) for _ in range(2)]
  np.testing.assert_array_equal(evaluated[0], evaluated[1])
  trained = [model(x, jax.random.key(k)) for k in (1, 2)]
  assert not np.allclose(trained[0], trained[1])
  np.testing.assert_array_equal(model(x, jax.random.key(1)), trained[0])  # The key decides.


def test_dropout_keeps_the_rounded_fraction_scaled_by_its_inverse_and_follows_its_key():
  x = jnp.ones((256, 512))
  dropped = dropout(x, 0.2, jax.random.key(3))
  kept = np.asarray(dropped) != 0
  assert abs(kept.mean() - 205 / 256) < 0.005  # 131,072 units: 5 standard deviations is 0.0055.
  np.testing.assert_allclose(np.asarray(dropped)[kept], 256 / 205, rtol=1e-6)
  np.testing.assert_array_equal(dropout(x, 0.2, jax.random.key(3)), dropped)
  assert (np.asarray(dropout(x, 0.2, jax.random.key(4))) != 0).tolist() != kept.tolist()
  # Odd sizes take whole words and use the first bytes of them.
  assert dropout(jnp.ones((3, 5)), 0.5, jax.random.key(0)).shape == (3, 5)


def test_bfloat16_computes_in_bfloat16_over_float32_parameters():
  model = MLP((32,), dtype='bfloat16', rngs=nnx.Rngs(params=jax.random.key(0)))
  x = jnp.ones((2, 784))
  graphdef, params = nnx.split(model, nnx.Param)
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  jaxpr = jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(x))(params)
  dots = [e for e in jaxpr.eqns if e.primitive.name == 'dot_general']
  assert len(dots) == 2 and all(e.outvars[0].aval.dtype == jnp.bfloat16 for e in dots)
  assert model(x).dtype == jnp.float32  # The loss sees float32.
  float32 = nnx.merge(nnx.split(MLP((32,), rngs=nnx.Rngs(params=0)))[0], params)
  np.testing.assert_allclose(model(x), float32(x), rtol=0.05, atol=0.05)


def test_batch_metrics_on_hand_computed_logits():
  # Row 0 gives class 1 a logit of log 3, the rest 0: p(class 0) = 1 / (9 + 3), loss log 12, and
  # class 1 wins (a miss). Row 1 is uniform: loss log 10, argmax picks class 0 (a hit).
  logits = jnp.zeros((2, 10)).at[0, 1].set(jnp.log(3.0))
  labels = jnp.array([0, 0])
  sums = steps.batch_metrics(logits, labels)
  np.testing.assert_allclose(sums['loss'], np.log(12.0) + np.log(10.0), rtol=1e-6)
  assert int(sums['correct']) == 1 and int(sums['count']) == 2
  masked = steps.batch_metrics(logits, labels, mask=jnp.array([True, False]))
  np.testing.assert_allclose(masked['loss'], np.log(12.0), rtol=1e-6)
  assert int(masked['correct']) == 0 and int(masked['count']) == 1
  assert (steps.summarize({'loss': 3.0, 'correct': 1, 'count': 4})
          == {'loss': 0.75, 'accuracy': 0.25})


def test_train_step_lowers_the_loss_on_its_batch():
  config = make_config(model__hidden_sizes=(32,), learning_rate=1e-2, warmup_epochs=0,
                       schedule='constant')
  state = create_state(recipe_of(config, (), steps_per_epoch=10), jax.random.key(0))
  batch = {'image': jax.random.normal(jax.random.key(1), (16, 784)),
           'label': jnp.arange(16) % 10}
  losses = []
  for i in range(5):
    keys = jax.random.split(jax.random.key(i), 16)  # One dropout key per example.
    state, sums = jax.jit(steps.train_step)(state, batch, keys)
    losses.append(float(sums['loss']))
  assert int(state.step) == 5
  assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize('name', ['sgd', 'momentum', 'adam', 'adamw'])
def test_every_optimizer_follows_warmup_then_cosine_decay(name):
  config = make_config(optimizer=name, learning_rate=0.1, warmup_epochs=1, num_epochs=4)
  tx = recipe_of(config, (), steps_per_epoch=10).optimizer
  params = {'w': jnp.ones(3)}
  opt_state = tx.init(params)
  sizes = []
  for _ in range(40):
    updates, opt_state = tx.update({'w': jnp.ones(3)}, opt_state, params)
    sizes.append(float(jnp.abs(updates['w'][0])))
  assert sizes[0] == 0.0  # Warmup starts from a zero learning rate.
  assert max(sizes) == pytest.approx(max(sizes[8:12]), rel=0.3)  # Peak at the end of warmup.
  assert sizes[-1] < 0.05 * max(sizes)  # Cosine decay reaches ~0 at the last step.


def test_an_unknown_optimizer_or_schedule_is_refused_by_name_not_trained_as_another():
  """The library's own refusal, for callers that build a run without train.py's checks."""
  with pytest.raises(ValueError, match="optimizer must be one of sgd, momentum, adam, adamw, got "
                                       "'adamx'"):
    optim.make_optimizer('adamx', optax.constant_schedule(1e-3))
  with pytest.raises(ValueError, match="schedule must be one of constant, cosine, got 'linear'"):
    optim.learning_rate_schedule(1e-3, 'linear', 0, 10)


def test_label_smoothing_keeps_its_share_on_the_label_and_spreads_the_rest():
  logits = jnp.zeros((1, 10)).at[0, 3].set(2.0)
  labels = jnp.array([3])
  log_p = jax.nn.log_softmax(logits)[0]
  # Targets: 0.9 + 0.1 / 10 on class 3, 0.1 / 10 on each other class.
  expected = -(0.91 * log_p[3] + 0.01 * (jnp.sum(log_p) - log_p[3]))
  np.testing.assert_allclose(steps.smoothed_losses(logits, labels, 0.1)[0], expected, rtol=1e-6)
  plain = steps.smoothed_losses(logits, labels, 0.0)
  np.testing.assert_array_equal(plain, optax.softmax_cross_entropy_with_integer_labels(logits,
                                                                                       labels))


def test_members_start_as_their_seeds_runs_and_their_ensemble_averages_probabilities():
  recipe = recipe_of(make_config(model__hidden_sizes=(16,)), (), steps_per_epoch=10)
  create = jax.jit(lambda key: create_state(recipe, key))  # Eager initialization takes seconds.
  init_keys, run_keys = randomness.member_keys(np.arange(4, 7, dtype=np.uint32))
  members = create(init_keys)
  assert members.step.shape == (3,)
  for seed in (0, 2**31 - 1, 2**32 - 2):  # Past int32, up to the last seed a config allows.
    for k, key in enumerate(randomness.member_keys(np.array([seed, seed + 1], np.uint32))[1]):
      expected = jax.random.key_data(randomness.run_keys(seed + k)[1])
      assert jax.random.key_data(key).tolist() == expected.tolist()
  for k in range(3):
    init_key, run_key = randomness.run_keys(4 + k)
    assert jax.random.key_data(run_keys[k]).tolist() == jax.random.key_data(run_key).tolist()
    alone = create(init_key)
    for a, b in zip(jax.tree.leaves(alone.params), jax.tree.leaves(members.params)):
      np.testing.assert_array_equal(a, b[k])  # Member k's initialization is seed 4 + k's.
  images = jax.random.normal(jax.random.key(0), (5, 784))
  predict, ensemble_logits = jax.jit(steps.predict_step), jax.jit(steps.ensemble_logits)
  each = [jax.nn.softmax(predict(jax.tree.map(lambda x, k=k: x[k], members), images))
          for k in range(3)]
  ensemble = jax.nn.softmax(ensemble_logits(members, images))
  np.testing.assert_allclose(ensemble, np.mean(each, axis=0), rtol=1e-6, atol=1e-7)
  assert not np.allclose(each[0], each[1])  # Three models, not one.
  lone = create(randomness.run_keys(4)[0])
  # One model: its own logits.
  np.testing.assert_array_equal(ensemble_logits(lone, images), predict(lone, images))
