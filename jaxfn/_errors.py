"""The exceptions jaxfn raises, and the one grammar their messages follow.

Every message is made by :func:`error` (or :func:`raise_all`, which collects several) and reads

    jaxfn: '<function>': <who> <did what>, but <what happened>; <the fix>.

so a user always sees which function, which parameter or output, expected versus got, and
what to do. ``jaxfn.gradcheck``'s messages open with ``jaxfn.gradcheck: '<function>':`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable


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
