"""The gallery's transformer block (examples/gallery/transformer_block.py) under checkpoint policies.

LayerNorm and GELU are gradchecked; the block's gradients equal plain autodiff's under every
policy; each policy keeps exactly the residuals it names, read from JAX's own saved-residual
report and from ``jaxfn.saved``; XLA's compiled memory orders the policies. Shapes are small and
the depth 2; timings stay out of the tests.
"""

import importlib
import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

import jaxfn
from jaxfn import _jax_private, _saves

pytestmark = pytest.mark.slow  # compiles training steps and trains a small model

GALLERY = Path(__file__).resolve().parent.parent / "examples" / "gallery"
if str(GALLERY) not in sys.path:
    sys.path.insert(0, str(GALLERY))

gallery = importlib.import_module("_gallery")
tb = importlib.import_module("transformer_block")

DEPTH = 2
f32 = np.float32
# what each policy keeps of each block, by checkpoint name ("mlp.z" is the block's own name)
NAMED = {
    "everything": ["layernorm.x_hat", "layernorm.rstd", "layernorm.scale", "gelu.x"],
    "names: x_hat, rstd": ["layernorm.x_hat", "layernorm.rstd"],
    "names: gelu.x": ["gelu.x"],
    "names: mlp.z": ["mlp.z"],
    "nothing": [],
    "offload mlp.z": [],  # offloaded: JAX reports it as a device_put to host, its name gone
}
JAXFN_SAVES = {"layernorm.x_hat", "layernorm.rstd", "layernorm.scale", "gelu.x"}
NAMES = pytest.mark.skipif(not _saves.available(), reason="no save names on jax 0.10 with jax_remat3 on")


def _inputs(tokens=16, d_model=8, depth=DEPTH):
    return tb.example_inputs(tokens, d_model, depth)


def _unrolled_loss(block_fn, policy):
    """The model's loss with its blocks in a Python loop (under lax.scan a residual is a stacked
    output of the scan, and JAX's report shows no names); ``blocks`` is a list of parameter dicts."""
    body = tb.checkpointed(block_fn, policy)

    def loss(blocks, x, y):
        for p in blocks:
            x = body(p, x)
        return jnp.mean((x - y) ** 2)

    return loss


def _blocks(params):
    return [jax.tree.map(lambda a, i=i: a[i], params) for i in range(DEPTH)]


def _named_in_jax_report(f, *args):
    """The checkpoint names of the residuals JAX keeps, one per residual."""
    names = []
    for _, description in saved_residuals(f, *args):
        if description.startswith("named '"):
            names.append(description[len("named '") :].split("'", 1)[0])
    return names


# The two functions


def test_layernorm_gradcheck():
    rng = np.random.default_rng(1)
    x, scale, bias = rng.standard_normal((5, 8)), 1 + 0.1 * rng.standard_normal(8), rng.standard_normal(8)
    assert jaxfn.gradcheck(tb.layernorm, x, scale, bias)


def test_gelu_gradcheck():
    x = np.random.default_rng(2).standard_normal((5, 8)) * 3
    assert jaxfn.gradcheck(tb.gelu, x)


def test_forwards_match_the_plain_math():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((6, 8)), f32)
    scale, bias = jnp.linspace(0.5, 1.5, 8, dtype=f32), jnp.linspace(-1, 1, 8, dtype=f32)
    np.testing.assert_allclose(tb.layernorm(x, scale, bias), tb.plain_layernorm(x, scale, bias), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tb.gelu(x), tb.plain_gelu(x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(tb.gelu(x), jax.nn.gelu(x, approximate=False), rtol=1e-6, atol=1e-7)


def test_layernorm_computes_only_the_gradients_asked_for():
    x = jnp.asarray(np.random.default_rng(4).standard_normal((6, 8)), f32)
    scale, bias = jnp.ones(8, f32), jnp.zeros(8, f32)
    grad_x = jax.grad(lambda x: jnp.sum(tb.layernorm(x, scale, bias) ** 3))(x)
    plain = jax.grad(lambda x: jnp.sum(tb.plain_layernorm(x, scale, bias) ** 3))(x)
    np.testing.assert_allclose(grad_x, plain, rtol=1e-4, atol=1e-5)


# The block under each policy


@pytest.mark.parametrize("policy", list(tb.POLICIES))
def test_gradients_equal_plain_autodiff(policy):
    params, x, y = _inputs()
    block_fn, chosen = tb.POLICIES[policy]
    grads = tb.gradients(block_fn, chosen, params, x, y)
    plain = jax.grad(tb.loss_fn(tb.plain_block, None))(params, x, y)  # eager, no jit
    for name in params:
        assert grads[name].dtype == f32
        np.testing.assert_allclose(grads[name], plain[name], rtol=2e-4, atol=2e-6, err_msg=name)
    assert tb.largest_difference(grads, plain) < 1e-4


def test_gradients_equal_across_policies():
    params, x, y = _inputs()
    assert tb.assert_same_gradients(tb.CONTENDERS, params, x, y)  # raises where any differs


@NAMES
@pytest.mark.parametrize("policy", list(NAMED))
def test_policy_keeps_exactly_the_named_residuals(policy):
    """Read from JAX's own report (jax._src.ad_checkpoint.saved_residuals)."""
    params, x, y = _inputs()
    block_fn, chosen = tb.POLICIES[policy]
    names = _named_in_jax_report(_unrolled_loss(block_fn, chosen), _blocks(params), x, y)
    assert Counter(names) == Counter(NAMED[policy] * DEPTH)


@NAMES
def test_names_only_keeps_only_the_normalised_input():
    """The brief's example: under save_only_these_names("layernorm.x_hat") every named residual is it."""
    params, x, y = _inputs()
    policy = jax.checkpoint_policies.save_only_these_names("layernorm.x_hat")
    names = _named_in_jax_report(_unrolled_loss(tb.block, policy), _blocks(params), x, y)
    assert names == ["layernorm.x_hat"] * DEPTH


@NAMES
@pytest.mark.parametrize("policy", list(NAMED))
def test_jaxfn_saved_agrees_with_jax(policy):
    params, x, y = _inputs()
    block_fn, chosen = tb.POLICIES[policy]
    loss = _unrolled_loss(block_fn, chosen)
    jax_rows = [(tuple(a.shape), d) for a, d in saved_residuals(loss, _blocks(params), x, y) if np.prod(a.shape)]
    report = jaxfn.saved(loss, _blocks(params), x, y)
    rows = [r for r in report if r.nbytes]
    assert len(rows) == len(jax_rows)
    assert report.nbytes == sum(int(np.prod(s)) * 4 for s, _ in jax_rows)  # all float32
    attributed = [f"{r.function}.{r.save}" for r in rows if r.function]
    assert Counter(attributed) == Counter(n for n in NAMED[policy] * DEPTH if n in JAXFN_SAVES)
    assert Counter(tb.residual_name(r) for r in rows if tb.residual_name(r)) == Counter(NAMED[policy] * DEPTH)
    kinds = {f"{r.function}.{r.save}": r.kind for r in rows if r.function}
    expected = {"layernorm.x_hat": "new", "layernorm.rstd": "new", "layernorm.scale": "input", "gelu.x": "input"}
    assert kinds == {n: k for n, k in expected.items() if n in kinds}


@pytest.mark.skipif(_jax_private.remat3(), reason="with jax_remat3 on, JAX reports no offloaded residual")
def test_offload_on_cpu_is_a_host_residual_in_name_only():
    """On CPU the offloaded residual is typed as host memory but compiles to the same program as
    keeping it: XLA's temporaries equal those of saving mlp.z, and no host memory is used."""
    params, x, y = _inputs()
    block_fn, offload = tb.POLICIES["offload mlp.z"]
    loss = _unrolled_loss(block_fn, offload)
    hosts = [d for a, d in saved_residuals(loss, _blocks(params), x, y) if "<host>" in a.str_short()]
    assert len(hosts) == DEPTH and all(d.startswith("output of device_put") for d in hosts)
    if jax.devices()[0].platform != "cpu":
        pytest.skip("the CPU lowering is what is checked below")
    assert not tb.offload_applies()
    steps = {
        n: gallery.compiled(tb.train_step(*tb.POLICIES[n], 0.1), params, x, y)
        for n in ("names: mlp.z", "offload mlp.z")
    }
    kept, offloaded = (steps[n].memory_analysis() for n in ("names: mlp.z", "offload mlp.z"))
    assert offloaded.temp_size_in_bytes == kept.temp_size_in_bytes
    assert offloaded.host_temp_size_in_bytes == 0


def _temps(tokens=128, d_model=32):
    """XLA's temporaries of each contender's training step, compiled only (nothing runs)."""
    params, x, y = (jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), v) for v in _inputs(tokens, d_model))
    executables = {n: gallery.compiled(tb.train_step(b, p, 0.1), params, x, y) for n, (b, p) in tb.CONTENDERS.items()}
    return {n: gallery.memory(e)["temp"] for n, e in executables.items()}, executables


def test_memory_orders_the_policies():
    temps, executables = _temps()
    assert temps["plain JAX autodiff"] >= temps["everything"]
    for names in ("names: x_hat, rstd", "names: gelu.x", "names: mlp.z"):
        assert temps["everything"] >= temps[names] >= temps["nothing"], (names, temps)
    assert temps["everything"] > temps["nothing"]
    # gelu.x names the copy gelu's backward reads, not the matmul's output: the first matmul is
    # still recomputed (its output feeds gelu's forward, recomputed for W2's gradient); mlp.z spares it
    matmuls = {n: tb.matmuls(e) for n, e in executables.items()}
    assert matmuls["everything"] == matmuls["names: mlp.z"] == matmuls["plain JAX autodiff"]
    assert matmuls["names: gelu.x"] == matmuls["nothing"] == matmuls["everything"] + 1


@NAMES
def test_kept_per_block_names_what_jaxfn_saved_reports():
    params, x, y = _inputs()
    kept = {n: tb.kept_per_block(b, p, params, x) for n, (b, p) in tb.CONTENDERS.items()}
    assert kept["names: x_hat, rstd"] == "layernorm.x_hat, layernorm.rstd"
    assert kept["names: gelu.x"] == "gelu.x"
    assert kept["names: mlp.z"] == "mlp.z"
    assert kept["nothing"] == "its arguments only"
    assert kept["offload mlp.z"] == "1 offloaded"
    assert kept["everything"].startswith("layernorm.x_hat, layernorm.rstd, layernorm.scale, gelu.x")
    count, nbytes = tb.kept_by_loss(*tb.POLICIES["nothing"], params, x, y)
    assert (count, nbytes) == (2, (DEPTH + 1) * x.nbytes)  # each block's input (stacked) and the output


def test_the_script_trains_and_plots(plot_png, capsys):
    path = plot_png
    tb.main(["--tokens", "16", "--d-model", "8", "--depths", "2", "--steps", "2", "--plot", str(path)])
    out = capsys.readouterr().out
    assert path.stat().st_size > 0
    for name in tb.POLICIES:
        assert f"| {name} |" in out or (name == tb.OFFLOADED and "skipped on cpu" in out)
    assert "| plain JAX autodiff |" in out
