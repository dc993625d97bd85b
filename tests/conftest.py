import jax
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
    """Run a test both without and under jax.jit."""
    return (lambda f: f) if request.param == "eager" else jax.jit
