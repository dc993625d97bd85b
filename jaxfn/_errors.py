"""The exceptions jaxfn raises, and the one grammar their messages follow."""

from __future__ import annotations

from collections.abc import Iterable


class AutogradFunctionError(Exception):
    """A misuse of a jaxfn function: a bad definition, argument, output or gradient.

    Raised as :class:`AutogradFunctionTypeError` (also a ``TypeError``) for wrong kinds and
    structures, and as :class:`AutogradFunctionValueError` (also a ``ValueError``) for wrong
    shapes and values, so ``except TypeError`` keeps working where Python would raise one.
    """


class AutogradFunctionTypeError(AutogradFunctionError, TypeError):
    """A wrong kind or structure (an output that is not an array, a gradient for a string)."""


class AutogradFunctionValueError(AutogradFunctionError, ValueError):
    """A wrong shape or value (a gradient of shape (3,) for a (2, 4) parameter)."""


class ContextAttributeError(AutogradFunctionError, AttributeError):
    """An unknown name read from the context; also an ``AttributeError`` so ``hasattr`` works."""


class ContextKeyError(AutogradFunctionError, KeyError):
    """An unknown key read from the context; also a ``KeyError`` so mappings behave."""

    def __str__(self) -> str:  # KeyError quotes its message; show it as written.
        return str(self.args[0])


class GradcheckError(AutogradFunctionError, AssertionError):
    """``jaxfn.gradcheck`` found a gradient that disagrees with finite differences."""


def prefix(name: str) -> str:
    """The opening words of every message about the function ``name``."""
    return f"jaxfn: '{name}'"


def raise_all(problems: list[tuple[type[AutogradFunctionError], str]]) -> None:
    """Raise one error listing every (kind, message) problem of one call; nothing if none.

    The error is a ValueError kind only when every problem is one (a shape mismatch).
    """
    if not problems:
        return
    kinds = {kind for kind, _ in problems}
    kind = kinds.pop() if len(kinds) == 1 else AutogradFunctionTypeError
    if len(problems) == 1:
        raise kind(f"jaxfn: {problems[0][1]}")
    lines = "\n".join(f"  - {message}" for _, message in problems)
    raise kind(f"jaxfn: {len(problems)} problems in one call:\n{lines}")


def unknown_name(what: str, name: object, known: Iterable[str]) -> str:
    """The message for a name that does not exist, listing the ones that do."""
    known = sorted(str(k) for k in known)
    listed = ", ".join(repr(k) for k in known) if known else "none"
    return f"{what} has no {name!r}; the names it has are: {listed}."
