"""What ported code raises inside forward and backward, said in jaxfn's words: PyTorch's tensor methods
with their JAX and NumPy spellings (one table), and JAX's tracer errors (a Python flag that ``jax.jit``
traced, by name).

A PyTorch habit on a JAX array (``x.cpu()``, ``x.le(0)``, ``x.sum(dim=1)``, ``x.mul_(2)``), or on
a host function's NumPy array (``z.data.cpu()``: NumPy's ``.data`` is a ``memoryview``), raises
Python's ``AttributeError`` or ``TypeError``; :func:`call` raises jaxfn's error instead, naming the
function, the method and how JAX (or NumPy) spells it, chained ``from`` Python's. A tracer error
under a trace (an ``if`` on an array, ``float(x)``, NumPy on a traced array, ``jnp.nonzero(mask)``
without a size) gets what the code did and its fix, naming forward's argument where it is one.
Anything else passes through unchanged.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import linecache
import operator
import os
import re
from collections import ChainMap
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import jax
import numpy as np

from . import _jax_private
from ._errors import (
    ArrayAttributeError,
    AutogradFunctionError,
    AutogradFunctionTypeError,
    AutogradFunctionValueError,
    error,
)


def _read_methods(name: str) -> dict[str, tuple[str, str]]:
    """The table in the file ``name`` beside this module: per line a PyTorch tensor method (or
    attribute), its JAX spelling and its NumPy spelling (the JAX one with np. for jnp. where that
    field is empty): three fields separated by tabs; a line starting with # is a comment."""
    methods = {}
    for line in Path(__file__).with_name(name).read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            method, jax_spelling, numpy_spelling = line.split("\t")
            methods[method] = (jax_spelling, numpy_spelling or jax_spelling.replace("jnp.", "np."))
    return methods


# PyTorch's tensor method (or attribute) -> its JAX spelling, and its NumPy spelling (host code,
# host=True, gets NumPy arrays). An in-place method (mul_, clamp_) is spelled from its out-of-place
# one. The table is data: _pytorch_methods.tsv.
METHODS: dict[str, tuple[str, str]] = _read_methods("_pytorch_methods.tsv")

# PyTorch's keyword -> JAX's (and NumPy's) for the same argument.
KEYWORDS = {"dim": "axis", "dims": "axis", "keepdim": "keepdims", "unbiased": "ddof"}
# What PyTorch's method means, and what the array method of the same name does instead.
_SAME_NAME = {
    "view": ("a reshape", "takes a dtype: x.view(dtype) reads the array's bytes as another dtype"),
    "transpose": ("a swap of two axes", "takes a full permutation of the axes (x.transpose(2, 0, 1))"),
    "flatten": ("a flattening from axis start_dim", "takes no axis (x.flatten() flattens every axis)"),
}
_LIBRARIES = ("jax", "jaxlib", "numpy")
_LIBRARY_DIRS = tuple(os.path.dirname(module.__file__ or "") + os.sep for module in (jax, np))

_ARRAYS = (jax.Array, np.ndarray, np.generic, memoryview)
_NUMPY_ARRAY = "a NumPy array (host code gets NumPy arrays)"
_AT = "x = x.at[i].set(v)"
_UNEXPECTED_KEYWORD = re.compile(r"([\w.]+)\(\) got an unexpected keyword argument '(\w+)'")

Parameters = tuple[Sequence[str], Sequence[Any]]  # forward's parameter names, and the values it was called with


def call(
    function: str,
    role: str,
    user: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    parameters: Parameters = ((), ()),
) -> Any:
    """``user(*args, **kwargs)``, the user's ``role`` ('forward', 'backward', 'jvp', 'vmap',
    'setup_context') of the jaxfn function ``function``; where it raises a PyTorch habit (or a
    traced flag), jaxfn's error instead, chained ``from`` the user's (or JAX's). ``parameters``:
    forward's parameter names and values, to name the flag."""
    try:
        return user(*args, **kwargs) if kwargs else user(*args)
    except Exception as err:  # noqa: BLE001 - the user's own, passed through unless it is a habit
        said = translate(role, err, parameters)
        if said is None:
            raise
        raise error(said[0], function, said[1]) from err


def translate(role: str, err: BaseException, parameters: Parameters) -> tuple[type[AutogradFunctionError], str] | None:
    """What jaxfn says of ``err``, raised in the user's ``role``: the error's kind and its sentence
    (``call`` chains it from ``err``); None where ``err`` is none of the habits this module knows
    (then it propagates as it is)."""
    if isinstance(err, AutogradFunctionError):  # said already (a nested function's, a rule's)
        return None
    # the kind of the user's error: `except ValueError` still catches a ValueError's (no tracer error is one)
    kind = AutogradFunctionValueError if isinstance(err, ValueError) else AutogradFunctionTypeError
    if isinstance(err, _TRACER_ERRORS):  # under a trace (an eager call's are the user's own, unchanged)
        sentence = None if _jax_private.outside_traces(()) else _tracer_help(role, err, parameters)
    elif isinstance(err, AttributeError):
        kind = ArrayAttributeError
        installed = _raised_in_installed_code(err)  # a library the user calls made the call: not theirs to respell
        sentence = None if installed else _method_help(role, getattr(err, "name", None), getattr(err, "obj", None))
    elif isinstance(err, (TypeError, ValueError, NotImplementedError)):
        found = _failing_call(err)
        sentence = _keyword_help(role, err, found) if isinstance(err, TypeError) else None
        sentence = sentence or _call_help(role, err, found)
    else:
        return None
    return None if sentence is None else (kind, sentence)


def _raised_in_installed_code(err: BaseException) -> bool:
    """Whether the innermost frame of ``err``'s traceback outside JAX and NumPy is an installed
    package's (site-packages): a call the user's code did not make itself."""
    user = _user_trace(err)
    filename = user.tb_frame.f_code.co_filename if user else ""
    return "site-packages" in filename or "dist-packages" in filename


def _user_trace(err: BaseException) -> TracebackType | None:
    """The innermost entry of ``err``'s traceback whose frame is outside JAX and NumPy (the user's
    code, or a package it called); None where there is none."""
    trace, user = err.__traceback__, None
    while trace is not None:
        if not trace.tb_frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
            user = trace
        trace = trace.tb_next
    return user


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
_TRACER_ERRORS = tuple(_WHAT)
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


def _tracer_help(role: str, err: BaseException, parameters: Parameters) -> str:
    """The sentence for a tracer error (one of ``_TRACER_ERRORS``) raised in the user's ``role``
    under a trace (``translate`` checks): the fixed size for a compaction (``jnp.nonzero(mask)``,
    ``jnp.unique(x)``...); else, where the value JAX was asked for is one of forward's arguments
    (a traced scalar, the very value forward got), the one naming it with the fix for what traced
    it (``_jax_private.traced_by``: 'jit', ``static_argnames``; 'vmap', ``in_axes=None``; 'loop',
    a Python loop or ``jnp.where``; not known, every fix); else the general one."""
    found = _jax_private.sized_by_values(err)
    if found is not None:
        return _compaction_help(role, *found)
    kind = next(k for k in type(err).__mro__ if k in _WHAT)
    did, why = f"{role} {_WHAT[kind]}", _WHY.format(role=role)
    if role == "vmap" and kind is jax.errors.TracerArrayConversionError:  # host=True's too: a rule runs as JAX code
        return f"{did}, but {why}; {_VMAP_RULE_NUMPY}"
    tracer = _jax_private.concretized(err)
    named = [name for name, value in zip(*parameters) if value is tracer]
    if len(named) != 1 or getattr(tracer, "shape", None) != () or kind is jax.errors.NonConcreteBooleanIndexError:
        return f"{did}, but {why}; {_FIX.get(kind, _DEFAULT_FIX)}"
    flag = jax.numpy.issubdtype(tracer.dtype, jax.numpy.integer) or jax.numpy.issubdtype(tracer.dtype, jax.numpy.bool_)
    traced_by = _jax_private.traced_by(tracer)
    template = {"jit": _STATIC_FIX, "vmap": _VMAP_FIX, "loop": _LOOP_FIX}.get(traced_by or "", _TRACED_FIX)
    fix = template.format(name=named[0], aval=f"{tracer.dtype}[]", differentiated="" if flag else _IF_DIFFERENTIATED)
    return f"{did}: its argument '{named[0]}', {fix}"


def _compaction_help(role: str, called: str, keyword: str) -> str:
    """The sentence for a function whose output's size depends on the values (``called``:
    ``jnp.nonzero``, ``jnp.argwhere``, ``x.nonzero``, ``jnp.unique``...) run in the user's ``role``
    under a trace, with the ``keyword`` that fixes its size (``size``; ``length`` for bincount)."""
    fill = ", fill_value=..." if keyword == "size" else ""
    example = ""
    if called.endswith(("nonzero", "where", "argwhere", "flatnonzero")):
        example = " (for a 1-D mask: (i,) = jnp.nonzero(mask, size=n, fill_value=0), then x[i])"
    why = _WHY.format(role=role)
    return _COMPACTION.format(role=role, called=called, why=why, keyword=keyword, fill=fill, example=example)


def _method_help(role: str, name: str | None, obj: Any) -> str | None:
    """The sentence for a PyTorch tensor method (or attribute) ``name`` missing from ``obj``, a
    JAX or NumPy array (or the memoryview NumPy's ``.data`` is); None for anything else."""
    if not name or name.startswith("__") or not isinstance(obj, _ARRAYS):
        return None
    in_place = name not in METHODS and name.endswith("_") and name[:-1] in METHODS  # the table's own row first
    if name not in METHODS and not in_place:
        return None
    jax_spelling, numpy_spelling = METHODS[name[:-1] if in_place else name]
    jax_array = isinstance(obj, jax.Array)
    what = "a JAX array" if jax_array else _NUMPY_ARRAY
    spelling = jax_spelling if jax_array else numpy_spelling
    if isinstance(obj, memoryview):
        what = "a memoryview (what .data gives on a NumPy array: its raw memory, not PyTorch's tensor data)"
        spelling = f"{spelling}, without .data (the NumPy array itself is its data)"
    method = "a PyTorch tensor method" if not in_place else "PyTorch's in-place tensor method"
    fix = f"write {spelling}"
    if in_place and jax_array:
        fix = f"JAX arrays are immutable: write x = {spelling} and return the new array ({_AT} for a write at i)"
    elif in_place:
        fix = f"NumPy writes in place by assignment: x[...] = {spelling} (or an operator in place, x *= y)"
    return f"{role} used .{name}, {method}, on {what}, which has no .{name}; {fix}"


def _keyword_help(role: str, err: TypeError, failing: tuple[ast.Call, Any] | None) -> str | None:
    """The sentence for PyTorch's ``dim=``/``keepdim=`` given to a JAX or NumPy function (the
    ``failing`` call's function, found in the user's frame; a function of the user's own is theirs)."""
    found = _UNEXPECTED_KEYWORD.search(str(err))
    if found is None or found.group(2) not in KEYWORDS or failing is None:
        return None
    called, keyword = found.groups()
    short = called.rsplit(".", 1)[-1].lstrip("_")
    function = _value(failing[0].func, failing[1])
    # None for a function that is not JAX's or NumPy's (the user's own, whose keyword is theirs), and
    # for one that takes none of JAX's axis keywords: no spelling to give
    spelled = _spelled(keyword, function) if _calls_library(failing[0].func, function) else None
    if spelled is None:
        return None
    values = " (unbiased=True is ddof=1, unbiased=False ddof=0)" if keyword == "unbiased" else ""
    if short in ("max", "min") and keyword == "dim":
        values = (
            f" (x.{short}(axis=d) gives the values; x.arg{short}(axis=d) the indices, which PyTorch's {short}(dim) "
            "returns too)"
        )
    return (
        f"{role} passed PyTorch's keyword {keyword}= to {short}(), which JAX and NumPy call {spelled}=; write "
        f"{short}(..., {spelled}=...){values}"
    )


def _call_help(role: str, err: BaseException, found: tuple[ast.Call, Any] | None) -> str | None:
    """The sentence for the ``found`` failing call of the user's code where it is a PyTorch method on an
    array whose JAX and NumPy namesake differs (``x.size()``: an int; ``x.view(-1)``,
    ``x.transpose(0, 1)``, ``x.flatten(1)``), or arithmetic on the memoryview NumPy's ``.data``
    gives."""
    message = str(err)
    if isinstance(err, TypeError) and "'memoryview'" in message:
        return (
            f"{role} computed with a memoryview ({message}), which is what .data gives on a NumPy array (its raw "
            "memory, not PyTorch's tensor data); drop .data: the array itself is its data"
        )
    if found is None or not isinstance(func := found[0].func, ast.Attribute):
        return None
    node, frame = found
    array = _value(func.value, frame)
    # an array computed in place (x[None].view(-1)) is JAX's where JAX's method raised
    jax_array = isinstance(array, jax.Array) or (
        array is _UNKNOWN and _jax_private.raised_in_array_method(err, func.attr)
    )
    if not jax_array and not isinstance(array, np.ndarray):
        return None
    if func.attr == "size" and message == "'int' object is not callable":
        return (
            f"{role} called x.size(), PyTorch's tensor method, but an array's .size is its number of elements (an "
            "int, PyTorch's x.numel()); write x.shape (x.shape[d] for x.size(d))"
        )
    spelled = _same_name_spelling(func.attr, ast.unparse(func.value), node, frame, array)
    if spelled is None:
        return None
    torch_meaning, array_meaning = _SAME_NAME[func.attr]
    what = "a JAX array" if jax_array else _NUMPY_ARRAY
    spelled = spelled if jax_array else spelled.replace("jnp.", "np.")
    return (
        f"{role} called .{func.attr}({', '.join(ast.unparse(a) for a in node.args)}) as PyTorch's tensor method "
        f"({torch_meaning}) on {what}, whose .{func.attr} {array_meaning}; write {spelled}"
    )


def _same_name_spelling(name: str, array_source: str, node: ast.Call, frame: Any, array: Any) -> str | None:
    """How JAX spells PyTorch's ``x.view(...)``, ``x.transpose(d0, d1)`` or ``x.flatten(d)`` as
    called (``array_source`` the array's expression); None where the call is the array method's
    own use (a dtype view, a permutation, an order)."""
    if name not in _SAME_NAME or node.keywords:
        return None
    args = [_value(a, frame) for a in node.args]
    if any(a is _UNKNOWN for a in args):  # a name not read, an expression (*shape)
        return None
    ints = all(_is_int(a) for a in args)
    if name == "view":
        shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        if args and all(_is_int(d) for d in shape):
            return f"{array_source}.reshape({', '.join(ast.unparse(a) for a in node.args)})"
    if name == "transpose" and len(args) == 2 and ints and getattr(array, "ndim", None) != 2:
        return f"jnp.swapaxes({array_source}, {args[0]}, {args[1]})"
    if name == "flatten" and len(args) == 1 and ints:
        ndim = getattr(array, "ndim", None)
        start = args[0] % ndim if ndim else args[0]  # a negative start_dim as the axis it counts back to
        if start == 0:
            return f"{array_source}.reshape(-1)"
        kept = f"{array_source}.shape[0]" if start == 1 else f"*{array_source}.shape[:{start}]"
        return f"{array_source}.reshape({kept}, -1)"
    return None


_UNKNOWN = object()  # an expression of the failing call whose value is not read
# The integer arithmetic _value reads (a shape's x.shape[0] * x.shape[1], n // 2).
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _failing_call(err: BaseException) -> tuple[ast.Call, Any] | None:
    """The call the user's code was making when ``err`` was raised (the innermost frame of its
    traceback outside JAX and NumPy, at its instruction's source position), and that frame; None
    where it can't be read."""
    user = _user_trace(err)
    if user is None:
        return None
    code = user.tb_frame.f_code
    try:
        line, end_line, column, end_column = list(code.co_positions())[user.tb_lasti // 2]
        if line is None or end_line is None or column is None or end_column is None:
            return None
        lines = [linecache.getline(code.co_filename, n).encode() for n in range(line, end_line + 1)]
        if not lines[0]:  # no source
            return None
        lines[-1] = lines[-1][:end_column]
        lines[0] = lines[0][column:]
        node = ast.parse("(" + b"".join(lines).decode() + ")", mode="eval").body
    except (AttributeError, IndexError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    return (node, user.tb_frame) if isinstance(node, ast.Call) else None


def _value(node: ast.AST, frame: Any) -> Any:
    """The value of ``node`` in ``frame``: names, attributes, literals, integer arithmetic and
    indexing of tuples (``x.shape[0]``); _UNKNOWN for anything else (nothing is called)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return ChainMap(frame.f_locals, frame.f_globals, builtins.__dict__).get(node.id, _UNKNOWN)
    if isinstance(node, ast.Attribute):
        base = _value(node.value, frame)
        try:
            return _UNKNOWN if base is _UNKNOWN else getattr(base, node.attr, _UNKNOWN)
        except Exception:  # noqa: BLE001 - a property that raises: not read
            return _UNKNOWN
    if isinstance(node, (ast.Tuple, ast.List)):
        items = tuple(_value(item, frame) for item in node.elts)
        return _UNKNOWN if any(item is _UNKNOWN for item in items) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _value(node.operand, frame)
        if _is_int(operand):
            return -operand
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _value(node.left, frame), _value(node.right, frame)
        if _is_int(left) and _is_int(right) and (right or not isinstance(node.op, ast.FloorDiv)):
            return _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.Subscript):
        base, index = _value(node.value, frame), _value(node.slice, frame)
        if isinstance(base, tuple) and isinstance(index, int) and -len(base) <= index < len(base):
            return base[index]
    return _UNKNOWN


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _spelled(keyword: str, function: Any) -> str | None:
    """JAX's or NumPy's name for PyTorch's ``keyword`` in ``function``, the one the failing call
    calls: the one of ``axis``, ``axes``, ``dimension`` its signature has (``jnp.tensordot``:
    ``axes``); the table's (``axis``) where the function can't be read (_UNKNOWN: a method of an
    array computed in place); None where it has none of them."""
    if keyword not in ("dim", "dims"):
        return KEYWORDS[keyword]
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature (a ufunc, an ndarray method), or _UNKNOWN
        parameters = None
    if parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return KEYWORDS[keyword]  # no signature to read (a tracer's method takes **kwargs)
    return next((name for name in ("axis", "axes", "dimension") if name in parameters), None)


def _calls_library(called: ast.expr, function: Any) -> bool:
    """Whether the failing call calls a function of JAX's or NumPy's own (``jnp.sum``,
    ``jnp.linalg.norm``, an array's method): ``function``, the value of its expression ``called``
    read from the user's frame, has JAX's or NumPy's module. A method of an array computed in place
    (``(x > 0).sum(dim=1)``, its function _UNKNOWN) counts where arrays have that method; anything
    else (the user's own function) does not."""
    if function is _UNKNOWN:
        return isinstance(called, ast.Attribute) and any(hasattr(t, called.attr) for t in (jax.Array, np.ndarray))
    owner = getattr(function, "__func__", function)
    module = getattr(owner, "__module__", None)
    if not isinstance(module, str):  # a NumPy array's bound builtin method, a ufunc
        module = type(getattr(function, "__self__", function)).__module__
    return module.split(".")[0] in _LIBRARIES
