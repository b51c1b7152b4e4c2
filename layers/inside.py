"""Public entry points of the DP: ``log_partition`` and ``max_score``, for either grammar.

The parameters choose the grammar: the stacking grammar's four score tensors
(``layers.init_params``, ``layers.default_params``; ``layers/stacking.py``) or the Turner
2004 energy tables (``layers.turner2004()``, ``layers.load_parameter_file``;
``layers/turner.py``). Every function here and in ``foldax.layers.decoding`` / ``foldax.layers.structure``
accepts both and behaves identically.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers import chart, devices, stacking, turner
from foldax.layers.alphabet import NUM_TOKENS
from foldax.layers.energy_params import check_energy_params
from foldax.layers.stacking import PARAM_SHAPES


def is_energy_params(params) -> bool:
    """True for Turner energy tables (``layers.turner2004()``), False for stacking scores."""
    return isinstance(params, Mapping) and "mismatch_hairpin" in params


def _leaf(value):
    value = jnp.asarray(getattr(value, "value", value))  # accept nnx.Param leaves directly
    return value if jnp.issubdtype(value.dtype, jnp.floating) else value.astype(jnp.float32)


def check_params(params: Mapping) -> dict:
    """Returns the parameters as a plain dict of float arrays; raises a clear error on a bad one.

    Stacking scores (``stack pair unpaired loop``) or Turner energy tables (see
    :mod:`foldax.layers.energy_params`).
    """
    if is_energy_params(params):
        params = {k: ({s: _leaf(e) for s, e in v.items()} if k == "special_hairpins" else _leaf(v))
                  for k, v in params.items()}
        check_energy_params(params)
        return params
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
    return jnp.result_type(*jax.tree.leaves(params))


def _is_concrete(x):
    return not isinstance(x, jax.core.Tracer)


def pair_phi(phi, pair_table):
    """``SUM_{i < pt[i]} phi[b, i, pt[i]]``: what ``phi`` adds to each structure's score.

    ``phi [B, L, L]``; ``pair_table [B, L]``, or ``[B, S, L]`` for several structures of each
    sequence (partner or -1; entries past a sequence's length must be -1). Returns ``[B]`` (or
    ``[B, S]``) in ``phi``'s dtype.
    """
    length = pair_table.shape[-1]
    phi = phi.reshape(phi.shape[:1] + (1,) * (pair_table.ndim - 2) + phi.shape[1:])
    partner = jnp.clip(pair_table, 0, max(length - 1, 0))  # clipped gathers keep invalid tables finite
    picked = jnp.take_along_axis(phi, partner[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(pair_table > jnp.arange(length), picked, 0), axis=-1)


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
        # One sequence; a scalar length (e.g. per example under jax.vmap) marks its padding.
        if lengths is None:
            lengths = jnp.full((1,), length, jnp.int32)
        else:
            lengths = jnp.asarray(lengths)
            if lengths.shape != ():
                raise ValueError(f"lengths must be a scalar for one sequence [n] (or [B] for tokens [B, L]), "
                                 f"got shape {lengths.shape}")
            if _is_concrete(lengths) and not 0 <= int(lengths) <= length:
                raise ValueError(f"lengths = {int(lengths)} is outside 0..n = 0..{length}")
            lengths = lengths.astype(jnp.int32)[None]
        tokens = tokens[None]
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


def _problem(grammar, length, num_chunks):
    return chart.Problem(grammar, int(length), None if num_chunks is None else int(num_chunks))


def check_no_lonely_pairs(params, no_lonely_pairs):
    """Raises a clear error where ``no_lonely_pairs`` is not a bool or the grammar lacks it."""
    if not isinstance(no_lonely_pairs, (bool, np.bool_)):
        raise TypeError(f"no_lonely_pairs must be a bool (static), got {no_lonely_pairs!r}")
    if no_lonely_pairs and not is_energy_params(params):
        raise ValueError("no_lonely_pairs=True needs Turner energy parameters (layers.turner2004() or a .par "
                         "file); the stacking grammar has no such option")
    return bool(no_lonely_pairs)


def engine_inputs(params, tokens, lengths, phi, *, min_hairpin, semiring="log", num_chunks=None,
                  no_lonely_pairs=False):
    """``(problem, inputs)`` for the chart engine (``foldax.layers.chart``): the grammar the
    parameters belong to, with its per-cell scores for ``tokens`` [B, L] (checked params)."""
    length = tokens.shape[1]
    if is_energy_params(params):
        problem = _problem(turner.TurnerGrammar(min_hairpin, no_lonely_pairs), length, num_chunks)
        inputs = turner.cell_scores(params, tokens, lengths, phi, min_hairpin=min_hairpin,
                                    pf=semiring != "max", end_pad=problem.widest)
    else:
        problem = _problem(stacking.StackingGrammar(min_hairpin), length, num_chunks)
        inputs = stacking.cell_scores(params, tokens, phi)
    return problem, inputs


def cell_scores(params, tokens, phi=None):
    """The stacking grammar's engine inputs (see :func:`foldax.layers.stacking.cell_scores`)."""
    return stacking.cell_scores(params, tokens, phi)


@functools.partial(jax.jit, static_argnames=("min_hairpin", "semiring", "num_chunks", "no_lonely_pairs"))
def _batched_value(params, tokens, lengths, phi, *, min_hairpin, semiring, num_chunks, no_lonely_pairs=False):
    length = tokens.shape[1]
    if length == 0:
        return jnp.zeros(tokens.shape[0], _result_dtype(params))
    problem, inputs = engine_inputs(params, tokens, lengths, phi, min_hairpin=min_hairpin, semiring=semiring,
                                    num_chunks=num_chunks, no_lonely_pairs=no_lonely_pairs)
    return chart.value(problem, semiring, inputs, lengths)


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
    in auto mode and hands back outputs sharded along their leading (batch) axis. A
    concrete batch that nobody placed is split over the local devices
    (:func:`foldax.layers.devices.over_local_devices`).
    """
    batch_spec = _explicit_batch_spec(tokens)
    if batch_spec is None:
        return devices.over_local_devices(fn, tokens)
    spec = jax.sharding.PartitionSpec(batch_spec)
    return jax.sharding.auto_axes(fn, out_sharding=spec if num_outputs == 1 else (spec,) * num_outputs)


def _value(params, tokens, lengths, phi, min_hairpin, semiring, num_chunks, no_lonely_pairs):
    params = check_params(params)
    no_lonely_pairs = check_no_lonely_pairs(params, no_lonely_pairs)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    run = functools.partial(
        _batched_value, min_hairpin=int(min_hairpin), semiring=semiring, num_chunks=num_chunks,
        no_lonely_pairs=no_lonely_pairs,
    )
    out = batch_sharded(run, tokens)(params, tokens, lengths, phi)
    return out if batched else out[0]


def log_partition(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=None,
                  no_lonely_pairs=False):
    r"""Log partition function :math:`\log Z(x) = \log \sum_s e^{\mathrm{score}(s)}`.

    Args:
      params: mapping with ``stack [5,5,5,5]``, ``pair [5,5]``, ``unpaired [5]``, ``loop []``
        (float32 or float64; the result has their dtype).
      tokens: int ``[n]`` (see :func:`foldax.layers.encode`) or ``[B, L]`` (see :func:`foldax.layers.encode_batch`).
      lengths: int ``[B]`` with ``0 <= lengths <= L`` (batched only; default: all ``L``).
        Tokens past a sequence's length never change its result.
      phi: optional extra pair potentials ``[n, n]`` or ``[B, L, L]`` (entry ``[i, j]``, ``i < j``).
      min_hairpin: static ``h >= 0``; a pair (i, j) needs ``j - i > h``.
      num_chunks: static; how many static-shape pieces the diagonal loop is split into
        (default ``min(16, L // 32)``: more chunks waste less work but compile longer).
      no_lonely_pairs: static; Turner parameters only: sum over the structures in which
        every pair stacks on a neighbouring pair (RNAfold's ``--noLP``; see
        :class:`foldax.layers.turner.TurnerGrammar`).

    Returns:
      a scalar (or ``[B]``): ``Z[0][n-1]``, 0 for an empty sequence. Differentiable with
      :func:`jax.grad` (an outside pass, O(L^2) memory); works under ``jit`` and ``vmap``.
      Under ``jit`` the range checks on ``tokens``/``lengths`` cannot run.

    Example:
      >>> import jax.numpy as jnp; from foldax import layers
      >>> params = layers.default_params()
      >>> float(layers.log_partition(params, layers.encode("GGGAAACCC"))) > 0
      True
    """
    return _value(params, tokens, lengths, phi, min_hairpin, "log", num_chunks, no_lonely_pairs)


def max_score(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=None, no_lonely_pairs=False):
    """The best structure's score ``max_s score(s)`` (max semiring); same arguments as
    :func:`log_partition`. Its gradient is the indicator of the best structure."""
    return _value(params, tokens, lengths, phi, min_hairpin, "max", num_chunks, no_lonely_pairs)


def inside_charts(params, tokens, lengths=None, *, phi=None, min_hairpin=3, semiring="log", num_chunks=None,
                  no_lonely_pairs=False):
    """The filled charts (a dict in the engine's layout, see the grammar's module) for tokens [B, L].

    With ``no_lonely_pairs=True`` the Turner charts ``QBs``/``QBr`` hold the stacked-inside ``QS``
    and ``QB`` itself is a segment of ``ML`` (:class:`foldax.layers.turner.TurnerGrammar`)."""
    params = check_params(params)
    no_lonely_pairs = check_no_lonely_pairs(params, no_lonely_pairs)
    tokens, lengths, phi, _ = _check_inputs(tokens, lengths, phi, min_hairpin)
    problem, inputs = engine_inputs(params, tokens, lengths, phi, min_hairpin=int(min_hairpin), semiring=semiring,
                                    num_chunks=num_chunks, no_lonely_pairs=no_lonely_pairs)
    return chart.charts(problem, semiring, inputs)
