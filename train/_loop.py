"""Jitted training, calibration and statistics for hwjax models (float or hardware mode)."""

from __future__ import annotations

import functools

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hwjax.nn as hn


def make_optimizer(name: str, lr: float, steps: int) -> optax.GradientTransformation:
    """``optax.<name>`` with a cosine-decayed learning rate over ``steps`` steps."""
    fn = getattr(optax, name, None)
    if fn is None or not callable(fn):
        raise ValueError(f"unknown optax optimiser {name!r} (e.g. adam, adamw, sgd, lion)")
    schedule = optax.cosine_decay_schedule(lr, max(1, steps), alpha=0.05)
    try:
        return fn(learning_rate=schedule)
    except TypeError as e:
        raise ValueError(f"optax.{name} is not an optimiser taking a learning rate: {e}") from None


def _batches(n: int, batch_size: int, rng: Optional[np.random.Generator], drop_last: bool):
    idx = rng.permutation(n) if rng is not None else np.arange(n)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    for s in range(0, stop, batch_size):
        yield idx[s : s + batch_size]


def make_step(graphdef, tx: optax.GradientTransformation) -> Callable:
    """The pure training step ``step(params, opt_state, rest, x, y) -> (params, opt_state,
    loss, accuracy)``: softmax cross-entropy of the (dequantised) logits of the model
    ``nnx.merge(graphdef, params, rest)``, one ``value_and_grad`` and one optax update."""

    def loss_fn(params, rest, x, y):
        logits = hn.as_float(nnx.merge(graphdef, params, rest)(x))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == y)

    def step(params, opt_state, rest, x, y):
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc

    return step


@functools.lru_cache(maxsize=32)
def _jitted_step(graphdef, tx: optax.GradientTransformation) -> Callable:
    """The jitted training step of a model structure and optimiser: Trainers of the same
    model and optimiser (a resumed run, a new phase) share one compiled program."""
    return jax.jit(make_step(graphdef, tx), donate_argnums=(0, 1))


class Trainer:
    """Trains a hwjax model in the mode its layers are in (float or hardware).

    The model is split into parameters (``nnx.Param``, including learned scale
    factors) and the rest (calibration ranges); a step is one jitted
    ``value_and_grad`` + optax update on softmax cross-entropy of the (dequantised)
    logits. In hardware mode the forward value is the target's exact integer
    pipeline and the gradient comes from the layers' surrogates. With a ``mesh`` each
    batch is split over all mesh devices (data parallel; the parameters are
    replicated and the gradient is reduced by XLA).
    """

    def __init__(self, model: nnx.Module, tx: optax.GradientTransformation, *, mesh: Optional[Mesh] = None):
        self.model = model
        self.tx = tx
        self.mesh = mesh
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self.params = jax.tree.map(jnp.copy, params)  # the step donates these buffers, not the model's
        self.opt_state = tx.init(self.params)
        self._step = self._build_step()
        # layers that keep host-derived parameters (hwjax.nn.Derived) get them from one eager
        # forward before the first step, so that the jitted step reuses them
        self._derive = any(isinstance(v, hn.Derived) for _, v in nnx.iter_graph(model))

    def _build_step(self) -> Callable:
        if self.mesh is None:
            return _jitted_step(self.graphdef, self.tx)
        step = make_step(self.graphdef, self.tx)
        rep, data = NamedSharding(self.mesh, P()), NamedSharding(self.mesh, P(tuple(self.mesh.axis_names)))
        self.params, self.opt_state, self.rest = jax.device_put((self.params, self.opt_state, self.rest), rep)
        return jax.jit(
            step, in_shardings=(rep, rep, rep, data, data), out_shardings=(rep, rep, rep, rep), donate_argnums=(0, 1)
        )

    @property
    def n_devices(self) -> int:
        return 1 if self.mesh is None else int(self.mesh.devices.size)

    def _fill_derived(self, x: np.ndarray) -> None:
        """One eager forward on a sample of ``x`` with the current parameters: layers that
        derive parameters on the host (:class:`hwjax.nn.Derived`) keep them, and the step
        gets them in its non-trained state."""
        self._derive = False
        if hn.get_mode(self.model) != "hardware":
            return
        self.model(jnp.asarray(x[:1]))  # the model's parameters are those of the first step
        _, _, rest = nnx.split(self.model, nnx.Param, ...)
        self.rest = rest if self.mesh is None else jax.device_put(rest, NamedSharding(self.mesh, P()))

    def step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """One optimiser step on a batch; returns (loss, accuracy) as device scalars."""
        if self._derive:
            self._fill_derived(x)
        self.params, self.opt_state, loss, acc = self._step(self.params, self.opt_state, self.rest, x, y)
        return loss, acc

    def epoch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        batch_size: int,
        rng: np.random.Generator,
        progress: Optional[Callable[[float, float], None]] = None,
    ) -> tuple[float, float]:
        """One pass over shuffled data (last partial batch dropped); mean loss and accuracy."""
        if batch_size % self.n_devices:
            raise ValueError(f"batch_size {batch_size} must be a multiple of the {self.n_devices} devices")
        losses, accs = [], []
        for idx in _batches(len(x), batch_size, rng, drop_last=True):
            loss, acc = self.step(x[idx], y[idx])
            losses.append(loss)
            accs.append(acc)
            if progress is not None:
                progress(float(loss), float(acc))
        self.sync()
        return float(np.mean(jax.device_get(losses))), float(np.mean(jax.device_get(accs)))

    def sync(self) -> None:
        """Writes the trained parameters back into the model."""
        nnx.update(self.model, self.params)


@functools.lru_cache(maxsize=32)
def _calibrate_fn(graphdef) -> Callable:
    """The jitted calibration pass of a model structure (one per structure, not per call)."""

    @jax.jit
    def run(state, xb):
        m = nnx.merge(graphdef, state)
        m(xb)
        return nnx.state(m, hn.Calibration)

    return run


@functools.lru_cache(maxsize=32)
def _stats_fn(graphdef) -> Callable:
    """The jitted statistics pass of a model structure (one per structure, not per call)."""

    @jax.jit
    def run(state, xb):
        return nnx.merge(graphdef, state)(xb, return_stats=True)[1]

    return run


def calibrate(model: nnx.Module, x: np.ndarray, batch_size: int = 256) -> None:
    """Runs ``model`` in calibrate mode over ``x`` (jitted), recording every layer's range."""
    hn.set_mode(model, "calibrate")
    graphdef, state = nnx.split(model)
    run = _calibrate_fn(graphdef)
    for idx in _batches(len(x), batch_size, None, drop_last=False):
        cal = run(state, x[idx])
        nnx.update(model, cal)
        state = nnx.state(model)


def layer_stats(model: nnx.Module, x: np.ndarray, batch_size: int = 1024) -> dict[str, hn.LayerStats]:
    """Per-layer :class:`hwjax.nn.LayerStats` summed over ``x`` (in the model's mode).

    A hardware-mode model is called eagerly on each batch: its parameters are concrete,
    so every layer takes its integer parameters from the target's host recipe and runs
    its jitted kernel, instead of compiling the in-graph recipe into one large program
    (several seconds per model structure). Float and calibrate modes run one jitted pass.
    """
    graphdef, state = nnx.split(model)
    run = (
        _stats_fn(graphdef)
        if hn.get_mode(model) != "hardware"
        else (lambda st, xb: nnx.merge(graphdef, st)(jnp.asarray(xb), return_stats=True)[1])
    )
    total: Optional[dict[str, Any]] = None
    for s in range(0, len(x), batch_size):
        st = run(state, x[s : s + batch_size])
        total = st if total is None else {k: total[k] + v for k, v in st.items()}
    return jax.device_get(total or {})
