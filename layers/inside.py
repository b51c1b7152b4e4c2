"""Public entry points of the DP: ``log_partition`` and ``max_score``."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from layers.alphabet import NUM_TOKENS
from layers.chart import inside_charts_from_scores, inside_from_scores

PARAM_SHAPES = {
    "stack": (NUM_TOKENS,) * 4,
    "pair": (NUM_TOKENS,) * 2,
    "unpaired": (NUM_TOKENS,),
    "loop": (),
}


def check_params(params: Mapping) -> dict:
    """Returns the four score tensors as a dict; raises a clear error on a bad one."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping with keys {sorted(PARAM_SHAPES)}, got {type(params).__name__}")
    missing = [k for k in PARAM_SHAPES if k not in params]
    if missing:
        raise KeyError(f"params is missing {missing}; expected keys {sorted(PARAM_SHAPES)}")
    out = {}
    for name, shape in PARAM_SHAPES.items():
        value = params[name]
        value = getattr(value, "value", value)  # accept nnx.Param leaves directly
        if jnp.shape(value) != shape:
            raise ValueError(f"params[{name!r}] must have shape {shape}, got {jnp.shape(value)}")
        value = jnp.asarray(value)
        if not jnp.issubdtype(value.dtype, jnp.floating):
            value = value.astype(jnp.float32)
        out[name] = value
    return out


def _result_dtype(params):
    return jnp.result_type(*(params[k] for k in PARAM_SHAPES))


def _is_concrete(x):
    return not isinstance(x, jax.core.Tracer)


def _check_inputs(tokens, lengths, phi, min_hairpin):
    if not isinstance(min_hairpin, (int, np.integer)) or isinstance(min_hairpin, bool) or min_hairpin < 0:
        raise ValueError(f"min_hairpin must be a non-negative int (static), got {min_hairpin!r}")
    tokens = jnp.asarray(tokens) if not isinstance(tokens, jax.Array) else tokens
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"tokens must be integers (see layers.encode), got dtype {tokens.dtype}")
    if tokens.ndim not in (1, 2):
        raise ValueError(f"tokens must have shape [n] or [B, L], got {tokens.shape}")
    if _is_concrete(tokens) and tokens.size:
        bad = np.flatnonzero((np.asarray(tokens).ravel() < 0) | (np.asarray(tokens).ravel() >= NUM_TOKENS))
        if bad.size:
            pos = np.unravel_index(bad[0], tokens.shape)
            raise ValueError(f"token {int(np.asarray(tokens)[pos])} at index {tuple(map(int, pos))} is not in 0..4 (A C G U N)")
    batched = tokens.ndim == 2
    length = tokens.shape[-1]
    if not batched:
        if lengths is not None:
            raise ValueError("lengths is only for batched tokens [B, L]")
        tokens = tokens[None]
        lengths = jnp.full((1,), length, jnp.int32)
    elif lengths is None:
        lengths = jnp.full((tokens.shape[0],), length, jnp.int32)
    else:
        lengths = jnp.asarray(lengths)
        if lengths.shape != (tokens.shape[0],):
            raise ValueError(f"lengths must have shape [B] = ({tokens.shape[0]},), got {lengths.shape}")
        if _is_concrete(lengths):
            arr = np.asarray(lengths)
            bad = np.flatnonzero((arr < 0) | (arr > length))
            if bad.size:
                raise ValueError(f"lengths[{bad[0]}] = {arr[bad[0]]} is outside 0..L = 0..{length}")
        lengths = lengths.astype(jnp.int32)
    if phi is not None:
        expected = (tokens.shape[0], length, length) if batched else (length, length)
        if jnp.shape(phi) != expected:
            raise ValueError(f"phi must have shape {expected}, got {jnp.shape(phi)}")
        phi = jnp.asarray(phi)
        if not batched:
            phi = phi[None]
    return tokens, lengths, phi, batched


def _skew(x, length):
    """[B, L, L] matrix -> [B, L(width d), L(start i)] with x[b, i, i + d] (0 past the end).

    A pad and two reshapes instead of a gather: row i of ``x`` flattened with stride
    ``L + 1`` puts ``x[i, i + d]`` at column d, and the transpose (the gradient) stays
    a cheap reshape too, not a scatter-add (measured ~20 ms on a 32 x 256 batch).
    """
    batch = x.shape[0]
    flat = jnp.pad(x.reshape(batch, length * length), ((0, 0), (0, length)))
    rows = flat.reshape(batch, length, length + 1)[:, :, :length]  # [b, i, d]
    past_end = np.arange(length)[None, :] + np.arange(length)[:, None] >= length  # [i, d]
    return jnp.swapaxes(jnp.where(past_end, jnp.zeros_like(rows), rows), 1, 2)


def _shear(v, length):
    """[B, P] with P >= 2L -> [B, L(d), L(i)] with v[b, i + d] (a Hankel matrix, no gather)."""
    batch, size = v.shape
    tiled = jnp.broadcast_to(v[:, None, :], (batch, length, size)).reshape(batch, length * size)
    tiled = jnp.pad(tiled, ((0, 0), (0, length)))
    return tiled.reshape(batch, length, size + 1)[:, :, :length]


def _lookup(table, indices):
    """table[indices...] for a small replicated table and (possibly sharded) token indices.

    The result takes the indices' sharding, so the gather also works when the batch
    is sharded over an explicit mesh (``jax.make_mesh`` + ``jax.set_mesh``).
    """
    flat = indices[0]
    for size, index in zip(table.shape[1:], indices[1:]):
        flat = flat * size + index
    return table.reshape(-1).at[flat].get(out_sharding=jax.typeof(flat).sharding)


def cell_scores(params, tokens, phi=None):
    """Per-cell scores in the engine's width layout (all differentiable gathers).

    tokens: int [B, L]; phi: [B, L, L] or None. Returns ``(pair_w, stack_w, unpaired, loop)``:
    ``pair_w[b, d, i] = pair[x_i, x_j] + phi[i, j]`` and
    ``stack_w[b, d, i] = stack[x_i, x_j, x_{j-1}, x_{i+1}]`` with ``j = i + d``, and
    ``unpaired[b, i] = unpaired[x_i]``.
    """
    length = tokens.shape[1]
    dtype = _result_dtype(params)
    x = jnp.clip(tokens, 0, NUM_TOKENS - 1)  # [B, L]
    padded = jnp.concatenate([x, jnp.full((x.shape[0], length + 1), NUM_TOKENS - 1, x.dtype)], axis=1)
    shape = (x.shape[0], length, length)
    x_i = jnp.broadcast_to(x[:, None, :], shape)
    x_ip1 = jnp.broadcast_to(padded[:, None, 1 : length + 1], shape)
    x_j = _shear(padded, length)
    # x_{j-1}; at d = 0 (never a pair) any token will do.
    x_jm1 = _shear(jnp.concatenate([padded[:, :1], padded], axis=1), length)
    pair_w = _lookup(params["pair"].astype(dtype), (x_i, x_j))
    if phi is not None:
        pair_w = pair_w + _skew(phi.astype(dtype), length)
    stack_w = _lookup(params["stack"].astype(dtype), (x_i, x_j, x_jm1, x_ip1))
    unpaired = _lookup(params["unpaired"].astype(dtype), (x,))
    loop = params["loop"].astype(dtype)
    return pair_w, stack_w, unpaired, loop


@functools.partial(jax.jit, static_argnames=("min_hairpin", "semiring", "num_chunks"))
def _batched_value(params, tokens, lengths, phi, *, min_hairpin, semiring, num_chunks):
    length = tokens.shape[1]
    if length == 0:
        return jnp.zeros(tokens.shape[0], _result_dtype(params))
    pair_w, stack_w, unpaired, loop = cell_scores(params, tokens, phi)
    return inside_from_scores(pair_w, stack_w, unpaired, loop, lengths, length, min_hairpin, semiring, num_chunks)


def _explicit_batch_spec(tokens):
    """The batch axis's mesh axes when tokens are sharded over an *explicit* mesh, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return None
    return jax.typeof(tokens).sharding.spec[0]


def batch_sharded(fn, tokens, num_outputs=1):
    """``fn`` ready to run on ``tokens``'s batch, whatever the mesh.

    The engine's gathers and slices are written for automatic sharding. When ``tokens``
    is sharded over an *explicit* mesh (``jax.make_mesh`` + ``jax.set_mesh``), ``fn`` runs
    in auto mode and hands back outputs sharded along their leading (batch) axis.
    """
    batch_spec = _explicit_batch_spec(tokens)
    if batch_spec is None:
        return fn
    spec = jax.sharding.PartitionSpec(batch_spec)
    return jax.sharding.auto_axes(fn, out_sharding=spec if num_outputs == 1 else (spec,) * num_outputs)


def _value(params, tokens, lengths, phi, min_hairpin, semiring, num_chunks):
    params = check_params(params)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    run = functools.partial(
        _batched_value, min_hairpin=int(min_hairpin), semiring=semiring, num_chunks=num_chunks
    )
    out = batch_sharded(run, tokens)(params, tokens, lengths, phi)
    return out if batched else out[0]


def log_partition(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=None):
    r"""Log partition function :math:`\log Z(x) = \log \sum_s e^{\mathrm{score}(s)}`.

    Args:
      params: mapping with ``stack [5,5,5,5]``, ``pair [5,5]``, ``unpaired [5]``, ``loop []``
        (float32 or float64; the result has their dtype).
      tokens: int ``[n]`` (see :func:`layers.encode`) or ``[B, L]`` (see :func:`layers.encode_batch`).
      lengths: int ``[B]`` with ``0 <= lengths <= L`` (batched only; default: all ``L``).
        Tokens past a sequence's length never change its result.
      phi: optional extra pair potentials ``[n, n]`` or ``[B, L, L]`` (entry ``[i, j]``, ``i < j``).
      min_hairpin: static ``h >= 0``; a pair (i, j) needs ``j - i > h``.
      num_chunks: static; how many static-shape pieces the diagonal loop is split into
        (default ``min(16, L // 32)``: more chunks waste less work but compile longer).

    Returns:
      a scalar (or ``[B]``): ``Z[0][n-1]``, 0 for an empty sequence. Differentiable with
      :func:`jax.grad` (an outside pass, O(L^2) memory); works under ``jit`` and ``vmap``.
      Under ``jit`` the range checks on ``tokens``/``lengths`` cannot run.

    Example:
      >>> import layers, jax.numpy as jnp
      >>> params = layers.default_params()
      >>> float(layers.log_partition(params, layers.encode("GGGAAACCC"))) > 0
      True
    """
    return _value(params, tokens, lengths, phi, min_hairpin, "log", num_chunks)


def max_score(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=None):
    """The best structure's score ``max_s score(s)`` (max semiring); same arguments as
    :func:`log_partition`. Its gradient is the indicator of the best structure."""
    return _value(params, tokens, lengths, phi, min_hairpin, "max", num_chunks)


def inside_charts(params, tokens, *, phi=None, min_hairpin=3, semiring="log", num_chunks=None):
    """The filled charts ``(F, Zn, Zr)`` for batched tokens ``[B, L]`` (see ``chart.py``)."""
    params = check_params(params)
    tokens, _, phi, _ = _check_inputs(tokens, None, phi, min_hairpin)
    scores = cell_scores(params, tokens, phi)
    return inside_charts_from_scores(
        *scores, length=tokens.shape[1], min_hairpin=min_hairpin, semiring=semiring, num_chunks=num_chunks
    )
