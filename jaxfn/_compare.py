"""``jaxfn.compare``: a jaxfn port checked against the original PyTorch Function, located like gradcheck.

Both run on the same inputs: forward's outputs, the gradients for every set of arguments
``needs_input_grad`` can name (the same seeded cotangents on both sides), and where the original
defines them its ``jvp`` (seeded tangents) and ``vmap`` (a batch of two) results. Each value that
differs is a row: the check, the output or parameter with its pytree path, the index, both
values. A difference of dtype that follows from JAX's 32-bit default (float32 where PyTorch kept
float64, x64 off) is a note, and the values are compared at float32's tolerance.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from . import _arguments, _jax_private, _torch
from ._errors import AutogradFunctionTypeError, AutogradFunctionValueError, error, type_name

_TOLERANCES = {2: (1e-2, 1e-3), 4: (1e-4, 1e-5), 8: (1e-7, 1e-9)}  # itemsize: (rtol, atol)
_MOST_SUBSETS = 6  # beyond this many differentiable arguments: each alone, and all together


@dataclasses.dataclass(frozen=True)
class Row:
    """One disagreement: what was checked, where, and both values."""

    check: str  # "forward", "gradient needs_input_grad=(True, False)", "jvp", "vmap"
    where: str  # "output 0", "parameter 'y'", with a pytree path
    index: tuple[int, ...] | None  # the first differing element (None: a shape, dtype or count)
    port: Any
    original: Any


@dataclasses.dataclass
class Report:
    """What ``jaxfn.compare`` found: true when the port agrees with the original.

    ``rows``: the disagreements, each located; ``notes``: what was not a failure (a dtype
    explained by JAX's 32-bit default, a check the port can't take); ``checks``: what was run.
    ``str(report)`` is the located table.
    """

    name: str
    checks: list[str] = dataclasses.field(default_factory=list)
    rows: list[Row] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.rows

    def __str__(self) -> str:
        head = f"jaxfn.compare '{self.name}': " + (
            f"agrees ({len(self.checks)} checks)" if self else f"{len(self.rows)} disagreements"
        )
        lines = [head]
        if self.rows:
            lines += ["", "| check | where | index | port | original |", "|---|---|---|---|---|"]
            for r in self.rows:
                index = "" if r.index is None else str(r.index)
                lines.append(f"| {r.check} | {r.where} | {index} | {_short(r.port)} | {_short(r.original)} |")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def compare(
    port: Callable[..., Any],
    original: Any,
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    raise_exception: bool = False,
    **kwargs: Any,
) -> Report:
    """Check a jaxfn port against the original PyTorch `torch.autograd.Function`, on the same inputs.

    Compares forward's outputs, the gradients for each set of arguments that
    `needs_input_grad` can name (seeded cotangents, the same on both sides), and, where the
    original defines them, its `jvp` (seeded tangents) and `vmap` (a batch of two) results.
    Values are compared with `rtol`/`atol` chosen by dtype (float32: 1e-4/1e-5, float64:
    1e-7/1e-9) unless given. A dtype difference that follows from JAX's 32-bit default
    (float32 where PyTorch computed float64, with x64 off) is a note, not a failure.

    Args:
      port: the jaxfn port (an `AutogradFunction`, a `Function`'s `apply`, or any JAX function).
      original: the PyTorch Function class (or what `jaxfn.from_torch` made from one).
      *args: the call's arguments, as the port takes them (arrays become tensors for the original).
      rtol: relative tolerance (default by dtype).
      atol: absolute tolerance (default by dtype).
      seed: the seed of the cotangents, tangents and batch.
      raise_exception: raise an `AutogradFunctionError` with the table where they disagree.
      **kwargs: keyword arguments of the call.

    Returns:
      A report, true when they agree; `str(report)` locates each disagreement (check, output or
      parameter with its path, index, both values).

    Raises:
      AutogradFunctionError: with `raise_exception=True` where they disagree, or if `original`
        is not a PyTorch Function.
    """
    function = getattr(original, "torch_function", original)
    name = getattr(function, "__name__", type_name(function))
    torch = _torch.torch_module(name)
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"jaxfn.compare takes the original torch.autograd.Function subclass second, but got {type_name(function)}; "
            "pass the class, as jaxfn.compare(port, MyFunction, *args)",
        )
    if not callable(port):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"jaxfn.compare takes the port first (a jaxfn function), then the original, then the arguments, but got "
            f"{type_name(port)} as the port",
        )
    for option, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (not _arguments.is_real_number(value) or value < 0):
            raise error(AutogradFunctionValueError, name, f"{option} must be a number >= 0, but got {value!r}")
    run = _Run(torch, function, port, args, kwargs, np.random.default_rng(seed), rtol, atol)
    report = Report(name)
    run.forward(report)
    run.gradients(report)
    base = torch.autograd.Function
    if function.jvp is not base.jvp:
        run.jvp(report)
    if function.setup_context is not base.setup_context and (
        function.vmap is not base.vmap or getattr(function, "generate_vmap_rule", False)
    ):
        run.vmap(report)
    if raise_exception and not report:
        raise error(AutogradFunctionValueError, name, f"the port disagrees with the original:\n{report}\n")
    return report


class _Run:
    """One comparison's inputs, and the two sides' calls."""

    def __init__(self, torch, function, port, args, kwargs, rng, rtol, atol):
        self.torch, self.function, self.port = torch, function, port
        self.args = tuple(jax.numpy.asarray(a) if _is_array(a) else a for a in args)  # JAX's dtypes (x64)
        self.given = args  # as the user gave them: the original's inputs
        self.kwargs, self.rng, self.rtol, self.atol = kwargs, rng, rtol, atol
        self.names = _parameter_names(function, torch, len(args))
        self.same_outputs = True  # whether the outputs' count and shapes agree (forward's check says)
        self.diff = [i for i, a in enumerate(args) if _is_inexact(a)]

    # -- the two sides ---------------------------------------------------------------------------
    def tensor(self, value: Any, requires_grad: bool = False) -> Any:
        if not _is_array(value):
            return value
        tensor = self.torch.from_numpy(np.array(value))  # a copy: the original may write in place
        return tensor.requires_grad_() if requires_grad else tensor

    def original_call(self, tensors: list[Any]) -> list[Any]:
        given = [t.clone() if getattr(t, "requires_grad", False) else t for t in tensors]  # may be written in place
        out = self.function.apply(*given, **{k: self.tensor(v) for k, v in self.kwargs.items()})
        return jax.tree_util.tree_leaves(out)

    def port_leaves(self, out: Any) -> list[Any]:
        return jax.tree_util.tree_leaves(out)

    # -- the checks ------------------------------------------------------------------------------
    def forward(self, report: Report) -> None:
        report.checks.append("forward")
        with self.torch.no_grad():
            try:
                theirs = self.original_call([self.tensor(a) for a in self.given])
            except TypeError as err:  # the arguments it takes differ from the port's: said as such
                if _takes(self.torch, self.function, len(self.given), self.kwargs):
                    raise  # the original's own error
                raise error(
                    AutogradFunctionTypeError,
                    self.function.__name__,
                    f"jaxfn.compare calls the port and the original with the same arguments, but the original's "
                    f"forward refused them ({err}); pass arguments that both take, in the same order",
                ) from err
        ours = self.port_leaves(self.port(*self.args, **self.kwargs))
        self.leaves(report, "forward", "output", ours, theirs)
        self.same_outputs = [np.shape(a) for a in ours] == [np.shape(_numpy(b)) for b in theirs]

    def gradients(self, report: Report) -> None:
        if not self.diff:
            return
        if not self.same_outputs:  # one cotangent can't serve both: the forward row says how they differ
            report.notes.append("gradients not compared: the port's outputs differ from the original's (see forward)")
            return
        subsets = (
            [c for k in range(1, len(self.diff) + 1) for c in itertools.combinations(self.diff, k)]
            if len(self.diff) <= _MOST_SUBSETS
            else [(i,) for i in self.diff] + [tuple(self.diff)]
        )
        with self.torch.no_grad():
            outs = [_numpy(t) for t in self.original_call([self.tensor(a) for a in self.given])]
        # complex outputs get complex cotangents; PyTorch's complex gradients are the conjugates of
        # JAX's (its backward takes and gives conj(cotangent)), so its side is conjugated in and out
        cotangents = [
            self.rng.standard_normal(np.shape(o))
            + (1j * self.rng.standard_normal(np.shape(o)) if np.iscomplexobj(o) else 0)
            for o in outs
        ]
        for subset in subsets:
            flags = tuple(i in subset for i in range(len(self.args)))
            check = f"gradient needs_input_grad={flags}"
            report.checks.append(check)
            tensors = [self.tensor(a, f) for a, f in zip(self.given, flags)]
            with self.torch.enable_grad():
                outs = self.original_call(tensors)
            pairs = [(o, c) for o, c in zip(outs, cotangents) if getattr(o, "requires_grad", False)]
            wanted = [tensors[i] for i in subset]
            grads = [None] * len(wanted)
            if pairs:
                grads = list(
                    self.torch.autograd.grad(
                        [o for o, _ in pairs],
                        wanted,
                        [self.torch.as_tensor(np.conj(c), dtype=o.dtype) for o, c in pairs],
                        allow_unused=True,
                    )
                )
            theirs = [
                np.zeros(np.shape(self.args[i])) if g is None else np.conj(_numpy(g)) for i, g in zip(subset, grads)
            ]
            ours = self.port_gradients(subset, cotangents)
            for i, a, b in zip(subset, ours, theirs):
                self.leaves(report, check, f"parameter '{self.names[i]}'", [a], [b], single=True)

    def port_gradients(self, subset: tuple[int, ...], cotangents: list[np.ndarray]) -> list[Any]:
        def on(*chosen: Any) -> Any:
            merged = list(self.args)
            for i, value in zip(subset, chosen):
                merged[i] = value
            return self.port(*merged, **self.kwargs)

        out, pullback = jax.vjp(on, *[self.args[i] for i in subset])
        leaves, treedef = jax.tree_util.tree_flatten(out)
        cts = [
            jax.numpy.asarray(c, leaf.dtype) if _is_inexact(leaf) else np.zeros(np.shape(leaf), jax.dtypes.float0)
            for leaf, c in zip(leaves, cotangents)
        ]
        return list(pullback(jax.tree_util.tree_unflatten(treedef, cts)))

    def jvp(self, report: Report) -> None:
        report.checks.append("jvp")
        tangents = {i: self.rng.standard_normal(np.shape(self.args[i])) for i in self.diff}
        with _torch.forward_ad(self.torch) as forward_ad:
            duals = [
                forward_ad.make_dual(self.tensor(a), self.torch.tensor(tangents[i], dtype=self.tensor(a).dtype))
                if i in tangents
                else self.tensor(a)
                for i, a in enumerate(self.given)
            ]
            outs = self.original_call(duals)
            theirs = [
                _numpy(forward_ad.unpack_dual(o).tangent) if hasattr(o, "dtype") else None for o in outs
            ]  # None: a zero tangent
        try:
            ours = self.port_jvp(tangents)
        except Exception as err:  # noqa: BLE001 - a port without forward mode: reported, not raised
            report.notes.append(f"jvp not compared: the port has no forward mode ({str(err).splitlines()[0]})")
            return
        theirs = [np.zeros(np.shape(a)) if t is None else t for t, a in zip(theirs, outs)]
        both = [(a, b) for a, b in zip(ours, theirs) if _is_inexact(a)]
        self.leaves(report, "jvp", "output", [a for a, _ in both], [b for _, b in both])

    def port_jvp(self, tangents: dict[int, np.ndarray]) -> list[Any]:
        which = sorted(tangents)

        def on(*chosen: Any) -> Any:
            merged = list(self.args)
            for i, value in zip(which, chosen):
                merged[i] = value
            return self.port(*merged, **self.kwargs)

        primals = [jax.numpy.asarray(self.args[i]) for i in which]
        _, out = jax.jvp(
            on, tuple(primals), tuple(jax.numpy.asarray(tangents[i], p.dtype) for i, p in zip(which, primals))
        )
        return jax.tree_util.tree_leaves(out)

    def vmap(self, report: Report) -> None:
        report.checks.append("vmap")
        batch = [
            np.stack([np.asarray(a), np.asarray(a) + 0.1 * self.rng.standard_normal(np.shape(a))]).astype(
                np.asarray(a).dtype
            )
            if _is_inexact(a)
            else (np.stack([np.asarray(a)] * 2) if _is_array(a) else a)
            for a in self.args
        ]
        dims = tuple(0 if _is_array(a) else None for a in self.args)
        try:
            with self.torch.no_grad():
                out = self.torch.func.vmap(
                    lambda *t: self.function.apply(*t, **{k: self.tensor(v) for k, v in self.kwargs.items()}),
                    in_dims=dims,
                )(*[self.tensor(b) for b in batch])
        except Exception as err:  # noqa: BLE001 - a vmap rule that batches some arguments only: reported
            first = (str(err).splitlines() or [""])[0]
            report.notes.append(
                f"vmap not compared: the original raised {type(err).__name__} with every array argument batched "
                f"({first})"
            )
            return
        theirs = jax.tree_util.tree_leaves(out)
        ours = jax.tree_util.tree_leaves(
            jax.vmap(lambda *a: self.port(*a, **self.kwargs), in_axes=dims)(
                *[jax.numpy.asarray(b) if _is_array(b) else b for b in batch]
            )
        )
        self.leaves(report, "vmap", "output", ours, theirs)

    # -- locating --------------------------------------------------------------------------------
    def leaves(self, report: Report, check: str, what: str, ours: list[Any], theirs: list[Any], single=False) -> None:
        if len(ours) != len(theirs):
            report.rows.append(Row(check, f"{what}s", None, f"{len(ours)} outputs", f"{len(theirs)} outputs"))
            return
        for k, (a, b) in enumerate(zip(ours, theirs)):
            where = what if single else f"{what} {k}"
            self.values(report, check, where, np.asarray(a), _numpy(b))

    def values(self, report: Report, check: str, where: str, a: np.ndarray, b: np.ndarray) -> None:
        if a.shape != b.shape:
            report.rows.append(Row(check, where, None, f"shape {a.shape}", f"shape {b.shape}"))
            return
        narrowed = _narrowed(a.dtype, b.dtype)
        if a.dtype != b.dtype and not narrowed and a.dtype.kind != b.dtype.kind:
            report.rows.append(Row(check, where, None, f"dtype {a.dtype}", f"dtype {b.dtype}"))
            return
        if narrowed:
            note = f"{check}, {where}: {a.dtype} where the original has {b.dtype}, JAX's 32-bit default (x64 off)"
            if note not in report.notes:
                report.notes.append(note)
        itemsize = min(a.dtype.itemsize, b.dtype.itemsize) if a.dtype.kind in "fc" else 8
        if a.dtype.kind == "c":
            itemsize //= 2
        rtol, atol = _TOLERANCES.get(itemsize, _TOLERANCES[8])
        rtol, atol = self.rtol if self.rtol is not None else rtol, self.atol if self.atol is not None else atol
        close = np.isclose(a, b.astype(a.dtype) if a.dtype.kind in "fc" else b, rtol=rtol, atol=atol, equal_nan=True)
        if not np.all(close):
            index = tuple(int(i) for i in np.argwhere(~close)[0])
            report.rows.append(Row(check, where, index, a[index].item(), b[index].item()))


def _takes(torch: Any, function: Any, count: int, kwargs: dict[str, Any]) -> bool:
    """Whether a PyTorch Function's forward takes a call's arguments: after ctx, or alone where
    the Function has setup_context (PyTorch 2's form)."""
    try:
        signature = inspect.signature(function.forward)
    except (TypeError, ValueError):
        return True
    first = () if function.setup_context is not torch.autograd.Function.setup_context else (None,)
    try:
        signature.bind(*first, *[None] * count, **kwargs)
    except TypeError:
        return False
    return True


def _narrowed(ours: np.dtype, theirs: np.dtype) -> bool:
    """Whether ``ours`` is ``theirs`` narrowed by JAX's 32-bit default (x64 off)."""
    if _jax_private.x64() or ours == theirs:
        return False
    return jax.dtypes.canonicalize_dtype(theirs) == ours


def _parameter_names(function: Any, torch: Any, count: int) -> list[str]:
    parameters = list(inspect.signature(function.forward).parameters.values())
    if function.setup_context is torch.autograd.Function.setup_context:
        parameters = parameters[1:]  # ctx
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names + [f"args[{i}]" for i in range(len(names), count)]


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, jax.Array))


def _is_inexact(value: Any) -> bool:
    return _is_array(value) and np.issubdtype(value.dtype, np.inexact)


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().resolve_conj().cpu().numpy()
    return np.asarray(value)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, complex):
        return f"{value:.6g}"
    return str(value)
