"""``jaxfn.compare``: a jaxfn port checked against the original PyTorch Function, located like gradcheck.

Both run on the same inputs, the ways a rule is called in normal use: forward's outputs, the
gradients for every set of array leaves ``needs_input_grad`` can name (the same seeded cotangents
on both sides; beyond six leaves each alone, each pair, each all but one and all, the others
listed), from every output and, where there are several, from each alone (and each all but one)
with none for the others; where the original defines them its ``jvp`` (seeded tangents, every
argument perturbed and each set of them alone, the others not) and ``vmap`` (a batch of two
whose examples differ: floats O(1) apart, integers and booleans permuted; every array at axis 0
and at another axis, and each set of arrays batched, the others not, at axis 0 and at each one's
last; beyond six arrays each alone, each pair and each all but one, the others listed) results,
and with ``order=2`` second derivatives for the same ``needs_input_grad`` sets as the gradients.
Every array counts however it is passed (positionally, by keyword, inside a tuple, list or dict,
located by its key path), and arrays cross to PyTorch by ``from_torch``'s one conversion. Each
value that differs is a row: the check, the output or parameter with its path, the index, both
values; an exception the port raises is a row too. What could not be compared is listed, and a
difference with a known cause is explained in a note.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from . import _arguments, _jax_private, _rule, _torch
from ._errors import AutogradFunctionTypeError, AutogradFunctionValueError, error, type_name
from ._function import Function

_TOLERANCES = {2: (1e-2, 1e-3), 4: (1e-4, 1e-5), 8: (1e-7, 1e-9)}  # itemsize: (rtol, atol)
_ALL_SUBSETS = 6  # up to this many differentiable leaves every subset; beyond: each alone, each pair, all but one, all
_ALONE_SUBSETS = 7  # up to this many subsets each output's cotangent alone for every one; beyond: 1, n - 1, n
_ALONE_LEFT = (
    "gradients from one output's cotangent alone, or all but one's (the others none), not compared for {left} of "
    "the {total} needs_input_grad subsets compared (compared: each alone, each all but one, and all {n})"
)
_TANGENTS_LEFT = (
    "jvp not compared for {left} of the {total} sets of arguments given a tangent (the others none): those "
    "naming 3 to {most} of the {n} (compared: each alone, each pair, each all but one, and all)"
)
_BATCHED_LEFT = (
    "vmap not compared for {left} of the {total} sets of batched arrays (the others unbatched): those batching "
    "3 to {most} of the {n} arrays (compared: each alone, each pair, each all but one, and all)"
)
_BATCHES = ((False, False), (True, False), (True, True))  # a vmap's second example: (integers same, floats near)
_CLOSER = ("", "(integers and booleans the same)", "(integers and booleans the same, floats 0.1 apart)")
_NESTED_GRADIENT = (
    "PyTorch gives no gradient to a tensor inside a tuple, list or dict argument of a Function (only a tensor "
    "argument itself gets one), so the original's gradient for {where} is zero where the port's is not"
)
_NARROWER = (
    "the original computes in {narrow} though its inputs are {wide}, in {outputs}{why}, so {outputs} and the "
    "gradients from {its} cotangent{s} are compared at {narrow}'s tolerance (rtol {rtol:g}, atol {atol:g}){others}"
)
_FLOAT32 = " (torch.Tensor(ndarray) and torch.FloatTensor make float32 whatever the array's dtype)"
_OTHERS = "; the other outputs, and the gradients from theirs, at their own dtype's"
_SUBSETS_LEFT = (
    "gradients not compared for {left} of the {total} needs_input_grad subsets: those naming 3 to {most} of the "
    "{n} differentiable arrays (compared: each alone, each pair, each all but one, and all {n})"
)
_SECOND_LEFT = (
    "second derivatives not compared for {left} of the {total} needs_input_grad subsets: those naming 3 to "
    "{most} of the {n} differentiable arrays (compared: each alone, each pair, each all but one, and all {n})"
)
_DIRTY = (
    "the original writes {inputs} in place (ctx.mark_dirty), and PyTorch's backward reads back what forward "
    "saved after that write, while the port (JAX arrays are never written in place) saves the value before it: "
    "a gradient that differs may come from that; save in the port what the original's backward reads"
)
_NOT_THROUGH = (
    "the original's backward reads a value its forward computed (saved on ctx), and PyTorch does not "
    "differentiate through it at second order (forward runs without autograd), while JAX differentiates the "
    "port's through forward's operations: a second derivative that differs may come from that"
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One disagreement: what was checked, where, and both values."""

    check: str  # "forward", "gradient needs_input_grad=(True, False)", "jvp", "vmap", "second derivative"
    where: str  # "output 0", "parameter 'y'", "parameter 'p['w']'", "the port"
    index: tuple[int, ...] | None  # the first differing element (None: a shape, dtype, count or exception)
    port: Any
    original: Any


@dataclasses.dataclass
class Report:
    """What ``jaxfn.compare`` found: true when the port agrees with the original on every check run.

    ``checks``: what was run; ``rows``: the disagreements, each located (an exception the port
    raised is one); ``not_compared``: what could not be compared, and why; ``notes``: what was not
    a failure (a dtype explained by JAX's 32-bit default) and the known causes of a difference.
    ``str(report)`` is the located table, then those lists.
    """

    name: str
    checks: list[str] = dataclasses.field(default_factory=list)
    rows: list[Row] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    not_compared: list[str] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.rows

    def __str__(self) -> str:
        head = f"jaxfn.compare '{self.name}': " + (
            f"agrees ({_count(len(self.checks), 'check')})" if self else _count(len(self.rows), "disagreement")
        )
        lines = [head]
        if self.rows:
            lines += ["", "| check | where | index | port | original |", "|---|---|---|---|---|"]
            for r in self.rows:
                index = "" if r.index is None else str(r.index)
                lines.append(f"| {r.check} | {r.where} | {index} | {_short(r.port)} | {_short(r.original)} |")
        lines += self.not_compared
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def compare(
    port: Callable[..., Any],
    original: Any,
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    order: int = 1,
    raise_exception: bool = False,
    **kwargs: Any,
) -> Report:
    """Check a jaxfn port against the original PyTorch `torch.autograd.Function`, on the same inputs.

    Compares forward's outputs, the gradients for each set of array arguments that
    `needs_input_grad` can name (seeded cotangents, the same on both sides; with more than six
    differentiable arrays each alone, each pair, each all but one and all, and the count of the
    others is listed as not compared), from all outputs and, with several, from each output alone
    (and each all but one) with no cotangent for the others (`None` in a backward under
    `set_materialize_grads(False)`), and, where the original defines them, its `jvp` (seeded
    tangents: every argument perturbed, and each set of arguments alone, the others given no
    tangent) and `vmap` results (a batch of two whose examples differ, floats by O(1), integers
    and booleans permuted so they stay valid indices, with the same in_dims on both sides: every
    array batched at axis 0, every array at a non-zero axis, and each set of arrays batched, the
    others unbatched, at axis 0 and at each one's last; with more than six arrays each alone, each
    pair and each all but one, and the count of the others is listed as not compared);
    `order=2` compares second derivatives too (reverse over reverse, along seeded directions),
    for the same `needs_input_grad` sets as the gradients, so a backward that branches on it is
    differentiated on each branch. Every array counts however it is passed:
    positionally, by keyword, or inside a tuple, list or dict (located by its key path). Arrays
    become tensors by `from_torch`'s conversion (bfloat16 and float8 by their bits). Values are
    compared with `rtol`/`atol` chosen by dtype (bfloat16 and float16: 1e-2/1e-3, float32:
    1e-4/1e-5, float64: 1e-7/1e-9) unless given. An exception the port raises (in forward,
    backward, its jvp or vmap rule) is a disagreement carrying its type and message. What could
    not be compared is listed with why, and a difference with a known cause names it: the
    original computing an output in a narrower dtype than its inputs (that output, and the
    gradients from its cotangent, then compared at that dtype's tolerance; the others at theirs),
    an in-place write (`ctx.mark_dirty`) that PyTorch's backward reads back, a second derivative
    PyTorch does not take through a value forward computed. A dtype difference
    that follows from JAX's 32-bit default (float32 where PyTorch computed float64, with x64 off)
    is a note, not a failure.

    Args:
      port: the jaxfn port: a `jaxfn.Function` subclass (as the original is passed), its `apply`,
        an `AutogradFunction`, or any JAX function.
      original: the PyTorch Function class (or what `jaxfn.from_torch` made from one).
      *args: the call's arguments, as the port takes them (arrays become tensors for the original).
      rtol: relative tolerance (default by dtype).
      atol: absolute tolerance (default by dtype).
      seed: the seed of the cotangents, tangents and batch.
      order: 1 (the default), or 2 to compare second derivatives (reverse over reverse) too.
      raise_exception: raise an `AutogradFunctionError` with the table where they disagree.
      **kwargs: keyword arguments of the call.

    Returns:
      A `Report`, true when every check that ran agrees. Its `rows` are the disagreements (check,
        output or parameter with its path, index, both values), `checks` what ran, `not_compared`
        what could not be compared and why, `notes` the known causes; `str(report)` shows them all.

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
    if isinstance(port, type) and issubclass(port, Function):
        port = port.apply  # the class, passed as the original is
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
    if order not in (1, 2):
        raise error(AutogradFunctionValueError, name, f"jaxfn.compare's order must be 1 or 2, but got {order!r}")
    run = _Run(torch, function, port, args, kwargs, np.random.default_rng(seed), rtol, atol)
    report = Report(name)
    run.forward(report)
    run.gradients(report)
    base = torch.autograd.Function
    if function.jvp is not base.jvp:
        run.jvp(report)
    else:
        report.not_compared.append("jvp not compared: the original has no jvp static method")
    if function.setup_context is not base.setup_context and (
        function.vmap is not base.vmap or getattr(function, "generate_vmap_rule", False)
    ):
        run.vmap(report)
    else:
        report.not_compared.append(
            "vmap not compared: the original has no vmap static method (or generate_vmap_rule with setup_context)"
        )
    if order == 2:
        run.second(report)
    if raise_exception and not report:
        raise error(AutogradFunctionValueError, name, f"the port disagrees with the original:\n{report}\n")
    return report


class _Run:
    """One comparison's inputs (every leaf of the call, located), and the two sides' calls."""

    def __init__(self, torch, function, port, args, kwargs, rng, rtol, atol):
        self.torch, self.function, self.port = torch, function, port
        with_paths, self.treedef = tree_flatten_with_path((args, kwargs))
        self.given = [leaf for _, leaf in with_paths]  # as the user gave them: the original's inputs
        self.leaves = [jax.numpy.asarray(v) if _is_array(v) else v for v in self.given]  # JAX's dtypes (x64)
        names = _parameter_names(function, torch, len(args))
        self.labels = [_label(path, names) for path, _ in with_paths]
        self.nested = [len(path) > 2 for path, _ in with_paths]  # inside a tuple, list or dict argument
        self.kwargs, self.rng, self.rtol, self.atol = kwargs, rng, rtol, atol
        self.same_outputs = True  # whether the outputs' count and shapes agree (forward's check says)
        self.port_forward_failed = False
        self.diff = [i for i, v in enumerate(self.given) if _is_inexact(v)]
        self.narrow: dict[int, np.dtype] = {}  # output -> its dtype in the original, narrower than the inputs'

        self.inexact_outputs: list[int] = []  # the original's float and complex outputs
        self.narrowed: dict[str, list[str]] = {}  # a narrowing by JAX's 32-bit default -> the values it narrowed

    # -- the two sides ---------------------------------------------------------------------------
    def tensors(self, flags: Any = ()) -> list[Any]:
        """The original's inputs: each array leaf a new tensor (requiring grad where ``flags`` says)."""
        return [_torch.tensor_of(self.torch, v, i in flags) if _is_array(v) else v for i, v in enumerate(self.given)]

    def original_call(self, tensors: list[Any]) -> list[Any]:
        given = [t.clone() if getattr(t, "requires_grad", False) else t for t in tensors]  # may be written in place
        call_args, call_kwargs = tree_unflatten(self.treedef, given)
        return jax.tree_util.tree_leaves(self.function.apply(*call_args, **call_kwargs))

    def port_call(self, leaves: list[Any]) -> Any:
        call_args, call_kwargs = tree_unflatten(self.treedef, leaves)
        return self.port(*call_args, **call_kwargs)

    def port_of(self, which: list[int]) -> Callable[..., Any]:
        """The port as a function of the leaves ``which`` alone, the others as given."""
        return _rule.of_chosen(lambda *leaves: self.port_call(list(leaves)), self.leaves, which)

    def raised(self, report: Report, check: str, err: Exception, theirs: str) -> None:
        """An exception the port raised: a disagreement, carrying its type and message."""
        first = (str(err).strip().splitlines() or [""])[0]
        report.rows.append(Row(check, "the port", None, f"raised {type(err).__name__}: {first}", theirs))

    # -- the checks ------------------------------------------------------------------------------
    def forward(self, report: Report) -> None:
        report.checks.append("forward")
        with self.torch.no_grad():
            try:
                theirs = self.original_call(self.tensors())
            except TypeError as err:  # the arguments it takes differ from the port's: said as such
                if _takes(self.torch, self.function, self.treedef, self.kwargs):
                    raise  # the original's own error
                raise error(
                    AutogradFunctionTypeError,
                    self.function.__name__,
                    f"jaxfn.compare calls the port and the original with the same arguments, but the original's "
                    f"forward refused them ({err}); pass arguments that both take, in the same order",
                ) from err
        self.narrow = self.narrower(theirs, report)
        try:
            ours = jax.tree_util.tree_leaves(self.port_call(self.leaves))
        except Exception as err:  # noqa: BLE001 - the port's exception is a disagreement
            self.raised(report, "forward", err, "outputs")
            self.port_forward_failed = True
            return
        self.leaves_of(report, "forward", "output", ours, theirs)
        self.same_outputs = [np.shape(a) for a in ours] == [np.shape(_numpy(self.torch, b)) for b in theirs]

    def narrower(self, outputs: list[Any], report: Report) -> dict[int, np.dtype]:
        """Each output the original computes in a float dtype narrower than its inputs', with that
        dtype (noted, naming the outputs): it alone, and the gradients from its cotangent, are
        compared at that dtype's tolerance."""
        made = {k: _numpy(self.torch, o).dtype for k, o in enumerate(outputs) if hasattr(o, "dtype")}
        made = {k: d for k, d in made.items() if _kind(d) in "fc"}
        self.inexact_outputs = list(made)
        inputs = [np.asarray(self.given[i]).dtype for i in self.diff]
        if not inputs:
            return {}
        wide = max(inputs, key=_real_size)
        narrow = {k: d for k, d in made.items() if _real_size(d) < _real_size(wide)}
        for dtype in sorted(set(narrow.values()), key=_real_size):
            which = [k for k, d in narrow.items() if d == dtype]
            rtol, atol = self.tolerance(dtype, dtype, dtype)
            report.notes.append(
                _NARROWER.format(
                    narrow=dtype,
                    wide=wide,
                    outputs=_outputs(which),
                    why=_FLOAT32 if dtype == np.float32 else "",
                    its="its" if len(which) == 1 else "their",
                    s="" if len(which) == 1 else "s",
                    rtol=rtol,
                    atol=atol,
                    others=_OTHERS if len(which) < len(made) else "",
                )
            )
        return narrow

    def flows(self) -> list[tuple[str, set[int] | None, np.dtype | None]]:
        """The outputs whose cotangents are sent back together (None: all), each group with the
        narrower dtype its gradients flow through (None: the gradients' own): one group (every
        output, no label) unless the original computes some outputs narrower than others, so that
        a narrow side output never loosens the check of a gradient that does not flow through it."""
        keys = {k: self.narrow.get(k) for k in self.inexact_outputs}
        distinct = sorted(set(keys.values()), key=lambda d: -16 if d is None else -_real_size(d))
        if len(distinct) <= 1:
            return [("", None, distinct[0] if distinct else None)]
        groups: list[tuple[str, set[int] | None, np.dtype | None]] = []
        for key in distinct:
            chosen = [k for k, d in keys.items() if d == key]
            groups.append((f" from {_outputs(chosen)}", set(chosen), key))
        return groups

    def sent(self, cotangents: list[np.ndarray], kept: set[int] | None) -> list[np.ndarray]:
        """The cotangents of one group of outputs (``flows``), the others' zero."""
        return [c if kept is None or k in kept else np.zeros_like(c) for k, c in enumerate(cotangents)]

    def gradients(self, report: Report) -> None:
        if not self.diff:
            return
        if self.port_forward_failed:
            report.not_compared.append("gradients not compared: the port's forward raised (see forward)")
            return
        if not self.same_outputs:  # one cotangent can't serve both: the forward row says how they differ
            report.not_compared.append(
                "gradients not compared: the port's outputs differ from the original's (see forward)"
            )
            return
        subsets = self.subsets(report)
        with self.torch.no_grad():
            outs = [_numpy(self.torch, t) for t in self.original_call(self.tensors())]
        # complex outputs get complex cotangents; PyTorch's complex gradients are the conjugates of
        # JAX's (its backward takes and gives conj(cotangent)), so its side is conjugated in and out
        cotangents = [_random(self.rng, np.shape(o), np.iscomplexobj(o)) for o in outs]
        dirty: list[str] = []
        nested: list[str] = []
        flows, alone = self.flows(), self.alone(report, subsets)
        for subset, (label, kept, narrow) in [
            *itertools.product(subsets, flows),
            *((s, a) for s in subsets if s in alone[0] for a in alone[1]),
        ]:
            flags = tuple(i in subset for i in range(len(self.given)))
            check = f"gradient needs_input_grad={flags}{label}"
            report.checks.append(check)
            theirs, written = self.original_gradients(subset, cotangents, kept)
            dirty += [w for w in written if w not in dirty]
            try:
                ours = self.port_gradients(list(subset), cotangents, kept)
            except Exception as err:  # noqa: BLE001 - the port's backward raised: a disagreement
                self.raised(report, check, err, "gradients")
                continue
            for i, a, b in zip(subset, ours, theirs):
                before = len(report.rows)
                where = f"parameter '{self.labels[i]}'"
                zero = np.zeros(np.shape(a), np.asarray(a).dtype)  # the original gave None: a zero of the port's dtype
                self.values(report, check, where, np.asarray(a), zero if b is None else b, narrow)
                if len(report.rows) > before and b is None and self.nested[i] and where not in nested:
                    nested.append(where)
        report.notes += [_NESTED_GRADIENT.format(where=where) for where in nested]
        if dirty and any(r.check.startswith("gradient") for r in report.rows):
            report.notes.append(_DIRTY.format(inputs=", ".join(dirty)))

    def subsets(self, report: Report, left: str = _SUBSETS_LEFT) -> list[tuple[int, ...]]:
        """The sets of differentiable leaves whose gradients are compared (each a ``needs_input_grad``):
        every one up to ``_ALL_SUBSETS`` leaves; beyond, each alone, each pair, each all but one and
        all, and the count of those left out is listed (``left``: what was not compared)."""
        chosen, total = _subsets(self.diff)
        if len(chosen) < total:
            n = len(self.diff)
            report.not_compared.append(left.format(left=total - len(chosen), total=total, most=n - 2, n=n))
        return chosen

    def alone(
        self, report: Report, subsets: list[tuple[int, ...]]
    ) -> tuple[list[tuple[int, ...]], list[tuple[str, set[int], np.dtype | None]]]:
        """Where the original has several float outputs, each given a cotangent alone, and with three
        or more each left out (the others none: a loss of those outputs only, so a port's backward
        gets None for the others under ``set_materialize_grads(False)``), for every subset up to
        ``_ALONE_SUBSETS`` of them, beyond for each alone, each all but one and all, the count of
        the others listed; a set of outputs that ``flows`` already sends is not sent twice."""
        floats = self.inexact_outputs
        if len(floats) < 2:
            return [], []
        sent = [kept for _, kept, _ in self.flows()]
        sets = [{k} for k in floats] + ([set(floats) - {k} for k in floats] if len(floats) > 2 else [])
        outputs: list[tuple[str, set[int], np.dtype | None]] = []
        for kept in sets:
            if kept not in sent:  # compared at the narrowest of their dtypes, where the original narrows
                narrow = [self.narrow[k] for k in kept if k in self.narrow]
                outputs.append((f" from {_outputs(sorted(kept))}", kept, min(narrow, key=_real_size, default=None)))
        if not outputs:
            return [], []
        n = len(self.diff)
        chosen = subsets if len(subsets) <= _ALONE_SUBSETS else [s for s in subsets if len(s) in (1, n - 1, n)]
        if len(chosen) < len(subsets):
            report.not_compared.append(_ALONE_LEFT.format(left=len(subsets) - len(chosen), total=len(subsets), n=n))
        return chosen, outputs

    def original_gradients(
        self, subset: tuple[int, ...], cotangents: list[np.ndarray], kept: set[int] | None = None
    ) -> tuple[list[Any], list[str]]:
        """The original's gradients for the leaves ``subset`` (None where PyTorch gives none) from
        the outputs ``kept`` (None: all) alone, each with its cotangent, and the inputs its forward
        wrote in place."""
        torch = self.torch
        tensors = self.tensors(subset)
        given = [t.clone() if getattr(t, "requires_grad", False) else t for t in tensors]
        versions = [t._version if isinstance(t, torch.Tensor) else None for t in given]
        call_args, call_kwargs = tree_unflatten(self.treedef, given)
        with torch.enable_grad():
            outs = jax.tree_util.tree_leaves(self.function.apply(*call_args, **call_kwargs))
        written = [
            f"'{self.labels[i]}'" for i, (t, v) in enumerate(zip(given, versions)) if v is not None and t._version != v
        ]
        pairs = [
            (o, c)
            for k, (o, c) in enumerate(zip(outs, cotangents))
            if (kept is None or k in kept) and getattr(o, "requires_grad", False)
        ]
        wanted = [tensors[i] for i in subset]
        grads: list[Any] = [None] * len(wanted)
        if pairs:
            grads = list(
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    wanted,
                    [_torch.tensor_of(torch, np.asarray(np.conj(c))).to(o.dtype) for o, c in pairs],
                    allow_unused=True,
                )
            )
        return [None if g is None else np.conj(_numpy(torch, g)) for g in grads], written

    def port_gradients(
        self, subset: list[int], cotangents: list[np.ndarray], kept: set[int] | None = None
    ) -> list[Any]:
        """The port's gradients for the leaves ``subset`` of a loss of the outputs ``kept`` (None:
        all) alone: the others are not outputs of what is differentiated, so their cotangents are
        JAX's symbolic zeros (None in a backward under ``set_materialize_grads(False)``)."""
        port, outputs = self.port_of(subset), kept

        def of_kept(*chosen: Any) -> Any:
            return [leaf for k, leaf in enumerate(jax.tree_util.tree_leaves(port(*chosen))) if k in (outputs or ())]

        out, pullback = jax.vjp(port if kept is None else of_kept, *[self.leaves[i] for i in subset])
        leaves, treedef = jax.tree_util.tree_flatten(out)
        sent = cotangents if kept is None else [c for k, c in enumerate(cotangents) if k in kept]
        cts = [
            jax.numpy.asarray(c, leaf.dtype) if _is_inexact(leaf) else np.zeros(np.shape(leaf), jax.dtypes.float0)
            for leaf, c in zip(leaves, sent)
        ]
        return list(pullback(jax.tree_util.tree_unflatten(treedef, cts)))

    def jvp(self, report: Report) -> None:
        if self.port_forward_failed:
            report.not_compared.append("jvp not compared: the port's forward raised (see forward)")
            return
        top = [i for i in self.diff if not self.nested[i]]
        for i in self.diff:
            if self.nested[i]:
                report.not_compared.append(
                    f"jvp not compared for '{self.labels[i]}': PyTorch's forward mode takes the tangents of tensor "
                    "arguments only, not of tensors inside a tuple, list or dict"
                )
        if not top:
            return
        tangents = {i: _random(self.rng, np.shape(self.given[i]), False) for i in top}
        n = len(top)
        sizes = range(n - 1, 0, -1) if n <= _ALL_SUBSETS else sorted({n - 1, 2, 1}, reverse=True)
        parts = [list(c) for k in sizes for c in itertools.combinations(top, k)]
        if n > _ALL_SUBSETS:
            report.not_compared.append(
                _TANGENTS_LEFT.format(left=2**n - 2 - len(parts), total=2**n - 1, most=n - 2, n=n)
            )
        for which in [top, *parts]:  # every tangent at once first: a port without forward mode stops there
            names = ", ".join(f"'{self.labels[i]}'" for i in which)
            if not self.jvp_of(report, "jvp" if which is top else f"jvp of {names} alone", which, tangents):
                return

    def jvp_of(self, report: Report, check: str, which: list[int], tangents: dict[int, np.ndarray]) -> bool:
        """One jvp compared: the leaves ``which`` perturbed (their seeded tangents), the others not
        (on PyTorch's side no dual; on JAX's a function of ``which`` alone, so a port's jvp rule gets
        None for the others under ``set_materialize_grads(False)``). False where the port has no
        forward-mode rule (listed: no other jvp is tried)."""
        report.checks.append(check)
        tensors = self.tensors()
        try:
            with _torch.forward_ad(self.torch) as forward_ad:
                duals = [
                    forward_ad.make_dual(t, _torch.tensor_of(self.torch, tangents[i]).to(t.dtype)) if i in which else t
                    for i, t in enumerate(tensors)
                ]
                outs = self.original_call(duals)
                theirs = [
                    _numpy(self.torch, forward_ad.unpack_dual(o).tangent) if hasattr(o, "dtype") else None for o in outs
                ]  # None: a zero tangent
        except Exception as err:  # noqa: BLE001 - the original's forward mode refused these tangents: listed
            report.checks.remove(check)
            first = (str(err).splitlines() or [""])[0]
            report.not_compared.append(f"{check} not compared: the original raised {type(err).__name__} ({first})")
            return True
        try:
            ours = self.port_jvp(which, tangents)
        except Exception as err:  # noqa: BLE001 - no forward mode is said as such; any other exception is a row
            if _jax_private.refused_forward_mode(err) or _rule.FORWARD_MODE_HELP in str(err):
                report.checks.remove(check)
                report.not_compared.append(
                    "jvp not compared: the port has no forward-mode rule (give it a jvp rule, or forward_mode=True), "
                    "so jax.jvp refuses it"
                )
                return False
            self.raised(report, check, err, "tangents")
            return True
        theirs = [np.zeros(np.shape(_numpy(self.torch, a))) if t is None else t for t, a in zip(theirs, outs)]
        both = [(a, b) for a, b in zip(ours, theirs) if _is_inexact(a)]
        self.leaves_of(report, check, "output", [a for a, _ in both], [b for _, b in both])
        return True

    def port_jvp(self, which: list[int], tangents: dict[int, np.ndarray]) -> list[Any]:
        primals = [jax.numpy.asarray(self.leaves[i]) for i in which]
        _, out = jax.jvp(
            self.port_of(which),
            tuple(primals),
            tuple(jax.numpy.asarray(tangents[i], p.dtype) for i, p in zip(which, primals)),
        )
        return jax.tree_util.tree_leaves(out)

    def vmap(self, report: Report) -> None:
        if self.port_forward_failed:
            report.not_compared.append("vmap not compared: the port's forward raised (see forward)")
            return
        arrays = [i for i, v in enumerate(self.given) if _is_array(v)]
        if not arrays:
            report.not_compared.append("vmap not compared: the call has no array argument to batch")
            return
        for batching in self.batchings(arrays, report):
            self.vmap_of(report, arrays, batching)

    def batchings(self, arrays: list[int], report: Report) -> list[dict[int, int]]:
        """The batch axis of each batched array leaf (the others unbatched, in_dims None), one dict per
        vmap compared: every array at axis 0; every array at its last axis, and at axis 1, where an
        array has one (a batch axis other than 0); then each set of arrays batched, the others not
        (each alone first), at axis 0 and at each one's last: every set up to ``_ALL_SUBSETS``
        arrays, beyond each alone, each pair and each all but one, the count of the others listed."""
        ndim = {i: np.ndim(self.given[i]) for i in arrays}
        batchings = [dict.fromkeys(arrays, 0)]
        if any(ndim.values()):
            batchings.append(dict(ndim))  # after every data axis (a scalar's only axis is 0)
        if any(d >= 2 for d in ndim.values()):
            batchings.append({i: min(1, ndim[i]) for i in arrays})
        chosen, total = _subsets(arrays)
        for batched in chosen[:-1]:  # the last is every array, batched above
            batchings += [dict.fromkeys(batched, 0)] + (
                [{i: ndim[i] for i in batched}] if any(ndim[i] for i in batched) else []
            )
        if len(chosen) < total:
            n = len(arrays)
            report.not_compared.append(_BATCHED_LEFT.format(left=total - len(chosen), total=total, most=n - 2, n=n))
        return batchings

    def vmap_of(self, report: Report, arrays: list[int], batching: dict[int, int]) -> None:
        """One vmap compared: the original through ``torch.func.vmap``, the port through ``jax.vmap``,
        with the same in_dims (a batch of two along ``batching``'s axes)."""
        in_dims = "in_dims=(" + ", ".join(f"{self.labels[i]}={batching.get(i)}" for i in arrays) + ")"
        check = f"vmap {in_dims}"
        report.checks.append(check)
        dims = [batching.get(i) for i in range(len(self.given))]
        # the batch's second example: floats O(1) away from the first, integers and booleans the
        # given values permuted, so a rule that mixes examples or reads example 0's indices for all
        # disagrees; where the original refuses that (an index out of range, a matrix no longer
        # positive definite), integers and booleans the same, then floats 0.1 away too, listed
        refused = ""
        for ladder, (same, near) in enumerate(_BATCHES):
            batch, repeated = self.batch_of(batching, same, near)
            try:
                out = self.original_vmap(batch, dims)
                break
            except Exception as err:  # noqa: BLE001 - a vmap rule that batches some arguments only: listed
                refused = refused or _said(err)
                if ladder == len(_BATCHES) - 1:
                    report.checks.remove(check)
                    report.not_compared.append(f"vmap not compared: the original raised {_said(err)} with {in_dims}")
                    return
        else:  # pragma: no cover - the loop breaks or returns
            return
        if ladder:
            report.not_compared.append(
                f"vmap with {in_dims} compared only on a batch of two examples {_CLOSER[ladder]}: the original "
                f"raised {refused} with integers and booleans permuted and floats O(1) apart"
            )
        if repeated:
            report.not_compared.append(
                f"vmap with {in_dims}: {', '.join(repeated)} holds one value only, so both examples of the batch "
                "have it (another value might be out of range): a rule reading one example's for all is not caught"
            )
        theirs = jax.tree_util.tree_leaves(out)
        in_axes = tree_unflatten(self.treedef, dims)
        try:
            ours = jax.tree_util.tree_leaves(
                jax.vmap(lambda a, k: self.port(*a, **k), in_axes=in_axes)(
                    *tree_unflatten(self.treedef, [jax.numpy.asarray(b) if _is_array(b) else b for b in batch])
                )
            )
        except Exception as err:  # noqa: BLE001 - the port's vmap rule (or its batching) raised: a row
            self.raised(report, check, err, "outputs")
            return
        self.leaves_of(report, check, "output", ours, theirs)

    def batch_of(self, batching: dict[int, int], same: bool, near: bool) -> tuple[list[Any], list[str]]:
        """The call's leaves with those ``batching`` names made a batch of two along its axes (the
        given value, then ``_other_example``'s), and the integer or boolean ones whose two examples
        are the same though permuted."""
        batch, repeated = list(self.given), []
        for i, axis in batching.items():
            v = np.asarray(self.given[i])
            other = _other_example(self.rng, v, same, near)
            if not same and not _is_inexact(v) and np.array_equal(other, v):
                repeated.append(f"'{self.labels[i]}'")
            batch[i] = np.ascontiguousarray(np.moveaxis(np.stack([v, other]), 0, axis))
        return batch, repeated

    def original_vmap(self, batch: list[Any], dims: list[int | None]) -> Any:
        """The original through ``torch.func.vmap`` on ``batch``, with in_dims ``dims``."""
        torch_args, torch_kwargs = tree_unflatten(
            self.treedef, [_torch.tensor_of(self.torch, b) if _is_array(b) else b for b in batch]
        )
        torch_dims = tree_unflatten(self.treedef, dims)
        nones: list[bool] = []  # per output of a tuple: whether the original returned None there

        def tensors_only(a: Any, k: Any) -> Any:  # torch.func.vmap takes only tensors as outputs
            out = self.function.apply(*a, **k)
            if not isinstance(out, tuple):
                return out
            nones[:] = [o is None for o in out]
            return tuple(self.torch.zeros(()) if o is None else o for o in out)

        with self.torch.no_grad():
            out = self.torch.func.vmap(tensors_only, in_dims=(tuple(torch_dims[0]), torch_dims[1]))(
                tuple(torch_args), torch_kwargs
            )
        return tuple(None if none else o for o, none in zip(out, nones)) if nones else out

    def second(self, report: Report) -> None:
        """Second derivatives (reverse over reverse) along seeded directions, for the sets of array
        leaves ``needs_input_grad`` can name that first order's gradients compare (``subsets``; a
        backward may branch on it): every leaf at once first, then each set, its own count of those
        left out listed; per group of outputs where the original computes some narrower, as
        ``flows`` says."""
        if self.port_forward_failed or not self.same_outputs or not self.diff:
            report.not_compared.append("second derivative not compared: forward or its outputs differ (see forward)")
            return
        every = tuple(self.diff)
        subsets = [every, *(s for s in self.subsets(report, _SECOND_LEFT) if s != every)]
        with self.torch.no_grad():
            outs = [_numpy(self.torch, t) for t in self.original_call(self.tensors())]
        cotangents = [_random(self.rng, np.shape(o), False) for o in outs]
        directions = {i: _random(self.rng, np.shape(self.given[i]), False) for i in self.diff}
        for subset in subsets:
            flags = tuple(i in subset for i in range(len(self.given)))
            name = "second derivative" + ("" if subset == every else f" needs_input_grad={flags}")
            for label, kept, narrow in self.flows():
                sent, towards = self.sent(cotangents, kept), [directions[i] for i in subset]
                if not self.second_of(report, f"{name}{label}", subset, sent, towards, narrow):
                    return

    def second_of(
        self,
        report: Report,
        check: str,
        subset: tuple[int, ...],
        cotangents: list[np.ndarray],
        directions: list[np.ndarray],
        narrow: Any,
    ) -> bool:
        """One second-derivative check, the leaves ``subset`` differentiated (the others not, so
        ``needs_input_grad`` says False for them on both sides); False where the original could not
        be differentiated twice in the first check (then no other is tried: listed once). Where it
        could not in a later one, that check alone is listed."""
        torch = self.torch
        report.checks.append(check)
        tensors = self.tensors(subset)
        wanted = [tensors[i] for i in subset]
        try:
            given = [t.clone() if getattr(t, "requires_grad", False) else t for t in tensors]
            call_args, call_kwargs = tree_unflatten(self.treedef, given)
            with torch.enable_grad():
                out = jax.tree_util.tree_leaves(self.function.apply(*call_args, **call_kwargs))
                pairs = [(o, c) for o, c in zip(out, cotangents) if getattr(o, "requires_grad", False)]
                first = torch.autograd.grad(
                    [o for o, _ in pairs],
                    wanted,
                    [_torch.tensor_of(torch, c).to(o.dtype) for o, c in pairs],
                    create_graph=True,
                    allow_unused=True,
                )
                total = sum(
                    (g * _torch.tensor_of(torch, d).to(g.dtype)).sum()
                    for g, d in zip(first, directions)
                    if g is not None and g.requires_grad
                )
                theirs = (
                    [None] * len(wanted)
                    if not isinstance(total, torch.Tensor)
                    else torch.autograd.grad(total, wanted, allow_unused=True)
                )
        except Exception as err:  # noqa: BLE001 - the original can't be differentiated twice: listed
            report.checks.remove(check)
            alone = any(c.startswith("second derivative") for c in report.checks)
            report.not_compared.append(
                f"{check if alone else 'second derivative'} not compared: the original raised {type(err).__name__} "
                f"({(str(err).splitlines() or [''])[0]})"
            )
            return alone
        computed = _computed_saves(torch, out, given)

        def first_order(*chosen: Any) -> Any:
            value, pullback = jax.vjp(self.port_of(list(subset)), *chosen)
            leaves, treedef = jax.tree_util.tree_flatten(value)
            cts = [jax.numpy.asarray(c, leaf.dtype) for leaf, c in zip(leaves, cotangents)]
            grads = pullback(jax.tree_util.tree_unflatten(treedef, cts))
            return sum((g * jax.numpy.asarray(d, g.dtype)).sum() for g, d in zip(grads, directions))

        try:
            ours = jax.grad(first_order, argnums=tuple(range(len(subset))))(*[self.leaves[i] for i in subset])
        except Exception as err:  # noqa: BLE001 - the port's second derivative raised: a row
            self.raised(report, check, err, "second derivatives")
            return True
        before = len(report.rows)
        for i, a, b in zip(subset, ours, theirs):
            b = np.zeros(np.shape(a), np.asarray(a).dtype) if b is None else _numpy(torch, b)  # None: zero
            self.values(report, check, f"parameter '{self.labels[i]}'", np.asarray(a), b, narrow)
        if len(report.rows) > before and computed and _NOT_THROUGH not in report.notes:
            report.notes.append(_NOT_THROUGH)
        return True

    # -- locating --------------------------------------------------------------------------------
    def leaves_of(self, report: Report, check: str, what: str, ours: list[Any], theirs: list[Any]) -> None:
        if len(ours) != len(theirs):
            report.rows.append(Row(check, f"{what}s", None, f"{len(ours)} outputs", f"{len(theirs)} outputs"))
            return
        for k, (a, b) in enumerate(zip(ours, theirs)):
            self.values(report, check, f"{what} {k}", np.asarray(a), _numpy(self.torch, b))

    def tolerance(self, a: np.dtype, b: np.dtype, narrow: np.dtype | None = None) -> tuple[float, float]:
        """The tolerance of the narrower of two dtypes, and of ``narrow`` (the dtype of the original's
        outputs a gradient flows from, where narrower than its inputs) where given."""
        size = min(_real_size(a), _real_size(b)) if _kind(a) in "fc" else 8
        if narrow is not None:
            size = min(size, _real_size(narrow))
        rtol, atol = _TOLERANCES.get(size, _TOLERANCES[8])
        return (self.rtol if self.rtol is not None else rtol), (self.atol if self.atol is not None else atol)

    def values(
        self, report: Report, check: str, where: str, a: np.ndarray, b: np.ndarray, narrow: np.dtype | None = None
    ) -> None:
        if a.shape != b.shape:
            report.rows.append(Row(check, where, None, f"shape {a.shape}", f"shape {b.shape}"))
            return
        narrowed = _narrowed(a.dtype, b.dtype)
        if a.dtype != b.dtype and not narrowed and _kind(a.dtype) != _kind(b.dtype):
            report.rows.append(Row(check, where, None, f"dtype {a.dtype}", f"dtype {b.dtype}"))
            return
        if narrowed:  # one note per pair of dtypes: the first value, and the count of the others
            said = f"{a.dtype} where the original has {b.dtype}, JAX's 32-bit default (x64 off)"
            seen = self.narrowed.setdefault(said, [])
            if f"{check}, {where}" not in seen:
                seen.append(f"{check}, {where}")
                note = f"{seen[0]}: {said}" + (f" (and {_count(len(seen) - 1, 'other value')})" if seen[1:] else "")
                first = next((k for k, n in enumerate(report.notes) if n.startswith(f"{seen[0]}: {said}")), None)
                if first is None:
                    report.notes.append(note)
                else:
                    report.notes[first] = note
        rtol, atol = self.tolerance(a.dtype, b.dtype, narrow)
        if _kind(a.dtype) in "fc":
            wide = np.complex128 if "c" in (_kind(a.dtype), _kind(b.dtype)) else np.float64
            a, b = a.astype(wide), b.astype(wide)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not np.all(close):
            index = tuple(int(i) for i in np.argwhere(~close)[0])
            report.rows.append(Row(check, where, index, a[index].item(), b[index].item()))


def _subsets(items: list[int]) -> tuple[list[tuple[int, ...]], int]:
    """The non-empty subsets of ``items`` compared, smallest first, and how many there are: every
    one up to ``_ALL_SUBSETS`` items; beyond, each alone, each pair, each all but one and all."""
    n = len(items)
    sizes = range(1, n + 1) if n <= _ALL_SUBSETS else (1, 2, n - 1, n)
    return [c for k in sizes for c in itertools.combinations(items, k)], 2**n - 1


def _outputs(which: list[int]) -> str:
    return f"output {which[0]}" if len(which) == 1 else "outputs " + ", ".join(str(k) for k in which)


def _computed_saves(torch: Any, outputs: list[Any], inputs: list[Any]) -> bool:
    """Whether the original's ctx holds a tensor its forward computed (neither an input nor an
    output, so without autograd history): PyTorch does not differentiate through it again."""
    node = next((o.grad_fn for o in outputs if getattr(o, "grad_fn", None) is not None), None)
    if node is None:
        return False
    try:
        saved = list(node.saved_tensors)
    except RuntimeError:
        saved = []
    saved += [v for v in vars(node).values() if isinstance(v, torch.Tensor)] if hasattr(node, "__dict__") else []
    known = {id(t) for t in (*outputs, *inputs)}
    return any(id(t) not in known and not t.requires_grad and t.is_floating_point() for t in saved)


def _said(err: Exception) -> str:
    """An exception's type and the first line of its message."""
    return f"{type(err).__name__} ({(str(err).splitlines() or [''])[0]})"


def _other_example(rng: np.random.Generator, v: np.ndarray, same: bool, near: bool) -> np.ndarray:
    """The second example of a vmap batch whose first is ``v``: floats each O(1) away (``near``:
    0.1 times a normal), integers and booleans ``v``'s values permuted (rolled along an axis,
    else reversed), so they stay valid indices, and differ where ``v`` holds two values
    (booleans negated where it holds one); ``same``: integers and booleans ``v`` itself."""
    if _is_inexact(v):
        if near:
            step = 0.1 * _random(rng, v.shape, np.iscomplexobj(v))
        else:
            step = rng.choice([-1.0, 1.0], v.shape) * rng.uniform(0.5, 1.5, v.shape)
            step = step * (1 + 1j) / np.sqrt(2) if np.iscomplexobj(v) else step
        return np.asarray(v + step).astype(v.dtype)
    if same:
        return v
    for other in [*(np.roll(v, 1, axis) for axis in range(v.ndim)), v.ravel()[::-1].reshape(v.shape)]:
        if not np.array_equal(other, v):
            return other
    return ~v if v.dtype == np.bool_ else v


def _random(rng: np.random.Generator, shape: tuple, complex_: bool) -> np.ndarray:
    """Seeded values of ``shape``, always an array (a 0-d one too: a tensor is made of it)."""
    return np.asarray(rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if complex_ else 0))


def _label(path: tuple, names: list[str]) -> str:
    """A leaf's name: the parameter (by position from the original's forward, or the keyword), then
    its key path inside that argument."""
    top, key, *rest = path
    head = str(key.key) if top.idx == 1 else (names[key.idx] if key.idx < len(names) else f"args[{key.idx}]")
    return head + keystr(tuple(rest))


def _kind(dtype: np.dtype) -> str:
    """'c', 'f' (bfloat16 and float8 too, which NumPy calls 'V'), or NumPy's kind."""
    if np.issubdtype(dtype, np.complexfloating):
        return "c"
    return "f" if jax.numpy.issubdtype(dtype, jax.numpy.floating) else dtype.kind


def _real_size(dtype: np.dtype) -> int:
    """Bytes of one real number of ``dtype`` (a complex number's part)."""
    return dtype.itemsize // 2 if _kind(dtype) == "c" else dtype.itemsize


def _takes(torch: Any, function: Any, treedef: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a PyTorch Function's forward takes a call's arguments: after ctx, or alone where
    the Function has setup_context (PyTorch 2's form)."""
    try:
        signature = inspect.signature(function.forward)
    except (TypeError, ValueError):
        return True
    count = len(treedef.children()[0].children())
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
    return _is_array(value) and jax.numpy.issubdtype(value.dtype, jax.numpy.inexact)  # bfloat16 too


def _numpy(torch: Any, value: Any) -> np.ndarray:
    """A tensor (or array) as a NumPy array, by ``from_torch``'s conversion."""
    if isinstance(value, torch.Tensor):
        return np.asarray(_torch.array_of(torch, value))
    return np.asarray(value)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, complex):
        return f"{value:.6g}"
    return str(value)
