"""The engine and decoders under data parallelism: batch sharded over 2 CPU devices (auto and explicit meshes)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from compile_flags import with_devices

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, layers
    from jax.sharding import AxisType, PartitionSpec as P
    assert jax.device_count() == 2
    params = layers.init_params(jax.random.key(0), scale=1.0)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 5, (4, 40)), jnp.int32)
    lengths = jnp.asarray([40, 31, 0, 9], jnp.int32)
    loss = lambda p, x, n: layers.log_partition(p, x, n).sum()
    ref, ref_grad = layers.log_partition(params, tokens, lengths), jax.grad(loss)(params, tokens, lengths)
    ref_probs = layers.pair_probs(params, tokens, lengths)
    ref_best = layers.best_structure(params, tokens, lengths)
    ref_mea = layers.mea_structure(ref_probs, lengths)
    ref_log_p = layers.log_prob(params, tokens, ref_best, lengths)
    for axis_type in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((2,), ("data",), axis_types=(axis_type,))
        with jax.set_mesh(mesh):
            x, n = jax.device_put(tokens, P("data")), jax.device_put(lengths, P("data"))
            out = jax.jit(layers.log_partition)(params, x, n)
            grad = jax.jit(jax.grad(loss))(params, x, n)
            probs = layers.pair_probs(params, x, n)
            best = layers.best_structure(params, x, n)
            mea = layers.mea_structure(probs, n)
            log_p = layers.log_prob(params, x, best, n)
            samples = layers.sample_structures(jax.random.key(0), params, x, 3, n)
        assert len(out.sharding.device_set) == 2, out.sharding
        np.testing.assert_allclose(out, ref, rtol=1e-6)
        for k in ref_grad:
            np.testing.assert_allclose(grad[k], ref_grad[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(probs, ref_probs, atol=1e-6)
        np.testing.assert_array_equal(best, ref_best)
        np.testing.assert_array_equal(mea, ref_mea)
        np.testing.assert_allclose(log_p, ref_log_p, rtol=1e-5, atol=1e-5)
        assert samples.shape == (4, 3, 40)
    print("OK")
    """
)


def test_batch_sharded_over_two_devices_matches_one_device():
    env = dict(os.environ, XLA_FLAGS=with_devices(2), JAX_PLATFORMS="cpu")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")
