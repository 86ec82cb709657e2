"""The ordered saturating multiply-accumulate (``mac``) and its literal reference.

Semantics (both functions). For every output ``n`` and every leading batch index,
the products ``x[k] * w[n, k]`` are visited in ``order``; after every ``chunk``
consecutive products their exact sum is added to the accumulator, which then
saturates symmetrically to ``acc_bits``: ``acc <- sat(acc + chunk_sum)`` with
``sat(v) = min(max(v, -M), M)``, ``M = 2**(acc_bits-1) - 1``. The accumulator starts
at ``acc0``. Saturation is not associative, so ``order`` and ``chunk`` matter.

How ``mac`` stays exact and fast:

* Fast path: when no prefix of any output can reach the bounds, the result is
  ``acc0 + x . w`` from one integer ``dot_general`` (int32 wrapping arithmetic is
  exact when the true result fits int32). Proofs, cheapest first: the dtype bound
  ``|acc0| <= M - K * max|x*w|`` (made at trace time when ``acc0`` is concrete);
  for ``chunk == 1`` also the weight interval of XS3's ``certify_no_saturation``
  and the data bound ``|acc0| + sum_k |x_k| * max_k |w_nk|``. The (batch, N, K)
  product tensor is never formed.
* Slow path: the chunks are grouped into blocks whose ``sum |products|`` is below
  2**30. ``chunk > 1``: every chunk sum comes from one batched dot, then a clipped
  walk over them (one saturating add per chunk). ``chunk == 1``: per block, if
  ``acc + positive part <= M`` and ``acc - negative part >= -M`` (block sums from two
  dots) nothing in the block can clip and the block sum is added; only the other
  blocks are walked product by product, one column of products at a time. The walk
  keeps ``acc - acc_in`` clipped to bounds clamped at ``+-2**30`` (see ``_walk``), so
  no intermediate wraps and no int64 is needed.
* Routes: integer dots (``route="int"``), or float32 dots at ``precision=HIGHEST``
  on contraction blocks small enough that every partial sum stays below 2**24
  (exact), with block results added in int32 (``route="float"``; the default on
  GPU, where integer dots are slow and TF32 would drop bits).
* ``vmap``: a ``cond`` whose predicate is batched turns into a ``select`` that runs
  both branches, which would cost every vmapped call the slow path. The path choice
  is therefore a ``jax.custom_batching.custom_vmap`` function whose rule folds the
  mapped axis into the rows of ``x`` and ``acc0`` (mac is row-wise, so ``V`` calls on
  ``B`` rows equal one call on ``V * B`` rows) and makes the batch-level proof and one
  guarded dot for all of them; nested ``vmap`` folds again. With ``w`` mapped the rows
  no longer share weights and it falls back to the plain ``vmap`` (exact, both
  branches run).
* Clip counts (``return_clipped``): the fast path is taken only when no step can clip,
  so its counts are zeros; a slow-path block passed by the screen has every prefix
  inside the bounds, so it adds no count; ``_walk`` counts the steps whose unclipped
  value leaves its (possibly clamped) interval, which by its argument happens exactly
  when ``acc + term`` leaves ``[lo, hi]``.
"""

from __future__ import annotations

import functools
from typing import Callable, Literal, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from hwjax.core import _validate as V
from hwjax.core._program import eager_program
from hwjax.core._dot import Route, default_route, exact_dot
from hwjax.core._ops import _SAT_GRADS, unbroadcast, int_bounds, magnitude_bits
from hwjax.errors import RangeError, ShapeError

Order = Union[None, Sequence[int], np.ndarray, Callable[[int], Sequence[int]]]

_I32 = jnp.int32
_UNROLL = 32  # terms per loop body in _walk
_WALK_SPAN = 2**30  # _walk clamps |acc - acc_in| here; a block's sum |products| stays below it


# ------------------------------------------------------------------ argument handling


def _resolve_order(order: Order, k: int, chunk: int) -> np.ndarray:
    """Static visiting order as an int array padded with -1 (empty lane) to a chunk multiple."""
    if order is None:
        o = np.arange(k)
    else:
        if callable(order):
            order = order(k)
        if isinstance(order, jax.core.Tracer):
            raise V.ArgTypeError("order must be static (a NumPy array, list or tuple), not a traced array")
        try:
            o = np.asarray(order)
        except (ValueError, TypeError):
            o = np.asarray(None)
        if o.ndim != 1 or not np.issubdtype(o.dtype, np.integer):
            raise V.ArgTypeError(f"order must be a 1-D sequence of ints, got shape {o.shape} dtype {o.dtype}")
        o = o.astype(np.int64)
        if o.size and (o.min() < -1 or o.max() >= k):
            raise RangeError(f"order entries must lie in [-1, {k - 1}] (-1 = empty lane), got [{o.min()}, {o.max()}]")
        real = o[o >= 0]
        if real.size != k or np.unique(real).size != k:
            raise RangeError(
                f"order must visit every k in [0, {k - 1}] exactly once (plus any number of -1 empty lanes)"
            )
    pad = (-o.size) % chunk
    return np.concatenate([o, -np.ones(pad, np.int64)]) if pad else o


def _dtype_for(a: jax.Array, declared, name: str):
    """Integer dtype that the values of ``a`` are guaranteed to fit."""
    if V.kind(a, name) == "int":
        return np.dtype(a.dtype) if np.dtype(a.dtype) != np.int64 else np.dtype(np.int32)
    try:
        dt = np.dtype(declared if declared is not None else np.int8)
    except TypeError:
        dt = declared
    if dt not in (np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)):
        raise V.ArgTypeError(
            f"{name}_dtype must be one of int8, uint8, int16, uint16 (the integer type "
            f"the float values of {name} represent), got {dt}"
        )
    return dt


# ------------------------------------------------------------------------ dot routes


def _bdot(x: jax.Array, w: jax.Array, route: str, prod_bits: int) -> jax.Array:
    """Exact int32 batched dot: x (B, G, K), w (N, G, K) -> (G, B, N) (:func:`exact_dot`).

    The group axis sits in the middle so the operands need no transpose (XLA:CPU's
    integer batched dot is fast in this layout).
    """
    return exact_dot(x, w, (((2,), (2,)), ((1,), (1,))), route, prod_bits)


def _dot(x: jax.Array, w: jax.Array, route: str, prod_bits: int) -> jax.Array:
    """Exact int32 ``x @ w.T``: x (B, K), w (N, K) -> (B, N). (A plain dot: XLA:CPU reads
    ``w`` as it is; as a batched dot of one group it copied and transposed ``w`` first.)"""
    return exact_dot(x, w, (((1,), (1,)), ((), ())), route, prod_bits)


# --------------------------------------------------------------------- saturating add


def _sat_add(acc: jax.Array, s: jax.Array, lo: int, hi: int) -> jax.Array:
    """``clip(acc + s, lo, hi)`` exactly for int32 ``acc``, ``s`` (no wrap)."""
    r = acc + s
    overflow = ((acc ^ r) & (s ^ r)) < 0
    r = jnp.where(overflow, jnp.where(s > 0, _I32(hi), _I32(lo)), r)
    return jnp.clip(r, _I32(lo), _I32(hi))


def _outside(acc: jax.Array, s: jax.Array, lo: int, hi: int) -> jax.Array:
    """``acc + s`` outside ``[lo, hi]``, exactly for int32 ``acc``, ``s`` (lo >= -2**31 + 1)."""
    r = acc + s
    overflow = ((acc ^ r) & (s ^ r)) < 0
    return overflow | (r < _I32(lo)) | (r > _I32(hi))


def _sum_gt(a: jax.Array, p: jax.Array, bound: int) -> jax.Array:
    """``a + p > bound`` exactly for int32 ``a``, ``p``."""
    r = a + p
    overflow = ((a ^ r) & (p ^ r)) < 0
    return jnp.where(overflow, p > 0, r > _I32(bound))


def _sum_lt(a: jax.Array, p: jax.Array, bound: int) -> jax.Array:
    """``a + p < bound`` exactly for int32 ``a``, ``p``."""
    r = a + p
    overflow = ((a ^ r) & (p ^ r)) < 0
    return jnp.where(overflow, p < 0, r < _I32(bound))


def _abs_widened(a: jax.Array) -> jax.Array:
    """|a| in a dtype that holds it (int8 -> int16, int16 -> int32)."""
    wider = {np.dtype(np.int8): jnp.int16, np.dtype(np.int16): _I32}.get(np.dtype(a.dtype))
    return jnp.abs(a.astype(wider)) if wider is not None else a


# -------------------------------------------------------------------------- the paths


def _fast_bound_ok(acc0, x, w, hi, x_range, exact_weights=False):
    """Conservative float32 proof that no prefix of any output can leave [-hi, hi].

    Used when the static bound ``K * max|x*w|`` alone is too large. An output is proven
    safe by either of two interval bounds on every partial sum of its products (any
    subset, hence any order and chunking):

    * data: ``sum_k |x_bk| * max_k |w_nk|`` (needs the inputs);
    * weights (``certify``-style): partial sums lie in
      ``[sum_k min(0, w*lo, w*hi), sum_k max(0, w*lo, w*hi)]`` for inputs in the
      dtype range ``[lo, hi]``.

    ``exact_weights=True`` (the caller knows ``K * max|x*w| <= hi``) sums the weight
    interval exactly in int32; otherwise, and for the data bound, float32 sums carry a
    relative safety margin, so rounding can only make the proof fail, never pass wrongly.
    """
    margin, limit = 1.0 + 2.0**-16, hi * (1.0 - 2.0**-16)
    a = acc0.astype(jnp.float32)
    if exact_weights:
        wi = w.astype(_I32)
        lo_p, hi_p = wi * x_range[0], wi * x_range[1]
        up = jnp.maximum(0, jnp.maximum(lo_p, hi_p)).sum(axis=-1, dtype=_I32)[None, :]
        down = jnp.minimum(0, jnp.minimum(lo_p, hi_p)).sum(axis=-1, dtype=_I32)[None, :]
        by_weights = ~_sum_gt(acc0, up, hi) & ~_sum_lt(acc0, down, -hi)
    else:
        wf = w.astype(jnp.float32)
        lo_p, hi_p = wf * x_range[0], wf * x_range[1]
        up = jnp.maximum(0.0, jnp.maximum(lo_p, hi_p)).sum(axis=-1) * margin  # (N,)
        down = jnp.minimum(0.0, jnp.minimum(lo_p, hi_p)).sum(axis=-1) * margin  # (N,), <= 0
        by_weights = (a + up[None, :] < limit) & (a + down[None, :] > -limit)
    sx = jnp.abs(x.astype(_I32)).sum(axis=-1, dtype=_I32).astype(jnp.float32)  # (B,)
    wm = jnp.abs(w.astype(_I32)).max(axis=-1).astype(jnp.float32)  # (N,)
    by_data = (sx[:, None] * wm[None, :]) * margin + jnp.abs(a) * margin < limit
    return jnp.all(by_weights | by_data)


def _block_layout(order: np.ndarray, k: int, chunk: int, prod_bits: int) -> np.ndarray:
    """Static gather indices (blocks, chunks per block, chunk) into x/w padded with a zero at ``k``.

    Chunks per block: sum |products| of a block <= 2**30 - 1, or one chunk of at most
    2**30 (when ``chunk * 2**prod_bits == 2**30``), so block sums, the screening dots and
    ``_walk`` fit int32. ``chunk > 1``: as many chunks per block
    as that allows (the chunk sums come from one batched dot anyway). ``chunk == 1``:
    about 256 products per block, the granularity at which blocks are screened.
    """
    idx = np.where(order < 0, k, order)
    n_chunks = idx.size // chunk
    max_cpb = max(1, (_WALK_SPAN - 1) // (chunk << prod_bits))
    cpb = max(1, min(max_cpb, 256 if chunk == 1 else n_chunks, n_chunks))
    nb = -(-n_chunks // cpb)
    cpb = -(-n_chunks // nb)
    pad = nb * cpb * chunk - idx.size
    return np.concatenate([idx, np.full(pad, k)]).reshape(nb, cpb, chunk).astype(np.int32)


def _is_contiguous(idx: np.ndarray, k: int) -> bool:
    """True when the layout visits 0, 1, ..., k-1 in order followed only by empty lanes,
    so reshaping (and zero-padding) x and w replaces the gather."""
    flat = idx.ravel()
    return bool(np.array_equal(flat[:k], np.arange(k)) and np.all(flat[k:] == k))


def _walk(a: jax.Array, term, items, lo: int, hi: int, count: jax.Array | None = None, unroll: int = _UNROLL):
    """``acc <- clip(acc + term(item_j), lo, hi)`` for every j in order, from ``acc = a``; exact.

    ``items`` is a pytree of arrays whose leading axis is j; ``a`` lies in
    ``[lo - 1, hi]``; the int32 terms of one call satisfy ``sum_j |term_j| <= 2**30 - 1``,
    or there is a single term with ``|term| <= 2**30`` (the block layout guarantees
    one of the two). The state is ``d = acc - a``, clipped to
    ``[max(lo - a, -2**30), min(hi - a, 2**30)]``. No intermediate wraps: ``|d| <= 2**30``
    and ``|d + term| <= 2**31 - 1``. A bound clamped to ``+-2**30`` never changes the
    walk: without touching the other bound, ``|d| = |prefix sum| <= 2**30 - 1``; after
    touching it (at most 1 beyond zero, for ``a = lo - 1``), the walk moves at most
    ``sum |terms| <= 2**30 - 1`` from there, so ``d + term`` never exceeds a clamped
    bound (it can equal it). So this is the saturating recurrence itself, touching
    either bound any number of times.

    ``count`` (int32, broadcastable to ``a``): when given, returns ``(acc, count + c)``
    where ``c`` counts the steps whose ``d + term`` lies strictly outside the clip
    interval. By the argument above that happens exactly when ``acc + term`` lies
    outside ``[lo, hi]`` (a clamped bound is never crossed), i.e. when the step's
    saturation changed the value.

    One state array (two when counting), so each loop body is a single XLA fusion.
    ``unroll`` consecutive terms are written out per body, so the (B, N) state is read
    and written once per ``unroll`` terms (measured on XLA:CPU: 16 and 64 no faster than
    32). A version that carried the prefix sum with its running max and min for a
    closed-form reflection was 1.6x slower: XLA:CPU split it into three fusions, each
    recomputing the products.
    """
    span = _I32(_WALK_SPAN)
    upper = jnp.where(a < _I32(hi - _WALK_SPAN), span, _I32(hi) - a)
    lower = jnp.where(a > _I32(lo + _WALK_SPAN), -span, _I32(lo) - a)
    n = jax.tree.leaves(items)[0].shape[0]
    counting = count is not None

    def run(state, block):
        d, c = state if counting else (state, None)
        for u in range(jax.tree.leaves(block)[0].shape[0]):
            v = d + term(jax.tree.map(lambda t: t[u], block))
            if counting:
                c = c + ((v > upper) | (v < lower)).astype(_I32)
            d = jnp.clip(v, lower, upper)
        return ((d, c) if counting else d), None

    u = min(unroll, n)
    full = n // u
    d = jnp.zeros(a.shape, _I32)
    state = (d, jnp.broadcast_to(count, a.shape).astype(_I32)) if counting else d
    if full > 1:
        blocks = jax.tree.map(lambda v: v[: full * u].reshape((full, u) + v.shape[1:]), items)
        state = jax.lax.scan(run, state, blocks)[0]
    elif full == 1:
        state = run(state, jax.tree.map(lambda v: v[:u], items))[0]
    if n > full * u:
        state = run(state, jax.tree.map(lambda v: v[full * u :], items))[0]
    if counting:
        return a + state[0], state[1]
    return a + state


def _fold_blocks(block, acc0, items):
    """``acc <- block(acc, items[i])`` over the leading (block) axis of ``items``."""
    if jax.tree.leaves(items)[0].shape[0] == 1:
        return block(acc0, jax.tree.map(lambda a: a[0], items))
    return jax.lax.scan(lambda a, it: (block(a, it), None), acc0, items)[0]


def _laid_out(x: jax.Array, idx: np.ndarray | jax.Array, contiguous: bool) -> jax.Array:
    """``x`` (R, K) arranged as (R, *idx.shape) along ``idx`` (index K = a zero lane)."""
    r, k = x.shape
    if contiguous:
        xz = jnp.pad(x, ((0, 0), (0, idx.size - k)))
        return xz.reshape((r,) + tuple(idx.shape))
    xz = jnp.concatenate([x, jnp.zeros((r, 1), x.dtype)], axis=-1)
    # A gather fused into a dot operand makes XLA:CPU fall back to a slow dot emitter
    # (measured 8x slower): materialise it.
    return jax.lax.optimization_barrier(xz[:, idx])


def _slow(acc0, x, w, idx, lo, hi, route, prod_bits, contiguous, clipped=False):
    """The saturating recurrence, exactly, without a per-product scan where avoidable.

    ``acc0`` has the output shape (B, N). Returns the accumulators, or with
    ``clipped=True`` the pair (accumulators, number of clipping steps per output).
    """
    b, n = acc0.shape
    nb, cpb, chunk = idx.shape
    zero = jnp.zeros((b, n), _I32) if clipped else None
    carry0 = (acc0, zero) if clipped else acc0
    if chunk > 1:  # every chunk sum from one batched dot, then a clipped walk per block
        xg = _laid_out(x, idx.reshape(nb * cpb, chunk), contiguous)
        wg = _laid_out(w, idx.reshape(nb * cpb, chunk), contiguous)
        cs = _bdot(xg, wg, route, prod_bits).reshape(nb, cpb, b, n)
        if clipped:
            return _fold_blocks(lambda st, c: _walk(st[0], lambda t: t, c, lo, hi, count=st[1]), carry0, cs)
        return _fold_blocks(lambda a, c: _walk(a, lambda t: t, c, lo, hi), acc0, cs)
    # chunk == 1: blocks of products, screened by their sums of positive and negative
    # products; only blocks in which some output may clip are resolved product by product.
    xf = _laid_out(x, idx[..., 0], contiguous)  # (B, nb, cpb)
    wf = _laid_out(w, idx[..., 0], contiguous)  # (N, nb, cpb)
    sums = _bdot(xf, wf, route, prod_bits)  # (nb, B, N) block sums
    # sum |products| on the exact float route (block sums of at most 2**24 need one f32
    # dot; wider ones fall back to integers): an int16 |x| dot is 1.5x slower on XLA:CPU.
    mags = _bdot(_abs_widened(xf), _abs_widened(wf), "float", prod_bits)
    # mag >= |s| and mag <= 2**30: mag - s lies in [0, 2**31], exact in uint32.
    diff = jax.lax.bitcast_convert_type(mags, jnp.uint32) - jax.lax.bitcast_convert_type(sums, jnp.uint32)
    negs = (diff >> 1).astype(_I32)  # per block: sum of |negative products|
    poss = mags - negs  # per block: sum of positive products
    rows = (xf.transpose(1, 2, 0), wf.transpose(1, 2, 0))  # (nb, cpb, B), (nb, cpb, N)

    def block(carry, item):
        a = carry[0] if clipped else carry
        (xr, wr), s, pos, neg = item
        # Safe block: every prefix stays in [lo, hi] (a = lo - 1 is always risky), so
        # no step clips and the block sum is exact.
        risky = _sum_gt(a, pos, hi) | _sum_lt(a, -neg, lo)

        def fine(_):  # products formed one column at a time, never as a (B, N, K) tensor
            prod = lambda r: r[0].astype(_I32)[:, None] * r[1].astype(_I32)[None, :]
            return _walk(a, prod, (xr, wr), lo, hi, count=carry[1] if clipped else None)

        def coarse(_):
            return (a + s, carry[1]) if clipped else a + s

        return jax.lax.cond(jnp.any(risky), fine, coarse, None)

    return _fold_blocks(block, carry0, (rows, sums, poss, negs))


def _acc0_within(acc0: jax.Array, margin: int) -> jax.Array:
    """``all(|acc0| <= margin)`` (margin >= 0), without forming ``|acc0|`` (no -2**31 wrap).

    One reduction, not a max and a min: on XLA:CPU each reduction to a scalar costs a
    fixed ~25 us, more than the element-wise work on a (256, 64) array.
    """
    return ~jnp.any((acc0 > _I32(margin)) | (acc0 < _I32(-margin)))


def _mac_paths(acc0, x, w, idx, *, lo, hi, route, prod_bits, contiguous, clipped):
    """The path choice for one batch: acc0 (1|B, 1|N) int32, x (B, K), w (N, K), idx (nb, cpb, chunk).

    Which path: the fast path when ``|acc0| <= hi - K * max|x*w|`` (one reduction over
    ``acc0``). Otherwise, for ``chunk == 1``, the interval proof of ``_fast_bound_ok``
    (it costs about one dot and saves a slow path of about ten); for ``chunk > 1`` the
    slow path directly, since it costs about two dots, less than the proof and a dot.
    Every proof covers the whole batch at once, so one ``cond`` picks one path for it.
    """
    shape = (x.shape[0], w.shape[0])

    def fast(_):
        y = acc0 + _dot(x, w, route, prod_bits)
        return (y, jnp.zeros(shape, _I32)) if clipped else y

    def slow(_):
        return _slow(jnp.broadcast_to(acc0, shape), x, w, idx, lo, hi, route, prod_bits, contiguous, clipped)

    total = x.shape[1] << prod_bits  # static bound on sum_k |x_k * w_nk|
    if idx.shape[2] > 1:
        return jax.lax.cond(_acc0_within(acc0, hi - total), fast, slow, None) if total <= hi else slow(None)
    tight = lambda _: _fast_bound_ok(acc0, x, w, hi, V.int_range(x.dtype), exact_weights=total <= hi)
    ok = jax.lax.cond(_acc0_within(acc0, hi - total), lambda _: True, tight, None) if total <= hi else tight(None)
    return jax.lax.cond(ok, fast, slow, None)


def _merge_rows(a: jax.Array, batched: bool, v: int, rows: int, keep_single: bool) -> jax.Array:
    """A per-call (r, c) operand (r in {1, rows}) as rows of the merged (v * rows, c) call.

    ``batched``: ``a`` is (v, r, c). ``keep_single``: an unbatched operand with r = 1
    stays (1, c) and broadcasts over the merged rows (for ``acc0``, not ``x``).
    """
    if not batched:
        if a.shape[0] == 1 and keep_single:
            return a
        a = jnp.broadcast_to(a[None], (v,) + a.shape)
    return jnp.broadcast_to(a, (v, rows, a.shape[-1])).reshape(v * rows, a.shape[-1])


@functools.lru_cache(maxsize=None)
def _batched_paths(lo, hi, route, prod_bits, contiguous, clipped):
    """``_mac_paths`` as a ``custom_vmap`` function that keeps its fast paths under ``vmap``.

    Under ``vmap`` a ``cond`` with a batched predicate becomes a ``select`` that runs
    both branches. The rule instead folds the mapped axis into the row axis: mac is
    row-wise (output ``(b, n)`` depends on row ``b`` of ``x`` and ``acc0`` and on ``w``
    only), so ``V`` calls on ``(B, K)`` rows equal one call on ``(V * B, K)`` rows, where
    the batch-level proofs pick one path for all ``V * B`` rows (the slow path when any
    row may clip; it is exact for every row). The rule calls this same function, so
    nested ``vmap`` folds again. When ``w`` (or ``idx``) is mapped, rows no longer share
    weights: it falls back to the plain ``vmap`` of ``_mac_paths`` (exact; both branches
    of each ``cond`` run).
    """
    static = dict(lo=lo, hi=hi, route=route, prod_bits=prod_bits, contiguous=contiguous, clipped=clipped)
    impl = functools.partial(_mac_paths, **static)
    f = jax.custom_batching.custom_vmap(lambda acc0, x, w, idx: impl(acc0, x, w, idx))

    @f.def_vmap
    def rule(axis_size, in_batched, acc0, x, w, idx):
        ab, xb, wb, ib = in_batched
        if wb or ib or not (ab or xb):
            out = jax.vmap(impl, in_axes=tuple(0 if t else None for t in in_batched))(acc0, x, w, idx)
            return out, jax.tree.map(lambda _: True, out)
        rows = x.shape[-2]
        ym = f(_merge_rows(acc0, ab, axis_size, rows, True), _merge_rows(x, xb, axis_size, rows, False), w, idx)
        out = jax.tree.map(lambda y: y.reshape((axis_size, rows) + y.shape[1:]), ym)
        return out, jax.tree.map(lambda _: True, out)

    return f


@functools.partial(jax.jit, static_argnames=("lo", "hi", "route", "prod_bits", "proved", "contiguous", "clipped"))
def _mac_int(acc0, x, w, idx, *, lo, hi, route, prod_bits, proved=False, contiguous=False, clipped=False):
    """acc0 broadcastable to (B, N) int32, x (B, K), w (N, K) integer, idx from _block_layout.

    ``idx`` is traced, so calls that differ only in ``order`` share one compilation.
    ``proved=True``: the caller showed at trace time that nothing can clip.
    ``contiguous=True``: ``idx`` is the ascending order (see ``_is_contiguous``).
    ``clipped=True``: returns ``(acc, clip counts)``. The paths: ``_mac_paths``, through
    ``_batched_paths`` so that they survive ``vmap``.
    """
    shape = (x.shape[0], w.shape[0])
    if idx.size == 0 or proved:  # no chunk at all, or nothing can clip: no cond needed
        y = jnp.broadcast_to(acc0, shape) if idx.size == 0 else acc0 + _dot(x, w, route, prod_bits)
        return (y, jnp.zeros(shape, _I32)) if clipped else y
    f = _batched_paths(lo, hi, route, prod_bits, contiguous, clipped)
    return f(acc0, x, w, idx)


# ----------------------------------------------------------------------- public API


def _prepare(acc0, x, w, order, chunk, acc_bits, x_dtype, w_dtype):
    chunk = V.check_static_int(chunk, 1, 2**20, "chunk")
    acc_bits = V.check_static_int(acc_bits, 2, 32, "acc_bits")
    x, w, acc0 = V.as_array(x, "x"), V.as_array(w, "w"), V.as_array(acc0, "acc0")
    for a, name in ((x, "x"), (w, "w"), (acc0, "acc0")):
        V.kind(a, name)  # wrong types are reported before wrong shapes
    if w.ndim != 2:
        raise ShapeError(f"w must have shape (N, K), got {w.shape}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ShapeError(f"x must have shape (..., K) with K = w.shape[1] = {w.shape[1]}, got {x.shape}")
    out_shape = x.shape[:-1] + (w.shape[0],)
    try:
        if jnp.broadcast_shapes(acc0.shape, out_shape) != out_shape:
            raise ValueError
    except ValueError:
        raise ShapeError(f"acc0 of shape {acc0.shape} must broadcast to the output shape {out_shape}") from None
    xd, wd = _dtype_for(x, x_dtype, "x"), _dtype_for(w, w_dtype, "w")
    for a, dt, name in ((x, xd, "x"), (w, wd, "w")):
        if magnitude_bits(dt) > 16:
            raise V.ArgTypeError(
                f"{name} must hold values of at most 16 bits (int8, uint8, int16, uint16); "
                f"got {dt}: products of wider operands are not exact in 32 bits"
            )
        if V.kind(a, name) == "float":
            V.check_integral(a, name)
            V.check_range(a, *V.int_range(dt), f"{name} (declared {dt})")
    prod_bits = magnitude_bits(xd) + magnitude_bits(wd)
    if prod_bits > 30 or chunk * 2**prod_bits > 2**30:
        raise RangeError(
            f"chunk={chunk} with {xd} x {wd} products: a chunk sum can reach "
            f"{chunk} * 2**{prod_bits} > 2**30, which is not exact in 32 bits; "
            f"use a smaller chunk or narrower operands"
        )
    lo, hi = int_bounds(acc_bits, True)
    if V.kind(acc0, "acc0") == "float":
        V.check_integral(acc0, "acc0")
    V.check_range(acc0, lo - 1, hi, f"acc0 (acc_bits={acc_bits})")
    o = _resolve_order(order, w.shape[1], chunk)
    return acc0, x, w, o, chunk, lo, hi, xd, wd, prod_bits, out_shape


def _acc0_2d(acc0: jax.Array, out_shape: tuple[int, ...]) -> jax.Array:
    """acc0 as (1, 1), (1, N) or (B, N): kept small when it does not vary over the batch."""
    n = out_shape[-1]
    if acc0.size == 1:
        return acc0.reshape(1, 1)
    if acc0.size == n and acc0.shape[-1] == n:
        return acc0.reshape(1, n)
    return jnp.broadcast_to(acc0, out_shape).reshape(-1, n)


_check_flag = V.check_flag


@functools.lru_cache(maxsize=None)
def _mac_float(idx_bytes, idx_shape, lo, hi, route, prod_bits, xd, wd, saturation_grad, clipped):
    idx = np.frombuffer(idx_bytes, np.int32).reshape(idx_shape)

    def ints(acc0, x, w):
        return _mac_int(
            acc0.astype(_I32),
            x.astype(xd),
            w.astype(wd),
            idx,
            lo=lo,
            hi=hi,
            route=route,
            prod_bits=prod_bits,
            contiguous=_is_contiguous(idx, x.shape[-1]),
            clipped=clipped,
        )

    def out_dtype(*arrays):
        return jnp.result_type(*[a.dtype for a in arrays if jnp.issubdtype(a.dtype, jnp.floating)])

    def forward(acc0, x, w):
        r = ints(acc0, x, w)
        y, c = r if clipped else (r, None)
        yf = y.astype(out_dtype(acc0, x, w))
        return ((yf, c) if clipped else yf), (y == hi) | (y == lo)

    @jax.custom_vjp
    def f(acc0, x, w):
        return forward(acc0, x, w)[0]

    def fwd(acc0, x, w):
        out, at_bound = forward(acc0, x, w)
        return out, (acc0, x, w, at_bound)

    def bwd(res, g):
        acc0, x, w, at_bound = res
        if clipped:
            g = g[0]  # the clip counts are integers: no cotangent flows from them
        if saturation_grad == "zero":
            g = jnp.where(at_bound, jnp.zeros_like(g), g)

        def ct(a, val):
            return (
                unbroadcast(val, a.shape).astype(a.dtype)
                if jnp.issubdtype(a.dtype, jnp.floating)
                else np.zeros(a.shape, jax.dtypes.float0)
            )

        gx = g @ w.astype(g.dtype)
        gw = g.T @ x.astype(g.dtype)
        return ct(acc0, g), ct(x, gx), ct(w, gw)

    f.defvjp(fwd, bwd)
    return f


def mac(
    acc0,
    x,
    w,
    *,
    order: Order = None,
    chunk: int = 1,
    acc_bits: int = 32,
    route: Route = "auto",
    x_dtype=None,
    w_dtype=None,
    saturation_grad: Literal["zero", "pass"] = "zero",
    return_clipped: bool = False,
):
    """Ordered saturating multiply-accumulate, exact.

    For each output ``n`` (and each leading batch index): start at ``acc0[..., n]``;
    visit the products ``x[..., k] * w[n, k]`` in ``order``; after every ``chunk``
    consecutive products add their exact sum to the accumulator and saturate it to
    ``[-M, M]``, ``M = 2**(acc_bits-1) - 1``. ``chunk=1`` saturates after every
    product (XS3 VLMACC), ``chunk=32`` once per 32-product instruction (VLMACCR).

    Args:
      acc0: initial accumulators, broadcastable to ``x.shape[:-1] + (N,)``; values in
        ``[-M-1, M]`` (e.g. an int32 bias).
      x: (..., K) inputs: int8/uint8/int16/uint16, or floats holding integers of
        ``x_dtype`` (default int8).
      w: (N, K) weights, same rules (``w_dtype``).
      order: static visiting order: a permutation of ``range(K)``, optionally with
        ``-1`` entries (empty lanes contributing 0, so chunks can be padded to model
        tails and varying chunk sizes), or a callable ``order(K)`` returning one.
        Default: ascending ``k``. The sequence is padded with empty lanes to a
        multiple of ``chunk``.
      chunk: products per saturation step; ``chunk * max|x*w|`` must be <= 2**30.
      acc_bits: accumulator width, 2..32.
      route: ``"int"`` (integer dots), ``"float"`` (exact float32 dots on <= 2**24
        partial sums, HIGHEST precision; used only when every product fits 24 bits,
        e.g. 8-bit x 8-bit or 16-bit x 8-bit, otherwise integer dots) or ``"auto"``
        (float on GPU, int elsewhere). All routes give identical results.
      x_dtype, w_dtype: for float inputs, the integer dtype their values represent
        (checked when concrete); ignored for integer inputs.
      saturation_grad: ``"zero"`` (default) or ``"pass"``; see Gradient.
      return_clipped: also return the clip counts (static bool).

    Returns:
      ``acc``: int32 array of shape ``x.shape[:-1] + (N,)`` (float dtype for float
      inputs). With ``return_clipped=True``, the pair ``(acc, clipped)``: ``clipped``
      is an int32 array of the same shape counting, per output, the saturation steps
      (one per chunk, empty chunks included) whose unsaturated value
      ``acc + chunk_sum`` lay outside ``[-M, M]``, i.e. the steps at which saturation
      changed the accumulator. 0 means the result equals the unsaturated
      ``acc0 + sum_k x_k * w_nk``; an output can clip and still end inside the bounds,
      and ``acc0 = -M-1`` counts once at the first step (which lifts it to ``-M`` or
      above). Identical on every path and route.

    Gradient (float inputs): that of the linear function ``acc0 + x @ w.T``
    (``d/dx = g @ w``, ``d/dw = g.T @ x``, ``d/dacc0 = g``), with ``g`` set to 0 for
    outputs whose final value is at a saturation bound (``saturation_grad="zero"``).
    The clip counts carry no gradient.

    Works under ``jit``, ``vmap`` (nested too) and ``grad``. Under ``vmap`` with ``w``
    not mapped, the mapped calls run as one call on all their rows, so saturation-free
    batches keep the single-dot fast path; with ``w`` mapped, both paths run and the
    result is selected (same values, slower).
    """
    route = default_route(route)
    clipped = _check_flag(return_clipped, "return_clipped")
    # acc0's values when known now (a NumPy or Python constant stays known inside jit,
    # where any jnp operation on it would make it a tracer): they can prove the fast path
    acc0_known = None if isinstance(acc0, jax.core.Tracer) else acc0
    V.check_choice(saturation_grad, _SAT_GRADS, "saturation_grad")
    acc0, x, w, o, chunk, lo, hi, xd, wd, prod_bits, out_shape = _prepare(
        acc0, x, w, order, chunk, acc_bits, x_dtype, w_dtype
    )
    k = w.shape[1]
    idx = _block_layout(o, k, chunk, prod_bits)
    if "float" in (V.kind(x, "x"), V.kind(w, "w"), V.kind(acc0, "acc0")):
        f = _mac_float(idx.tobytes(), idx.shape, lo, hi, route, prod_bits, xd, wd, saturation_grad, clipped)
        return jax.tree.map(lambda t: t.reshape(out_shape), f(_acc0_2d(acc0, out_shape), x.reshape((-1, k)), w))
    total = k << prod_bits  # static bound on any prefix sum of products
    proved = (
        acc0_known is not None
        and total <= hi
        and int(np.abs(np.asarray(acc0_known, np.int64)).max(initial=0)) <= hi - total
    )
    return _mac_call(
        acc0,
        x,
        w,
        idx,
        lo=lo,
        hi=hi,
        route=route,
        prod_bits=prod_bits,
        proved=proved,
        contiguous=_is_contiguous(idx, k),
        clipped=clipped,
        xd=xd,
        wd=wd,
    )


@eager_program(static_argnames=("lo", "hi", "route", "prod_bits", "proved", "contiguous", "clipped", "xd", "wd"))
def _mac_call(acc0, x, w, idx, *, lo, hi, route, prod_bits, proved, contiguous, clipped, xd, wd):
    """:func:`mac`'s integer path after its checks (one program when called eagerly, shared
    by every ``order`` of the same layout shape: ``idx`` is an operand)."""
    k = w.shape[1]
    a2 = _acc0_2d(acc0, x.shape[:-1] + (w.shape[0],))
    y = _mac_int(
        a2.astype(_I32),
        x.reshape((-1, k)).astype(xd),
        w.astype(wd),
        idx,
        lo=lo,
        hi=hi,
        route=route,
        prod_bits=prod_bits,
        proved=proved,
        contiguous=contiguous,
        clipped=clipped,
    )
    return jax.tree.map(lambda t: t.reshape(x.shape[:-1] + (w.shape[0],)), y)


def mac_reference(
    acc0,
    x,
    w,
    *,
    order: Order = None,
    chunk: int = 1,
    acc_bits: int = 32,
    x_dtype=None,
    w_dtype=None,
    return_clipped: bool = False,
):
    """Literal ``lax.scan`` implementation of :func:`mac` (same arguments and result).

    One scan step per visited product: the product is added exactly to the running
    chunk sum; after every ``chunk``-th product the chunk sum is added to the
    accumulator with saturation, and (``return_clipped=True``) the output's clip count
    is incremented when ``acc + chunk_sum`` lies outside ``[-M, M]``. Slow; kept
    public as the executable definition. Not differentiable: float inputs holding
    integers are checked like :func:`mac`'s and give the same int32 result.
    """
    clipped = _check_flag(return_clipped, "return_clipped")
    acc0, x, w, o, chunk, lo, hi, xd, wd, prod_bits, out_shape = _prepare(
        acc0, x, w, order, chunk, acc_bits, x_dtype, w_dtype
    )
    k = w.shape[1]  # (_prepare checked acc0's values: integers within the accumulator's range)
    idx = np.where(o < 0, k, o).astype(np.int32)
    acc, count = _reference_call(acc0, x, w, idx, out_shape=out_shape, chunk=chunk, lo=lo, hi=hi, clipped=clipped)
    return (acc, count) if clipped else acc


@eager_program(static_argnames=("out_shape", "chunk", "lo", "hi", "clipped"))
def _reference_call(acc0, x, w, idx, *, out_shape, chunk, lo, hi, clipped):
    a = jnp.broadcast_to(acc0, out_shape).astype(_I32)
    return _reference_scan(a, x.astype(_I32), w.astype(_I32), idx, chunk=chunk, lo=lo, hi=hi, clipped=clipped)


@functools.partial(jax.jit, static_argnames=("chunk", "lo", "hi", "clipped"))
def _reference_scan(a, x, w, idx, *, chunk, lo, hi, clipped):
    xz = jnp.concatenate([x, jnp.zeros(x.shape[:-1] + (1,), _I32)], axis=-1)
    wz = jnp.concatenate([w, jnp.zeros((w.shape[0], 1), _I32)], axis=-1)
    ends = (jnp.arange(idx.shape[0]) % chunk) == chunk - 1

    def step(carry, item):
        acc, part, count = carry
        kk, end = item
        part = part + xz[..., kk, None] * wz[:, kk]
        if clipped:
            count = count + (end & _outside(acc, part, lo, hi)).astype(_I32)
        acc = jnp.where(end, _sat_add(acc, part, lo, hi), acc)
        part = jnp.where(end, jnp.zeros_like(part), part)
        return (acc, part, count), None

    zero = jnp.zeros_like(a)
    (acc, _, count), _ = jax.lax.scan(step, (a, zero, zero), (idx, ends))
    return acc, count
