"""The exceptions jaxfn raises, and the one grammar their messages follow.

Every message is made by :func:`error` (or :func:`raise_all`, which collects several) and reads

    jaxfn: '<function>': <who> <did what>, but <what happened>; <the fix>.

so a user always sees which function, which parameter or output, expected versus got, and
what to do. ``jaxfn.gradcheck``'s messages open with ``jaxfn.gradcheck: '<function>':`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax


class AutogradFunctionError(Exception):
    """A misuse of a jaxfn function: a bad definition, argument, output or gradient.

    Raised as a subclass that is also a `TypeError` for wrong kinds and structures, and as one
    that is also a `ValueError` for wrong shapes and values, so `except TypeError` keeps working
    where Python would raise one; an unknown name read from `ctx` is also an `AttributeError`
    (`ctx.name`) or a `KeyError` (`ctx.saved_variables["name"]`), so `hasattr` and `in` work.
    Every message reads `jaxfn: '<function>': <who> <did what>, but <what happened>; <the fix>.`

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> f = jaxfn.autograd_function(lambda ctx, x: x.sum(), lambda ctx, g: jnp.ones(3), name="f")
    >>> try:
    ...     jax.grad(f)(jnp.ones(2))
    ... except jaxfn.AutogradFunctionError as err:
    ...     print(str(err).split(' with shape')[0])
    jaxfn: 'f': backward returned a gradient for 'x'
    """


class AutogradFunctionTypeError(AutogradFunctionError, TypeError):
    """A wrong kind or structure (an output that is not an array, a gradient for a string)."""


class AutogradFunctionValueError(AutogradFunctionError, ValueError):
    """A wrong shape or value (a gradient of shape (3,) for a (2, 4) parameter)."""


class ContextAttributeError(AutogradFunctionError, AttributeError):
    """An unknown name read from the context; also an ``AttributeError`` so ``hasattr`` works."""


class ArrayAttributeError(AutogradFunctionError, AttributeError):
    """A PyTorch tensor method used on a JAX or NumPy array inside forward or backward (`x.cpu()`,
    `x.le(0)`, `x.mul_(2)`); the message gives its JAX (or NumPy) spelling. Also an
    `AttributeError`, as Python's own error was."""


class ContextKeyError(AutogradFunctionError, KeyError):
    """An unknown key read from the context; also a ``KeyError`` so mappings behave."""

    def __str__(self) -> str:  # KeyError quotes its message; show it as written.
        return str(self.args[0])


class ContextIndexError(AutogradFunctionError, IndexError):
    """A position past the end of the context's per-parameter flags or saved values; also an
    ``IndexError``, so sequence protocols behave."""


class GradcheckError(AutogradFunctionError, AssertionError):
    """`jaxfn.gradcheck` found a gradient that disagrees with finite differences (or nothing to check).

    Also an `AssertionError`, as a failed check in a test. `gradcheck(..., raise_exception=False)`
    returns `False` instead of raising it.

    >>> import jax.numpy as jnp, jaxfn
    >>> wrong = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 3, name="wrong")
    >>> try:
    ...     jaxfn.gradcheck(wrong, jnp.ones(2))
    ... except jaxfn.GradcheckError as err:
    ...     print(str(err).split(';')[0])
    jaxfn.gradcheck: 'wrong': the gradient for 'x' disagrees with finite differences
    """


GRADCHECK = "jaxfn.gradcheck"


def gradcheck_of(function: str) -> str:
    """What gradcheck's messages about ``function`` open with: ``jaxfn.gradcheck: '<function>': ``."""
    return f"{GRADCHECK}: '{function}'"


def error(kind: type[AutogradFunctionError], function: str, sentence: str) -> AutogradFunctionError:
    """The exception for one problem of the function ``function``: ``jaxfn: '<function>': <sentence>``.

    ``function`` is the name of the jaxfn function, or :data:`GRADCHECK` (or
    :func:`gradcheck_of` a function) for gradcheck's own messages. The sentence ends with a
    full stop, added if it lacks one.
    """
    gradcheck = function == GRADCHECK or function.startswith(f"{GRADCHECK}: '")  # gradcheck's own, or gradcheck_of
    return kind((f"{function}: " if gradcheck else f"jaxfn: '{function}': ") + _sentence(sentence))


def raise_all(kind_and_sentences: list[tuple[type[AutogradFunctionError], str]], function: str) -> None:
    """Raise one error listing every (kind, sentence) problem of one call; nothing if none.

    The error is a ValueError kind only when every problem is one (a shape mismatch).
    """
    if not kind_and_sentences:
        return
    kinds = {kind for kind, _ in kind_and_sentences}
    kind = kinds.pop() if len(kinds) == 1 else AutogradFunctionTypeError
    if len(kind_and_sentences) == 1:
        raise error(kind, function, kind_and_sentences[0][1])
    lines = "\n".join(f"  - {_sentence(sentence)}" for _, sentence in kind_and_sentences)
    raise error(kind, function, f"{len(kind_and_sentences)} problems in one call:\n{lines}")


def _sentence(text: str) -> str:
    return text if text.endswith((".", "\n")) else text + "."


def a(word: str) -> str:
    """``word`` with its indefinite article: 'an int', 'a str', 'an array of shape (3,)'."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def type_name(value: object) -> str:
    """How messages name the type of a value, with its article: 'an int', 'a NoneType'."""
    return a(type(value).__name__)


def unknown_name(what: str, name: object, known: Iterable[str]) -> str:
    """The sentence for a name that does not exist, listing the ones that do."""
    listed = ", ".join(repr(k) for k in sorted(str(k) for k in known)) or "none"
    return f"{what} has no {name!r}; the names it has are: {listed}."


_WHY = (
    "under jax.jit (and jax.vmap, lax.scan, jax.checkpoint) {role} runs on tracers, abstract arrays whose values "
    "are known only when the compiled program runs"
)
# A tracer error raised inside the user's forward or backward (a Python if on an array's value,
# float(x), NumPy on a traced array) under jax.jit: what the user did, in jaxfn's words.
_WHAT = {
    # if x > 0:, while, and/or, assert on an array
    jax.errors.TracerBoolConversionError: "used the value of an array as a Python bool (an if, while, and/or or "
    "assert on an array)",
    # int(x), operator.index(x), a list indexed by an array
    jax.errors.TracerIntegerConversionError: "used the value of an array as a Python int (int(), or an array as "
    "an index into a list or tuple)",
    # np.asarray(x), a NumPy function, x.tolist()
    jax.errors.TracerArrayConversionError: "handed an array to NumPy (np.asarray, a NumPy function, .tolist())",
    # float(x), x.item(), a traced value as a shape (and its subclass above, TracerBoolConversionError)
    jax.errors.ConcretizationTypeError: "read the concrete value of an array (float(), .item(), or an array "
    "value used as a shape, a size or a static argument)",
    # x[x < 0], x.at[x < 0].set(0): an index whose size is the data's
    jax.errors.NonConcreteBooleanIndexError: "indexed an array with a boolean mask (x[x < 0], x.at[x < 0].set(0)), "
    "whose result's size depends on the values",
}
TRACER_ERRORS = tuple(_WHAT)
_FIX = {
    jax.errors.NonConcreteBooleanIndexError: "for a masked update or read, use jnp.where in place of the mask: a "
    "masked update (R's x[x < 0] <- 0) is jnp.where(x < 0, 0, x), a masked read (x[x > 0].sum()) is "
    "jnp.where(x > 0, x, 0).sum(); for a compaction whose rows are the output (x[mask] returned, "
    "x.masked_select(mask)), give the output a fixed size n (an upper bound, such as mask.size) and pad it: "
    "(i,) = jnp.nonzero(mask, size=n, fill_value=0); rows = jnp.where((jnp.arange(n) < mask.sum())[:, None], "
    "x[i], 0), and return mask.sum() too if the caller needs the count",
    jax.errors.TracerArrayConversionError: "use jax.numpy instead of NumPy, or make it host code with "
    "host=True (autograd_function(..., host=True), or host = True on a jaxfn.Function), which runs NumPy "
    "forward and backward through jax.pure_callback",
}
_VMAP_RULE_NUMPY = (
    "a vmap rule runs as JAX code on the batched arrays, a host=True function's too (as PyTorch's runs as Python "
    "over batched tensors): call the function itself on them (its .apply, one host call for the whole batch) or "
    "use jax.numpy"
)
_DEFAULT_FIX = (
    "keep values as arrays: branch with jnp.where(condition, a, b) or jax.lax.cond, convert with x.astype(...); "
    "where the value comes from a Python flag or number passed through jax.jit (traced, so an array too), mark "
    "that argument static where jax.jit is applied: jax.jit(f, static_argnames=('name',)) or "
    "static_argnums=(position,); for NumPy code, use host=True"
)
_STATIC_FIX = (
    "but '{name}' is traced ({aval}), an abstract array whose value is known only when the compiled program runs "
    "(a Python flag or number passed through jax.jit arrives so); mark it static where jax.jit is applied: "
    "jax.jit(f, static_argnames=('{name}',)) (by the name the jitted f gives it) or static_argnums=(its "
    "position,){differentiated}"
)
_IF_DIFFERENTIATED = (
    "; if it is a value being differentiated, keep it an array instead: jnp.where(condition, a, b) or jax.lax.cond"
)
_VMAP_FIX = (
    "but jax.vmap batches '{name}' ({aval} per example), so it is an abstract array holding one value per example; "
    "pass it unbatched where jax.vmap is applied (in_axes=None for it, when every example shares it), or keep it an "
    "array and branch with jnp.where(condition, a, b) or jax.lax.cond"
)
_LOOP_FIX = (
    "but '{name}' is traced by a JAX loop ({aval}: a lax.fori_loop index, or a value lax.scan or lax.while_loop "
    "carries or hands out), an abstract array whose value is known only when the loop runs; branch with "
    "jnp.where(condition, a, b) or jax.lax.cond, or, where it must be a Python value, loop in Python (for i in "
    "range(n): ...) so that it is one"
)
_TRACED_FIX = (
    "but '{name}' is traced ({aval}), an abstract array whose value is known only when the program runs; keep it an "
    "array and branch with jnp.where(condition, a, b) or jax.lax.cond; or, where it is a Python flag or number that "
    "a transformation traced, pass it as one: static where jax.jit is applied (jax.jit(f, "
    "static_argnames=('{name}',))), unbatched where jax.vmap is (in_axes=None for it), or a Python loop's index in "
    "place of a lax loop's"
)
_COMPACTION = (
    "{role} called {called}, whose output's size depends on the values (a compaction: which entries are kept), but "
    "{why}, and each array's shape must be known before its values are; give it a fixed size n, an upper bound (such "
    "as mask.size): {called}(..., {keyword}=n{fill}){example}, then tell the padding from the entries by their count "
    "(mask.sum() for a mask): jnp.where(jnp.arange(n) < count, rows, 0), and return the count too if the caller "
    "needs it"
)


def tracer_error_help(
    role: str, err: BaseException, parameter: tuple[str, Any] | None = None, traced_by: str | None = "jit"
) -> str:
    """jaxfn's sentence for a tracer error (one of ``TRACER_ERRORS``) raised in the user's ``role``
    ('forward', 'backward'...). ``parameter``: the name and value of forward's argument whose value
    JAX was asked for (``_jax_private.concretized`` found it), named with the fix for what
    ``traced_by`` it: 'jit' (``static_argnames``), 'vmap' (``in_axes=None``), 'loop' (a Python
    loop, or ``jnp.where``), None where that is not known (every fix, none claimed)."""
    kind = next(k for k in type(err).__mro__ if k in _WHAT)
    if role == "vmap" and kind is jax.errors.TracerArrayConversionError:  # host=True's too: a rule runs as JAX code
        return f"{role} {_WHAT[kind]}, but {_WHY.format(role=role)}; {_VMAP_RULE_NUMPY}"
    if parameter is None or kind is jax.errors.NonConcreteBooleanIndexError:
        return f"{role} {_WHAT[kind]}, but {_WHY.format(role=role)}; {_FIX.get(kind, _DEFAULT_FIX)}"
    name, value = parameter
    flag = jax.numpy.issubdtype(value.dtype, jax.numpy.integer) or jax.numpy.issubdtype(value.dtype, jax.numpy.bool_)
    template = {"jit": _STATIC_FIX, "vmap": _VMAP_FIX, "loop": _LOOP_FIX}.get(traced_by or "", _TRACED_FIX)
    fix = template.format(name=name, aval=f"{value.dtype}[]", differentiated="" if flag else _IF_DIFFERENTIATED)
    return f"{role} {_WHAT[kind]}: its argument '{name}', {fix}"


def compaction_help(role: str, called: str, keyword: str) -> str:
    """jaxfn's sentence for a function whose output's size depends on the values (``called``:
    ``jnp.nonzero``, ``jnp.argwhere``, ``x.nonzero``, ``jnp.unique``...) run in the user's ``role``
    under a trace, with the ``keyword`` that fixes its size (``size``; ``length`` for bincount)."""
    fill = ", fill_value=..." if keyword == "size" else ""
    example = ""
    if called.endswith(("nonzero", "where", "argwhere", "flatnonzero")):
        example = " (for a 1-D mask: (i,) = jnp.nonzero(mask, size=n, fill_value=0), then x[i])"
    why = _WHY.format(role=role)
    return _COMPACTION.format(role=role, called=called, why=why, keyword=keyword, fill=fill, example=example)
