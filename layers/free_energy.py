r"""Free energies under the Turner 2004 model: of a structure, and of the ensemble.

* :func:`free_energy` -- ``E(s)`` in kcal/mol, exactly as ViennaRNA's ``eval_structure``
  computes it (integer 0.01 kcal/mol arithmetic, large hairpins truncated);
* :func:`ensemble_free_energy` -- ``G = -kT log Z``, ViennaRNA's ``fc.pf()`` (with
  ``md.pf_smooth = 0``);
* :func:`isolated_pairs` -- the pairs that RNAfold's ``-p --noLP`` leaves out of its ensemble;
* :func:`turner_structure_score` -- the log-weight ``-E_pf(s)/kT + SUM phi`` that
  ``layers.structure_score`` returns for Turner parameters (``E_pf`` is the energy the partition
  function gives the structure, so ``log_prob = structure_score - log Z`` is a proper log
  probability).

For Turner parameters ``max_score`` and ``structure_score`` are log-weights, so the minimum free
energy is ``-kT * max_score`` (``KT`` at 37 C; parameters at another temperature carry their own ``kT``),
and ``free_energy`` of ``best_structure`` equals it.

Example:
  >>> from foldax import layers
  >>> params, x = layers.turner2004(), layers.encode("GGGGAAACCCC")
  >>> round(float(free_energy(params, x, "((((...))))")), 2)
  -4.5
  >>> round(float(ensemble_free_energy(params, x)), 2)
  -4.87
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from foldax.layers.dotbracket import StructureError, from_dot_bracket
from foldax.layers.energy import _pair_type, loop_energy
from foldax.layers.energy_params import PAIR_INDEX, temperature_kt
from foldax.layers.inside import _check_inputs, _is_concrete, check_params, is_energy_params, log_partition, pair_phi


def _require_energy_params(params, what):
    if not is_energy_params(params):
        raise TypeError(f"{what} needs Turner energy parameters (layers.turner2004() or "
                        "layers.load_parameter_file(...)), got stacking-grammar scores")
    return check_params(params)


def _pair_tables(structure, tokens_shape, batched, lengths):
    """Dot-bracket string(s) or pair table(s) -> int32 pair tables of the tokens' shape. A dot-bracket
    must be as long as its sequence (``lengths[b]`` where known, else the tokens' width): a shorter one
    is refused, never padded with unpaired positions."""
    if isinstance(structure, str):
        structure = [structure]
    if isinstance(structure, (list, tuple)) and structure and isinstance(structure[0], str):
        width = tokens_shape[-1]
        known = _is_concrete(lengths)
        tables = np.full((len(structure), width), -1, np.int32)
        for b, db in enumerate(structure):
            n = int(lengths[b]) if known and b < len(lengths) else width
            if len(db) != n:
                raise ValueError(f"structure {b} has {len(db)} positions, but its sequence has {n}")
            tables[b, : len(db)] = from_dot_bracket(db)
        structure = tables if batched else tables[0]
    table = jnp.asarray(structure)
    expected = tuple(tokens_shape) if batched else tuple(tokens_shape[1:])
    if table.shape != expected:
        raise ValueError(f"structure must have the shape of tokens {expected}, got {table.shape}")
    if not jnp.issubdtype(table.dtype, jnp.integer):
        raise TypeError(f"a pair table holds integers (partner or -1), got dtype {table.dtype}")
    return (table if batched else table[None]).astype(jnp.int32)


def _explain_invalid(params, tokens, tables, lengths, valid, min_hairpin):
    """For concrete inputs: a StructureError naming the sequence and position of the first
    structure the Turner grammar cannot produce."""
    from foldax.layers.dotbracket import validate_pair_table

    for b in np.flatnonzero(~np.asarray(valid)):
        n = int(lengths[b])
        table, x = np.asarray(tables[b, :n]), np.asarray(tokens[b, :n])
        where = f"sequence {b} (length {n}): " if tables.shape[0] > 1 else ""
        try:
            validate_pair_table(table, min_hairpin=min_hairpin, nested=True)
        except StructureError as e:
            raise StructureError(f"invalid pair table: {where}{e}", position=e.position, reason=e.reason) from e
        for i, j in enumerate(table):
            if j > i and PAIR_INDEX[min(x[i], 4), min(x[j], 4)] < 0:
                raise StructureError(f"invalid pair table: {where}pair ({i}, {j}) is {'ACGUN'[x[i]]}-{'ACGUN'[x[j]]}, "
                                     "which the Turner model cannot form (pairs: AU UA CG GC GU UG)",
                                     position=i, reason="non-canonical pair")
        raise StructureError(f"invalid pair table: {where}an interior loop or bulge has more than 30 unpaired "
                             "bases, which the Turner grammar (ViennaRNA's max loop 30) excludes",
                             position=None, reason="interior loop > 30")


def free_energy(params, tokens, structure, lengths=None):
    """``E(s)`` in kcal/mol of ``structure`` on ``tokens`` (ViennaRNA's ``eval_structure``).

    Args:
      params: Turner energy tables (:func:`foldax.layers.turner2004`).
      tokens: int ``[n]`` or ``[B, L]`` (see :func:`foldax.layers.encode`, :func:`foldax.layers.encode_batch`).
      structure: a dot-bracket string (or a list of them), or int pair tables of the tokens'
        shape (partner or -1).
      lengths: int ``[B]`` for batched tokens.

    Returns:
      kcal/mol, a scalar or ``[B]``; differentiable in ``params`` (the gradient is the count
      of each table entry's uses). Any nested structure is evaluated, like ViennaRNA's eval
      (also interior loops > 30, with its extrapolation); a non-canonical pair gives +inf.
    """
    params = _require_energy_params(params, "free_energy")
    tokens, lengths, _, batched = _check_inputs(tokens, lengths, None, 0)
    tables = _pair_tables(structure, tokens.shape, batched, lengths)
    energy, _ = loop_energy(params, tokens, tables, lengths, pf=False)
    return energy if batched else energy[0]


def ensemble_free_energy(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=None,
                         no_lonely_pairs=False):
    """``G = -kT log Z`` in kcal/mol (ViennaRNA's ``fc.pf()`` with ``md.pf_smooth = 0``).

    Same arguments as :func:`foldax.layers.log_partition` (``phi`` adds ``-kT phi`` to a pair's energy,
    like ViennaRNA's soft constraint ``fc.sc_add_bp(i + 1, j + 1, -kT phi[i, j])``).
    ``no_lonely_pairs=True`` gives the ensemble of structures without lonely pairs exactly;
    ViennaRNA's ``md.noLP = 1`` partition function only removes the pairs that cannot
    stack at all (:func:`isolated_pairs`), so it also counts some lonely pairs and is lower.
    """
    params = _require_energy_params(params, "ensemble_free_energy")
    log_z = log_partition(params, tokens, lengths, phi=phi, min_hairpin=min_hairpin, num_chunks=num_chunks,
                          no_lonely_pairs=no_lonely_pairs)
    return -temperature_kt(params) * log_z


#: A ``phi`` that removes a pair from the ensemble: its weight ``e^-10000`` is 0 in float32 and float64.
FORBIDDEN_PHI = -1e4


def isolated_pairs(tokens, lengths=None, *, min_hairpin=3):
    """The pairs that can only occur as lonely pairs: ``(i, j)`` can pair, and neither
    ``(i + 1, j - 1)`` nor ``(i - 1, j + 1)`` can (a canonical pair ``AU GC GU`` with
    ``j - i > min_hairpin``, inside the sequence). ``[n, n]`` bool (or ``[B, L, L]``), upper triangle.

    RNAfold's ``-p --noLP`` (ViennaRNA's partition function with ``md.noLP = 1``) removes exactly
    these pairs, so other lonely pairs stay in its ensemble; its MFE has none. With the default
    grammar, ``phi = where(isolated_pairs(x), FORBIDDEN_PHI, 0)`` gives its partition function and
    pair probabilities; ``no_lonely_pairs=True`` gives the exact ensemble without lonely pairs.

    >>> from foldax import layers
    >>> x = layers.encode("GGGAAAACCC")
    >>> [(int(i), int(j)) for i, j in zip(*np.nonzero(np.asarray(isolated_pairs(x))))]
    [(0, 7), (2, 9)]
    """
    tokens, lengths, _, batched = _check_inputs(tokens, lengths, None, min_hairpin)
    idx = jnp.arange(tokens.shape[1])
    inside = idx[None, :] < lengths[:, None]
    can = ((_pair_type(tokens[:, :, None], tokens[:, None, :]) >= 0)
           & (idx[None, None, :] - idx[None, :, None] > min_hairpin) & inside[:, :, None] & inside[:, None, :])
    padded = jnp.pad(can, ((0, 0), (1, 1), (1, 1)))  # can[i, j] at [i + 1, j + 1]; False outside
    stackable = padded[:, 2:, :-2] | padded[:, :-2, 2:]  # can[i + 1, j - 1] | can[i - 1, j + 1]
    out = can & ~stackable
    return out if batched else out[0]


def turner_structure_score(params, tokens, pair_table, lengths, phi, min_hairpin):
    """``(log-weight [B], valid [B])`` of batched structures under the Turner grammar:
    ``-E_pf(s)/kT + SUM_{(i,j) in s} phi[i, j]``; ``valid`` is False where the grammar
    excludes the structure (see :func:`foldax.layers.energy.loop_energy`)."""
    energy, valid = loop_energy(params, tokens, pair_table, lengths, pf=True)
    batch, length = tokens.shape
    pos = jnp.arange(length)
    in_seq = pos[None, :] < lengths[:, None]
    opens = (pair_table > pos[None, :]) & in_seq
    hairpins_ok = jnp.all(~opens | (pair_table - pos[None, :] > min_hairpin), axis=1)
    valid = valid & hairpins_ok
    score = jnp.where(valid, -energy / temperature_kt(params), jnp.zeros_like(energy))  # no inf reaches a gradient
    if phi is not None:
        score = score + pair_phi(phi.astype(score.dtype), jnp.where(in_seq, pair_table, -1))
    return score, valid


def check_turner_tables(params, tokens, tables, lengths, min_hairpin):
    """Raises StructureError for a concrete structure outside the Turner grammar."""
    if not (_is_concrete(tables) and _is_concrete(tokens) and _is_concrete(lengths)):
        return
    _, valid = loop_energy(params, tokens, tables, lengths, pf=True)
    valid = np.array(valid)
    hairpins = np.asarray(tables) - np.arange(tables.shape[1])[None, :]
    in_seq = np.arange(tables.shape[1])[None, :] < np.asarray(lengths)[:, None]
    opens = (hairpins > 0) & in_seq
    valid &= np.all(~opens | (hairpins > min_hairpin), axis=1)
    if not valid.all():
        _explain_invalid(params, tokens, tables, lengths, valid, min_hairpin)
