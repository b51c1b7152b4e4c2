"""The Turner model: TurnerModel / TurnerNeuralModel, the prior, parameter files, data cleaning for the
Turner grammar, and training configs/turner.py end to end (resume, export, sharding).

Fast tests need no Turner DP; the ones that compile it (minutes on a shared 2-core CPU) are slow.
This file doubles as the script of the 2-device subprocess (``python tests/test_turner_model.py one-step
OUT.npz``).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from compile_flags import with_devices  # noqa: E402
from foldax import layers  # noqa: E402
from foldax.layers.dotbracket import from_dot_bracket, lonely_pairs  # noqa: E402
from foldax.model import cll_loss, cll_step, l2_penalty  # noqa: E402
from foldax.model.models import TurnerModel, TurnerNeuralModel, create_model, grammar_of  # noqa: E402
from foldax.train import datasets  # noqa: E402

DUMMY = ROOT / "tests" / "testdata" / "archiveii" / "archiveII.tar.gz"
CHUNKS = 2


def _perturbed(model, seed=0, scale=0.3):
    """Moves every nnx.Param of ``model`` by N(0, scale^2) (the placeholders of +inf entries too)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    rng = np.random.default_rng(seed)  # numpy: no XLA program per shape
    moved = [jnp.asarray(np.asarray(x) + scale * rng.normal(size=np.shape(x)), x.dtype) for x in leaves]
    nnx.update(model, jax.tree.unflatten(tree, moved))
    return model


def assert_gradient_matches_finite_differences(loss, model, *, trials=3, eps=1e-5, rtol=1e-6, atol=1e-9):
    """``jax.grad`` of ``loss(model)`` (float64) is finite, and its directional derivatives along
    random directions (every parameter at once) equal central differences."""
    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree.flatten(state)

    def loss_of(leaves):
        return loss(nnx.merge(graphdef, jax.tree.unflatten(tree, leaves)))

    grads = jax.grad(loss_of)(leaves)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    assert sum(float(jnp.sum(g * g)) for g in grads) > 0
    rng = np.random.default_rng(0)
    for trial in range(trials):
        direction = [jnp.asarray(rng.normal(size=np.shape(x))) for x in leaves]
        analytic = sum(float(jnp.sum(g * d)) for g, d in zip(grads, direction))
        plus = float(loss_of([x + eps * d for x, d in zip(leaves, direction)]))
        minus = float(loss_of([x - eps * d for x, d in zip(leaves, direction)]))
        np.testing.assert_allclose(analytic, (plus - minus) / (2 * eps), rtol=rtol, atol=atol, err_msg=str(trial))


# --------------------------------------------------------------------------- the prior


def test_prior_is_zero_at_init_and_skips_forbidden_entries():
    model = TurnerModel(prior_strength=0.01, param_dtype=jnp.float64)
    assert float(model.prior_penalty()) == 0.0
    _perturbed(model)
    want = 0.0
    turner = layers.turner2004(jnp.float64)
    now = model.inside.params_dict()
    for name in model.inside.param_names:
        finite = np.isfinite(np.asarray(turner[name]))
        want += float(np.sum((np.asarray(now[name])[finite] - np.asarray(turner[name])[finite]) ** 2))
    want += sum(float((now["special_hairpins"][s] - e) ** 2) for s, e in turner["special_hairpins"].items())
    np.testing.assert_allclose(float(model.prior_penalty()), 0.01 * want, rtol=1e-12)
    assert np.isinf(np.asarray(now["hairpin"][:3])).all()  # +inf entries stay +inf whatever the placeholders hold


def test_prior_gradient_matches_finite_differences():
    model = _perturbed(TurnerModel(prior_strength=0.02, param_dtype=jnp.float64), seed=1)
    grads = nnx.grad(lambda m: m.prior_penalty())(model)
    forbidden = dict(model.inside.forbidden)
    for name in ("stack", "hairpin", "special_hairpins", "ml_closing", "int22"):
        g = np.asarray(grads["inside"][name][...]).reshape(-1)
        value = np.asarray(getattr(model.inside, name)[...]).reshape(-1)
        mean = np.asarray(model.prior_mean.arrays[name]).reshape(-1)
        want = 2 * 0.02 * (value - mean)
        want[list(forbidden.get(name, ()))] = 0.0
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-15, err_msg=name)
    # a finite difference on one entry of a table and one special hairpin
    flat = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(grads)) and flat
    for name, index in (("stack", (1, 2)), ("special_hairpins", (3,)), ("hairpin", (1,))):
        param = getattr(model.inside, name)
        base = np.asarray(param[...])
        values = []
        for sign in (1, -1):  # the prior is quadratic: central differences are exact up to rounding
            moved = base.copy()
            moved[index] += sign * 1e-4
            param[...] = jnp.asarray(moved)
            values.append(float(model.prior_penalty()))
        param[...] = jnp.asarray(base)
        fd = (values[0] - values[1]) / 2e-4
        np.testing.assert_allclose(float(np.asarray(grads["inside"][name][...])[index]), fd, rtol=1e-6, atol=1e-9)


def test_l2_covers_the_encoder_not_the_tables():
    model = TurnerNeuralModel(rngs=nnx.Rngs(0), features=4, pair_features=2, kernel_size=3, num_layers=1)
    encoder = sum(float(jnp.sum(x ** 2)) for x in jax.tree.leaves(nnx.state(model.encoder, nnx.Param)))
    np.testing.assert_allclose(float(l2_penalty(model)), encoder, rtol=1e-6)
    assert float(l2_penalty(TurnerModel())) == 0.0


def test_adamw_and_the_placeholders_of_forbidden_entries():
    """AdamW (weight decay) and Adam's moments only ever see finite values; the tables keep their +inf entries."""
    model = TurnerModel(prior_strength=1e-3)
    opt = nnx.Optimizer(model, optax.adamw(0.1, weight_decay=0.5), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
        grads = nnx.grad(lambda m: m.prior_penalty() + 1e-3 * jnp.sum(m.inside.stack[...]))(model)
        opt.update(model, grads)

    for _ in range(3):
        step(model, opt)
    for leaf in jax.tree.leaves(nnx.state((model, opt))):
        assert np.isfinite(np.asarray(leaf)).all()
    assert np.isinf(np.asarray(model.inside.params_dict()["interior"][:2])).all()
    assert np.isfinite(float(model.prior_penalty()))


def test_trainable_names_freeze_the_other_tables():
    """``optimizer.trainable``: only the named tables move (and keep optimizer state); a name no
    parameter has is a clear error, not a silently frozen model."""
    from foldax.train import train as trainer
    from foldax.train.main import load_config_file

    config = load_config_file(str(ROOT / "configs" / "turner.py"))
    config.optimizer.warmup_steps = 0
    config.optimizer.schedule = "constant"
    config.optimizer.trainable = "ml_closing, terminal_au,hairpin"
    graphdef, state, _ = trainer.create_state(config, 10)
    model, opt = nnx.merge(graphdef, state)
    before = nnx.to_pure_dict(nnx.state(model, nnx.Param))["inside"]
    grads = jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param))
    for _ in range(3):
        opt.update(model, grads)
    after = nnx.to_pure_dict(nnx.state(model, nnx.Param))["inside"]
    changed = {name for name in before if not np.array_equal(np.asarray(before[name]), np.asarray(after[name]))}
    assert changed == {"ml_closing", "terminal_au", "hairpin"}
    np.testing.assert_allclose(np.asarray(after["ml_closing"]) - np.asarray(before["ml_closing"]), -3 * 0.003,
                               rtol=1e-3)  # Adam's first steps move by the learning rate
    moments = [x for x in jax.tree.leaves(nnx.state(opt)) if np.ndim(x) and np.size(x) > 1]
    assert sum(np.size(x) for x in moments) == 2 * 31  # Adam's mu and nu of the hairpin table only
    config.optimizer.trainable = "hairpin,ml_clsoing"
    with pytest.raises(ValueError, match=r"trainable names \['ml_clsoing'\].*'ml_closing'"):
        trainer.create_state(config, 10)


# --------------------------------------------------------------------------- create_model


def test_create_model_turner_variants(tmp_path):
    cfg = ml_collections.ConfigDict({"name": "turner", "init": "turner2004", "prior_strength": 1e-3,
                                     "min_hairpin": 3, "num_chunks": CHUNKS, "features": 4, "kernel_size": 3,
                                     "num_layers": 1, "pair_features": 2})
    model = create_model(cfg, nnx.Rngs(0))
    assert type(model) is TurnerModel and model.prior_strength == 1e-3 and grammar_of(cfg) == "turner"
    cfg.name = "turner_neural"
    neural = create_model(cfg, nnx.Rngs(0))
    assert isinstance(neural, TurnerNeuralModel)
    assert model.energy_kT == layers.KT and neural.energy_kT is None  # phi's log-weights are no energies
    tokens, lengths = layers.encode_batch(["GGGAAACCC", "ACGUACGUAC"], buckets=None)
    params, phi = neural.scores(tokens, lengths)
    assert phi.shape == (2, 10, 10) and float(jnp.abs(phi).max()) == 0.0  # starts as the Turner model
    # init from a parameter file: the prior's centre is that file
    changed = dict(layers.turner2004(), ml_base=jnp.asarray(0.25))
    layers.save_params(changed, tmp_path / "p.json")
    cfg.init = str(tmp_path / "p.json")
    model = create_model(cfg, nnx.Rngs(0))
    assert float(model.inside.ml_base[...]) == 0.25 and float(model.prior_mean.arrays["ml_base"]) == 0.25
    for bad in ("random", "default"):
        cfg.init = bad
        with pytest.raises(ValueError, match="energy tables"):
            create_model(cfg, nnx.Rngs(0))
    cfg.init = str(tmp_path / "p.json")
    cfg.name = "stacking"
    with pytest.raises(ValueError, match="Turner energy tables"):
        create_model(cfg, nnx.Rngs(0))
    cfg.name, cfg.init = "turner", "default"
    with pytest.raises(ValueError, match="turner2004"):
        create_model(cfg, nnx.Rngs(0))
    with pytest.raises(ValueError, match="prior_strength"):
        TurnerModel(prior_strength=-1.0)
    assert grammar_of(ml_collections.ConfigDict({"name": "neural"})) == "stacking"


# --------------------------------------------------------------------------- parameter files


@pytest.mark.parametrize("ext", [".json", ".npz"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_parameter_files_are_lossless(tmp_path, ext, dtype):
    model = _perturbed(TurnerModel(param_dtype=dtype), seed=2)
    params = model.inside.params_dict()
    path = tmp_path / f"trained{ext}"
    layers.save_params(params, path, provenance={"step": 7})
    again = layers.load_params(path, dtype=dtype)
    assert list(again["special_hairpins"]) == list(params["special_hairpins"])
    for key in params:
        if key == "special_hairpins":
            for seq, value in params[key].items():
                assert np.asarray(again[key][seq]).tobytes() == np.asarray(value).tobytes()
        else:
            assert np.asarray(again[key]).dtype == np.dtype(dtype)
            assert np.asarray(again[key]).tobytes() == np.asarray(params[key]).tobytes(), key
    assert layers.read_provenance(path) == {"step": 7}
    # the stacking grammar too
    stacking = layers.init_params(jax.random.key(0), dtype=dtype)
    layers.save_params(stacking, tmp_path / f"s{ext}")
    loaded = layers.load_params(tmp_path / f"s{ext}", dtype=dtype)
    assert sorted(loaded) == sorted(stacking)
    assert all(np.asarray(loaded[k]).tobytes() == np.asarray(stacking[k]).tobytes() for k in stacking)


def test_parameter_files_par_names_and_errors(tmp_path):
    model = _perturbed(TurnerModel(), seed=3, scale=0.1)
    params = model.inside.params_dict()
    layers.save_params(params, tmp_path / "t.par", provenance={"run": "x"})
    assert "provenance" in (tmp_path / "t.par").read_text()
    again = layers.load_params(tmp_path / "t.par")
    want = layers.load_parameter_file(tmp_path / "t.par")
    np.testing.assert_array_equal(again["int21"], want["int21"])
    np.testing.assert_allclose(again["stack"], params["stack"], atol=0.0051)  # 0.01 kcal/mol units
    # names
    np.testing.assert_array_equal(layers.load_params("turner2004")["int11"], layers.turner2004()["int11"])
    np.testing.assert_array_equal(layers.load_params("default")["stack"], layers.default_params()["stack"])
    packaged = ROOT / "layers" / "data" / "rna_turner2004.json"
    np.testing.assert_array_equal(layers.load_params(packaged)["int22"], layers.turner2004()["int22"])
    names = [*layers.params_io.shipped_params(), *layers.params_io.ALIASES]  # names are not paths
    config = ml_collections.ConfigDict({"model": {"init": ""}})
    for name in names:
        config.model.init = name
        assert datasets.absolute_data_paths(config).model.init == name
    # errors name the file and what is wrong
    with pytest.raises(FileNotFoundError, match="missing.json"):
        layers.load_params(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="is a directory"):
        layers.load_params(tmp_path)
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"x.txt.*\.json, \.npz or \.par"):
        layers.load_params(tmp_path / "x.txt")
    text = (tmp_path / "t.par").read_text()
    (tmp_path / "cut.json").write_text(json.dumps({"format": "foldax-params-1", "tables": {}})[:-5])
    with pytest.raises(ValueError, match="cut.json: not a readable JSON"):
        layers.load_params(tmp_path / "cut.json")
    layers.save_params(params, tmp_path / "shape.json")
    data = json.loads((tmp_path / "shape.json").read_text())
    data["tables"]["stack"] = data["tables"]["stack"][:5]
    (tmp_path / "shape.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"shape.json: .*'stack' has shape \(5, 6\)"):
        layers.load_params(tmp_path / "shape.json")
    (tmp_path / "cut.par").write_text("\n".join(text.splitlines()[:12]))
    with pytest.raises(ValueError, match="cut.par line"):
        layers.load_params(tmp_path / "cut.par")
    np.savez(tmp_path / "odd.npz", stack=np.zeros((5, 5, 5, 5)))
    with pytest.raises(ValueError, match=r"odd.npz: .*missing arrays \['loop', 'pair', 'unpaired'\]"):
        layers.load_params(tmp_path / "odd.npz")
    with pytest.raises(ValueError, match="stacking scores"):
        layers.save_params(layers.default_params(), tmp_path / "s.par")
    with pytest.raises(ValueError, match="NaN"):
        layers.save_params(dict(params, stack=jnp.full((6, 6), jnp.nan)), tmp_path / "nan.json")


# --------------------------------------------------------------------------- data cleaning


def _loops_brute_force(table, max_loop):
    """Interior loops / bulges longer than max_loop, by the definition (every pair, every inner position)."""
    n, out = len(table), []
    for i in range(n):
        j = table[i]
        if j <= i:
            continue
        inner = [k for k in range(i + 1, j) if table[k] > k and not any(
            p < k and table[p] > table[k] for p in range(i + 1, k) if table[p] > p)]
        if len(inner) == 1:
            k = inner[0]
            unpaired = (k - i - 1) + (j - table[k] - 1)
            if unpaired > max_loop:
                out.append((i, j, k, int(table[k]), unpaired))
    return out


def _random_table(rng, n, p_open=0.3):
    table, stack = -np.ones(n, np.int32), []
    for i in range(n):
        r = rng.random()
        if r < p_open:
            stack.append(i)
        elif r < 2 * p_open and stack and i - stack[-1] > 3:
            j = stack.pop()
            table[i], table[j] = j, i
    return table


def test_long_loops_found_and_opened():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(10, 90))
        table = _random_table(rng, n, p_open=float(rng.uniform(0.05, 0.3)))
        max_loop = int(rng.integers(2, 12))
        found = datasets.long_interior_loops(table, max_loop)
        assert found == _loops_brute_force(table, max_loop), trial
        opened, removed = datasets.open_long_loops(table, max_loop)
        assert datasets.long_interior_loops(opened, max_loop) == []
        kept = opened >= 0
        assert (opened[kept] == table[kept]).all()  # only pairs went
        assert removed == (np.count_nonzero(table >= 0) - np.count_nonzero(kept)) // 2
        assert (removed > 0) == bool(found)


def test_open_removes_the_shorter_helix():
    def table_of(pairs, n=50):
        table = -np.ones(n, np.int32)
        for i, j in pairs:
            table[i], table[j] = j, i
        return table

    outer = [(0, 49), (1, 48), (2, 47)]
    # inner helix of 1 pair: loop (2, 47)-(10, 14) has 7 + 32 unpaired; the inner helix goes
    opened, removed = datasets.open_long_loops(table_of(outer + [(10, 14)]), 30)
    assert removed == 1 and opened[10] == -1 and (opened[[0, 1, 2]] == [49, 48, 47]).all()
    # inner helix of 4 pairs: loop (2, 47)-(10, 20) has 7 + 26 unpaired; the outer helix (3 pairs) goes
    inner = [(10, 20), (11, 19), (12, 18), (13, 17)]
    opened, removed = datasets.open_long_loops(table_of(outer + inner), 30)
    assert removed == 3 and (opened[[0, 1, 2]] == -1).all() and opened[10] == 20


def test_clean_for_turner_counts_and_the_energy_model_accepts_the_result():
    from foldax.layers.energy import loop_energy

    rng = np.random.default_rng(1)
    examples = []
    for k in range(30):
        table = _random_table(rng, int(rng.integers(20, 60)), 0.12)
        if k % 3 == 0:  # inside a helix of 2 pairs, after 31..40 unpaired bases: an interior loop > 30
            gap = int(rng.integers(31, 41))
            inner = np.where(table >= 0, table + 3 + gap, -1)
            table = np.concatenate([[-1, -1], -np.ones(gap, np.int32), [-1], inner, [-1, -1, -1]]).astype(np.int32)
            n = len(table)
            for i, j in ((0, n - 1), (1, n - 2), (2 + gap, n - 3)):
                table[i], table[j] = j, i
        n = len(table)
        seq = "".join(rng.choice(list("ACGUN"), n, p=[0.24, 0.24, 0.24, 0.24, 0.04]))
        examples.append({"id": f"r{k}", "sequence": seq, "length": n, "pair_table": table})
    kept, counts = datasets.clean_for_turner(examples)
    n_nc = sum(datasets.noncanonical_pairs(ex["sequence"], ex["pair_table"]).size for ex in examples)
    assert counts["noncanonical_pairs"] == n_nc > 0 and counts["dropped"] == 0 and len(kept) == 30
    assert counts["long_loops"] > 0 and counts["long_loop_pairs_removed"] >= counts["long_loops"]
    tokens, lengths = layers.encode_batch([ex["sequence"] for ex in kept], buckets=None)
    tables = np.full(tokens.shape, -1, np.int32)
    for b, ex in enumerate(kept):
        tables[b, : ex["length"]] = ex["pair_table"]
        assert datasets.noncanonical_pairs(ex["sequence"], ex["pair_table"]).size == 0
        assert set(np.flatnonzero(ex["pair_table"] >= 0)) <= set(np.flatnonzero(examples[b]["pair_table"] >= 0))
    _, valid = loop_energy(layers.turner2004(), tokens, tables, lengths)
    assert np.asarray(valid).all()
    untouched = [ex for ex, k in zip(examples, kept) if k is ex]
    assert all(datasets.noncanonical_pairs(ex["sequence"], ex["pair_table"]).size == 0 for ex in untouched)
    dropped, counts = datasets.clean_for_turner(examples, noncanonical="drop", long_loops="drop")
    assert len(dropped) == 30 - counts["dropped"] and counts["dropped"] > 0
    same, counts = datasets.clean_for_turner(examples, noncanonical="keep", long_loops="keep")
    assert all(a is b for a, b in zip(same, examples)) and not any(counts.values())


def _write_files(folder):
    from foldax.data.formats import RnaRecord, write_records

    seqs = {"ok": ("GGGGAAACCCC", "((((...))))"),
            "noncanonical": ("GAGGAAACACC", "((((...))))"),  # A-C and G-A... pairs
            "long_loop": ("G" + "A" * 40 + "GAAAAC" + "A" * 3 + "C", "(" + "." * 40 + "(....)" + "..." + ")")}
    for split in ("train", "valid", "test"):
        records = [RnaRecord(f"{split}_{name}", s, from_dot_bracket(d)) for name, (s, d) in seqs.items()]
        write_records(Path(folder) / f"{split}.dbn", records)
    return {s: str(Path(folder) / f"{s}.dbn") for s in ("train", "valid", "test")}


def test_load_splits_cleans_train_and_valid_for_turner_and_says_so(tmp_path):
    files = _write_files(tmp_path)
    cfg = ml_collections.ConfigDict({"source": "files", "train_files": files["train"], "valid_files": files["valid"],
                                     "eval_files": files["test"], "max_length": 0, "short_hairpins": "drop",
                                     "noncanonical_pairs": "auto", "long_loops": "auto"})
    plain = datasets.load_splits(cfg, min_hairpin=3)
    turner = datasets.load_splits(cfg, min_hairpin=3, grammar="turner")
    for split in ("train", "valid"):
        assert "2 non-canonical pairs removed from 1 structures" in turner.sources[split], turner.sources[split]
        assert "1 interior loops > 30 in 1 structures opened (1 pairs removed)" in turner.sources[split]
        assert "non-canonical" not in plain.sources[split]
        by_id = {ex["id"]: ex for ex in turner[split]}
        assert (by_id[f"{split}_noncanonical"]["pair_table"] >= 0).sum() == 4  # G-C, G-C kept
        assert (by_id[f"{split}_long_loop"]["pair_table"] >= 0).sum() == 2
    for a, b in zip(turner["test"], plain["test"]):  # the test split keeps its references
        np.testing.assert_array_equal(a["pair_table"], b["pair_table"])
    assert "opened" in datasets.describe_splits(turner)
    cfg.long_loops = "drop"
    dropped = datasets.load_splits(cfg, min_hairpin=3, grammar="turner")
    assert len(dropped["train"]) == 2 and "1 with interior loops > 30 dropped" in dropped.sources["train"]
    cfg.noncanonical_pairs = "sometimes"
    with pytest.raises(ValueError, match="noncanonical_pairs"):
        datasets.load_splits(cfg, min_hairpin=3, grammar="turner")


# --------------------------------------------------------------------------- eval with impossible references


@pytest.mark.slow
def test_eval_leaves_impossible_references_out_of_ll():
    from foldax.model.decoding import eval_sums, finalize

    model = TurnerModel(num_chunks=CHUNKS)
    batch = {"tokens": layers.encode_batch(["GGGGAAACCCC", "GAGGAAACACC"], buckets=None)[0],
             "lengths": np.array([11, 11], np.int32), "weights": np.ones(2, np.float32),
             "pair_table": np.stack([from_dot_bracket("((((...))))")] * 2).astype(np.int32)}
    metrics = finalize(nnx.jit(eval_sums, static_argnames=("decoders",))(model, batch, decoders=("best",)))
    want = float(layers.log_prob(layers.turner2004(), batch["tokens"][0], batch["pair_table"][0],
                                 num_chunks=CHUNKS)) / 11
    assert metrics["n_impossible"] == 1 and metrics["n_seqs"] == 2
    np.testing.assert_allclose(metrics["ll_per_nt"], want, rtol=1e-5)


# --------------------------------------------------------------------------- the loss (Turner DP)


def _batch():
    seqs = ["GGGGAAACCCCGCGCAAAAGCGCA", "GCGCAAAAGCGCAUCG", "ACGUAGCUAGC"]
    dbns = ["((((...))))((((....)))).", "((((....))))....", "..........."]
    tokens, lengths = layers.encode_batch(seqs, buckets=None)
    table = np.full(tokens.shape, -1, np.int32)
    for b, d in enumerate(dbns):
        table[b, : len(seqs[b])] = from_dot_bracket(d)
    return {"tokens": tokens, "lengths": lengths, "pair_table": table, "weights": np.ones(3, np.float32)}


@pytest.mark.slow
def test_loss_and_its_gradient_match_log_prob_and_finite_differences():
    model = _perturbed(TurnerModel(prior_strength=1e-3, param_dtype=jnp.float64, num_chunks=CHUNKS), seed=4,
                       scale=0.2)
    batch = _batch()
    loss, aux = cll_loss(model, batch)
    params = model.inside.params_dict()
    lp = layers.log_prob(params, batch["tokens"], batch["pair_table"], batch["lengths"], num_chunks=CHUNKS)
    np.testing.assert_allclose(float(aux["data_loss"]), -float(lp.sum()) / int(batch["lengths"].sum()), rtol=1e-10)
    np.testing.assert_allclose(float(loss), float(aux["data_loss"]) + float(model.prior_penalty()), rtol=1e-12)
    assert int(aux["n_invalid"]) == 0

    assert_gradient_matches_finite_differences(lambda m: cll_loss(m, batch)[0], model)
    # the +inf entries: gradient exactly 0
    named = nnx.grad(lambda m: cll_loss(m, batch)[0])(model)
    for name, entries in model.inside.forbidden:
        assert (np.asarray(named["inside"][name][...]).reshape(-1)[list(entries)] == 0).all()


@pytest.mark.slow
def test_adam_steps_keep_everything_finite_and_lower_the_loss():
    model = TurnerModel(prior_strength=1e-3, num_chunks=CHUNKS)
    opt = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
    batch = _batch()
    losses = []
    for _ in range(6):
        loss, aux = cll_step(model, opt, batch)
        losses.append(float(loss))
        assert np.isfinite(float(aux["grad_norm"])) and float(aux["grad_norm"]) > 0
        for leaf in jax.tree.leaves(nnx.state((model, opt))):  # parameters and Adam's moments
            assert np.isfinite(np.asarray(leaf)).all()
    assert losses[-1] < losses[0]
    assert float(model.prior_penalty()) > 0
    tables = model.inside.params_dict()
    assert np.isinf(np.asarray(tables["hairpin"][:3])).all() and np.isfinite(np.asarray(tables["hairpin"][3:])).all()


# --------------------------------------------------------------------------- configs/turner.py end to end


def _turner_config(**changes):
    """configs/turner.py on the dummy ArchiveII (tRNA held out), tiny and fast."""
    from foldax.train.main import apply_overrides, load_config_file

    config = load_config_file(str(ROOT / "configs" / "turner.py"))
    config.data.path = str(DUMMY)
    config.data.max_length = config.data.max_eval_length = 32
    config.data.buckets = config.data.eval_buckets = (32,)
    config.data.max_valid_examples = 0
    config.data.valid_families = ""  # the dummy ArchiveII is too small for whole validation families
    config.model.num_chunks = CHUNKS
    config.batch_size = 2
    config.eval_batch_size = 4
    config.num_train_steps = 6
    config.eval_every = config.checkpoint_every = 3
    config.optimizer.schedule = "constant"
    config.optimizer.warmup_steps = 0
    config.optimizer.learning_rate = 0.05
    config.decoders = ("mea", "best")
    config.progress_bar = False
    config.compilation_cache_dir = ""
    apply_overrides(config, [(key, str(value)) for key, value in changes.items()])
    return config


def _restored_state(workdir):
    from foldax.train import train as trainer

    restored = trainer.restore_for_inference(str(workdir), "latest")
    restored.manager.close()
    return restored.step, jax.tree.map(np.asarray, nnx.to_pure_dict(restored.state))


@pytest.mark.slow
def test_turner_config_trains_resumes_exactly_and_exports(tmp_path):
    from foldax.train import main as train_main
    from foldax.train import train as trainer

    config = _turner_config()
    straight = tmp_path / "straight"
    summary = trainer.train_and_evaluate(config, str(straight))
    assert summary["status"] == "finished" and summary["steps"] == 6
    assert np.isfinite(summary["test/ll_per_nt"]) and 0 <= summary["test/mea/f1"] <= 1
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["train/loss"]) for r in rows if "train/loss" in r)

    # a run stopped after its step-3 checkpoint and resumed ends bit for bit where the straight run did
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")
    (resumed / "summary.json").unlink()
    again = trainer.train_and_evaluate(config, str(resumed))
    assert again["resumed_from_step"] == 3 and again["steps"] == 6
    (step_a, a), (step_b, b) = _restored_state(straight), _restored_state(resumed)
    assert step_a == step_b == 6
    flat_a, tree_a = jax.tree.flatten(a)
    flat_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b and all(x.tobytes() == y.tobytes() for x, y in zip(flat_a, flat_b))

    # export: lossless .json / .npz with provenance, .par for ViennaRNA; all read back by layers.load_params
    restored = trainer.restore_for_inference(str(straight), "latest")
    restored.manager.close()
    tables = jax.device_get(nnx.merge(restored.graphdef, restored.state)[0].inside.params_dict())
    assert not np.array_equal(tables["stack"], layers.turner2004()["stack"])  # it trained
    for ext in (".json", ".npz"):
        out = tmp_path / f"exported{ext}"
        assert train_main.main(["export-params", "--workdir", str(straight), "--out", str(out),
                                "--checkpoint", "latest"]) == 0
        loaded = layers.load_params(out)
        for key, value in tables.items():
            if key != "special_hairpins":
                assert np.asarray(loaded[key]).tobytes() == np.asarray(value).tobytes(), key
        provenance = layers.read_provenance(out)
        assert provenance["step"] == 6 and provenance["model"]["name"] == "turner"
        assert provenance["checkpoint"] == "latest" and "fold" in provenance["data"]
    par = tmp_path / "exported.par"
    assert train_main.main(["export-params", "--workdir", str(straight), "--out", str(par),
                            "--checkpoint", "latest"]) == 0
    np.testing.assert_allclose(layers.load_params(par)["stack"], tables["stack"], atol=0.0051)
    # the exported file starts a new model where training ended, and eval runs on the run's config
    model = create_model(ml_collections.ConfigDict({"name": "turner", "init": str(tmp_path / "exported.json")}),
                         nnx.Rngs(0))
    assert np.asarray(model.inside.stack[...]).tobytes() == np.asarray(tables["stack"]).tobytes()
    metrics = trainer.evaluate_checkpoint(str(straight), split="valid")
    assert metrics["n_seqs"] > 0 and np.isfinite(metrics["ll_per_nt"])

    # foldax fold --params WORKDIR: the trained tables, in kcal/mol as from the exported file; --noLP too
    from foldax import fold as F

    folder = F.load_model(str(straight), checkpoint="latest")
    assert folder.energy_kT == layers.KT and layers.is_energy_params(folder.params)
    record = F.InputRecord("r", "GGGACGUAAGUCCAAAGGACGUAAGUCC")
    [result] = F.fold_records(folder, [record], no_lonely_pairs=True)
    assert result.is_energy and lonely_pairs(result.structure) == []
    assert result.energy == pytest.approx(float(layers.free_energy(tables, layers.encode(record.sequence),
                                                                   result.structure)), abs=1e-4)
    [exported] = F.fold_records(F.load_model(str(tmp_path / "exported.json")), [record], no_lonely_pairs=True)
    assert exported.energy == pytest.approx(result.energy, abs=1e-5)
    np.testing.assert_array_equal(exported.structure, result.structure)


def one_step(out: str) -> None:
    """One training step of configs/turner.py (dummy ArchiveII) on a fixed batch of 4; writes the state."""
    from foldax.train import train as trainer
    from foldax.train.datasets import load_splits
    from foldax.train.input_pipeline import InputPipeline, PipelineConfig

    config = _turner_config(batch_size=4)
    splits = load_splits(config.data, min_hairpin=3, grammar="turner", splits=("train",))
    batch = InputPipeline(splits["train"], PipelineConfig(batch_size=4, buckets=(32,), seed=1, shard_index=0,
                                                          shard_count=1)).make_batch(0)
    mesh = trainer.make_mesh()
    graphdef, host_state, schedule = trainer.create_state(config, 10)
    with jax.set_mesh(mesh):
        state = trainer.replicate(host_state, mesh)
        batch = trainer.to_global_batch(batch, mesh)
        assert len(batch["tokens"].sharding.device_set) == jax.device_count()
        step = trainer.make_train_step(graphdef, config, schedule, mesh)
        state, metrics = step(state, batch)
        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]
        arrays = {jax.tree_util.keystr(path): np.asarray(x) for path, x in flat}
        np.savez(out, loss=np.asarray(metrics["loss"]), devices=jax.device_count(), **arrays)


@pytest.mark.slow
def test_one_step_on_2_devices_equals_1_device(tmp_path):
    results = {}
    for devices in (1, 2):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   XLA_FLAGS=with_devices(devices), JAX_PLATFORMS="cpu")
        env.pop("JAX_NUM_CPU_DEVICES", None)
        out = tmp_path / f"{devices}.npz"
        proc = subprocess.run([sys.executable, str(Path(__file__)), "one-step", str(out)], env=env,
                              capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with np.load(out) as f:
            results[devices] = {k: f[k] for k in f.files}
    one, two = results[1], results[2]
    assert int(one.pop("devices")) == 1 and int(two.pop("devices")) == 2
    assert sorted(one) == sorted(two) and any("int22" in k for k in one)
    for key in one:
        assert np.isfinite(one[key]).all(), key
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-7, err_msg=key)


if __name__ == "__main__":
    if sys.argv[1] == "one-step":
        one_step(sys.argv[2])
