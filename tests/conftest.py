import os
from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# XLA's compilations persist between runs, so a second quick loop mostly skips compiling (see
# CONTRIBUTING.md). Only XLA's work is reused: every test still traces, lowers and runs its code.
# JAX_COMPILATION_CACHE_DIR, when set, chooses the folder instead.
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", str(Path(__file__).resolve().parent.parent / ".jax-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
    """Run a test both without and under jax.jit."""
    return (lambda f: f) if request.param == "eager" else jax.jit
