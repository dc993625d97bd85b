"""One grammar for every message: each raise in the package goes through jaxfn._errors.error,
and the messages users see open with 'jaxfn: '<function>': ' (or 'jaxfn.gradcheck: ')."""

import ast
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxfn

PACKAGE = Path(jaxfn.__file__).resolve().parent
# Exceptions raised and caught inside the package, never seen by a user.
INTERNAL = {"Unkeyable", "_PythonOutput"}
# Python's own protocol: `hasattr(ctx, "__deepcopy__")` must get a silent AttributeError.
PROTOCOL = "AttributeError(name)"
# A user's own exception from host code (host=True), raised again as itself.
RERAISED = "raised"


def _raises():
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                yield path.name, node.lineno, node.exc


def _allowed(exc: ast.expr) -> bool:
    if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name):
        if exc.func.id == "error":
            return True
        if exc.func.id in INTERNAL:
            return True
    if isinstance(exc, ast.Name) and exc.id in INTERNAL:
        return True
    return ast.unparse(exc) in (PROTOCOL, RERAISED)


def test_every_raise_goes_through_the_one_helper():
    offenders = [f"{name}:{line}: raise {ast.unparse(exc)}" for name, line, exc in _raises() if not _allowed(exc)]
    assert offenders == []
    assert sum(1 for _ in _raises()) > 30  # the walk sees the package's raises


def test_protocol_attribute_errors_are_only_for_dunder_names():
    for path in sorted(PACKAGE.glob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "raise AttributeError(name)" in line:
                context = "\n".join(lines[max(0, i - 2) : i + 1])
                assert 'startswith("__")' in context, f"{path.name}:{i + 1}"


def _message_of(call):
    with pytest.raises(jaxfn.AutogradFunctionError) as info:
        call()
    return str(info.value).split("\n--------------------")[0]


MISUSES = {
    "definition": lambda: jaxfn.autograd_function(42, lambda ctx, g: g, name="f"),
    "arguments": lambda: jaxfn.autograd_function(lambda ctx, x: x, lambda ctx, g: g, name="f")(1, 2),
    "output": lambda: jaxfn.autograd_function(lambda ctx, x: None, lambda ctx, g: g, name="f")(jnp.ones(2)),
    "gradient shape": lambda: jax.grad(
        lambda x: jaxfn.autograd_function(lambda ctx, x: x.sum(), lambda ctx, g: jnp.ones(3), name="f")(x)
    )(jnp.ones(2)),
    "gradient count": lambda: jax.grad(
        lambda x: jaxfn.autograd_function(lambda ctx, x: x.sum(), lambda ctx, g: (g, g), name="f")(x)
    )(jnp.ones(2)),
    "unknown saved name": lambda: jax.grad(
        lambda x: jaxfn.autograd_function(
            lambda ctx, x: (ctx.save_for_backward(x=x), x.sum())[1],
            lambda ctx, g: ctx.saved_variables.y,
            name="f",
        )(x)
    )(jnp.ones(2)),
    "mark_dirty": lambda: jaxfn.autograd_function(
        lambda ctx, x: (ctx.mark_dirty(x + 1), x)[1], lambda ctx, g: g, name="f"
    )(jnp.ones(2)),
    "forward mode": lambda: jax.jvp(
        jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * g, name="f", forward_mode=True),
        (jnp.ones(2),),
        (jnp.ones(2),),
    ),
    "gradcheck": lambda: jaxfn.gradcheck(
        jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 3, name="f"), jnp.ones(2)
    ),
    "gradcheck order": lambda: jaxfn.gradcheck(lambda x: x, jnp.ones(2), order=3),
}


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_messages_follow_the_grammar(misuse):
    message = _message_of(MISUSES[misuse])
    assert re.match(r"^jaxfn(: '[^']+': |\.gradcheck: )\S", message), message
    assert message.rstrip().endswith("."), message
    assert not re.search(r"\ba [aeiou]\w*", message.replace("a unit", "")), message  # "a int", "a object"
    assert not re.search(r"jaxfn: '[^']+': .*jaxfn: '", message), message  # no doubled opening
