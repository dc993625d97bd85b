"""``jaxfn.gradcheck``: does a backward agree with central finite differences, and where not."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from ._arguments import DIFF, dtype_kind, is_real_number, is_torch_tensor, leaf_kind
from ._errors import (
    GRADCHECK,
    AutogradFunctionError,
    AutogradFunctionTypeError,
    AutogradFunctionValueError,
    GradcheckError,
    error,
    gradcheck_of,
    type_name,
)
from ._function import AutogradFunction, Function
from ._jax_private import callback_exception, refused_forward_mode, reports_callback_error
from ._keys import Unkeyable, static_key, structure_key
from ._rule import FORWARD_MODE_HELP, plain_forward, replaced


@dataclasses.dataclass
class GradcheckReport:
    """What ``jaxfn.gradcheck`` checked: true when every check that ran passed.

    ``ran``: the checks run, each against ``forward`` itself (run without any of the user's
    rules); ``not_run``: the checks that could not run or were not asked for, each with why;
    ``failure``: the first disagreement's message (``None`` when every check passed).
    ``str(report)`` lists all three.
    """

    name: str
    ran: list[str] = dataclasses.field(default_factory=list)
    not_run: list[str] = dataclasses.field(default_factory=list)
    failure: str | None = None

    def __bool__(self) -> bool:
        return self.failure is None

    def __str__(self) -> str:
        checks = f"{len(self.ran)} check{'' if len(self.ran) == 1 else 's'}"
        if self:
            head = f"jaxfn.gradcheck '{self.name}': passes ({checks})"
        else:  # it stops at the first failure: the one that failed ran too, later ones did not
            head = f"jaxfn.gradcheck '{self.name}': fails ({checks} passed, then one failed)"
        lines = [head, *(f"ran: {check}" for check in self.ran), *(f"not run: {why}" for why in self.not_run)]
        if self.failure is not None:
            lines.append(f"failed: {self.failure}")
            lines.append("not run: the checks after the one that failed (gradcheck stops at the first failure)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def gradcheck(
    fn: Callable[..., Any],
    *args: Any,
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    order: int | None = None,
    raise_exception: bool | None = None,
    check_forward_ad: bool | None = None,
    check_batched_grad: bool | None = None,
    **kwargs: Any,
) -> GradcheckReport:
    """Check every rule of `fn` (backward, and its jvp and vmap rules) against `forward` itself.

    Each check compares a rule with `forward` run without any of the user's rules (no custom
    backward, jvp or vmap rule, in `fn` or in the jaxfn functions it calls), so two rules that
    agree with each other but not with forward fail:

    - backward (always): the whole Jacobian `jax.vjp` gives against central finite differences of
      forward, with every non-empty set of the arguments differentiated (a backward may branch on
      `ctx.needs_input_grad`; above 5 arguments all, each alone and each all but one, and the
      report lists the sets left out), and, with several outputs, each output alone given a
      cotangent (the others none: `None` under `ctx.set_materialize_grads(False)`);
    - forward mode (a `jvp` rule, or the one `forward_mode=True` derives): `jax.jvp` of the function
      of each set of arguments backward is checked with (the others not perturbed: no tangent,
      `ctx.needs_input_grad` False) along random directions, every output element against finite
      differences of forward along the same directions;
    - batching (a `vmap` rule): `jax.vmap` over three or more examples O(1) apart (integer and
      boolean arrays: their own values rearranged) against a Python loop of forward, the value of
      every array output (integer and non-differentiable ones included), and the gradient under
      `jax.vmap` against backward one example at a time, with every array argument batched on axis
      0 (also in a batch of one), each argument alone (all its leaves; the others unbatched), every
      other non-empty set of the arguments batched (the others unbatched; above 5 arguments each
      all but one, and the report lists the sets left out), each leaf of a pytree argument alone,
      every one on its last axis, and mixed axes: each argument on its last axis, the others on
      axis 0. A Python number is never batched: it is passed as given, as a call under `jax.vmap`
      passes it;
    - the derivative of backward (`order=2`): reverse over reverse, along random directions,
      against finite differences of backward, with the same sets of arguments differentiated as
      backward (the sets left out above 5 arguments listed too) and, with several outputs, each
      output alone given a cotangent.

    An exception that forward or backward raises in one of these cases (a `None` grad_output
    multiplied, a jaxfn refusal) fails the check, as a jvp or vmap rule's does: the message names
    the case (the inputs differentiated, the outputs given a cotangent) and the exception, and is
    chained from it.

    By default every rule the function has is checked; for a callable that is not itself a jaxfn
    function (a `lambda` around one), forward mode is checked where `jax.jvp` of it is not
    refused, and batching always. The report says which checks ran and which could not (and why).

    Every floating-point or complex leaf of every argument is checked (arrays of any precision,
    bfloat16 and float8 included, and Python and NumPy float scalars: they are the values to
    check), through every differentiable output (outputs marked non-differentiable, integer
    outputs and Python values are left out of the gradients; the batching check compares every
    array output's value), in float64 / complex128: x64 is switched on with JAX's own context
    manager for the check only, so the setting in force before (global or a `jax.enable_x64`
    context) is back afterwards. Integer, boolean and other arguments are passed through
    unchanged (batched, for the batching check, as their own values rearranged). Complex leaves
    follow JAX's convention: the derivative along a direction `d` is `Re(sum(grad * d))`, checked
    along real and imaginary directions. A call with nothing to check (no floating leaf, or no
    differentiable output) raises.

    Cost: up to 4M entries (and 8,192 inputs or outputs), the whole Jacobian is compared
    element by element. The finite differences (two evaluations of forward per input element)
    are one program, compiled once per call structure (the function, the arguments' shapes,
    dtypes and Python values) and kept for the next call, checked against forward as called (at
    x and a nearby point) and traced again where forward changed (a global it reads); backward's
    side runs forward once per set of differentiated arguments and backward as one `vmap` batch
    over the output elements. Above that size, the outputs are reduced to one scalar with a fixed
    random cotangent and each leaf is checked along one random direction (PyTorch's fast mode);
    only a leaf that fails is located element by element. `order=2` repeats the check for the
    derivative of backward (reverse over reverse), along random directions. The sets of
    arguments grow with their number n: 2^n - 1 sets up to 5 arguments (31), then 2n + 1; each set
    costs backward's check (and, with `order=2`, one derivative of backward) one more pass, and
    the batching check one more `jax.vmap` and loop of forward.

    An option that is also a parameter of `fn` is refused as ambiguous: pass the function's own
    through a `lambda`.

    Args:
      fn: a jaxfn function (a `Function` subclass or its `apply`), or any JAX-differentiable callable.
      *args: the positional arguments to call `fn` with.
      eps: the finite-difference step (default `1e-6`).
      atol: the absolute tolerance (default `1e-5`): a gradient passes where
        `|analytical - numerical| <= atol + rtol * |numerical|`.
      rtol: the relative tolerance (default `1e-3`), as in the formula of `atol`.
      order: 1 (the default) checks backward; 2 also checks the derivative of backward.
      raise_exception: raise on failure (the default, `True`), or return the failing report.
      check_forward_ad: `None` (the default): check forward mode where the function has a
        forward-mode rule; `True`: check it (a function without one is an error, as `jax.jvp`
        of it is); `False`: don't.
      check_batched_grad: `None` (the default): check `jax.vmap` where the function has a vmap
        rule (or is not a jaxfn function); `True`: check it for any function; `False`: don't.
      **kwargs: the keyword arguments to call `fn` with.

    Returns:
      A report, true when every check that ran passed (false, with the failure, where one failed
      and `raise_exception=False`); `str(report)` lists the checks that ran and those that could
      not, with why.

    Raises:
      GradcheckError: naming the check, the parameter (and pytree key path), the worst element's
        index, the analytical and numerical values, and the tolerance; or saying that nothing
        could be checked, or that an option is also a parameter of `fn`.
      AutogradFunctionError: for an `order` other than 1 or 2.

    >>> import jax.numpy as jnp, jaxfn
    >>> square = jaxfn.autograd_function(lambda ctx, x: (ctx.save_for_backward(x), x**2)[1],
    ...                                  lambda ctx, g: g * 2 * ctx.saved_tensors[0], name="square")
    >>> report = jaxfn.gradcheck(square, jnp.array([1.0, 2.0]))
    >>> bool(report)
    True
    >>> print(report)  # doctest: +NORMALIZE_WHITESPACE
    jaxfn.gradcheck 'square': passes (1 check)
    ran: backward against finite differences of forward
    not run: forward mode: the function has no jvp rule (and not forward_mode=True)
    not run: batching: the function has no vmap rule (jax.vmap batches forward's own operations)
    not run: order 2: not asked for (order=2 checks the derivative of backward)
    """
    options = {
        "eps": eps,
        "atol": atol,
        "rtol": rtol,
        "order": order,
        "raise_exception": raise_exception,
        "check_forward_ad": check_forward_ad,
        "check_batched_grad": check_batched_grad,
    }
    if not callable(fn):
        raise error(
            AutogradFunctionTypeError,
            GRADCHECK,
            f"gradcheck takes the function first, then its arguments (gradcheck(f, x)), but got {type_name(fn)} "
            "as the function",
        )
    if isinstance(fn, type) and issubclass(fn, Function):
        fn = fn.apply  # the class, as jaxfn.compare takes it
    _refuse_ambiguous_options(fn, [name for name, value in options.items() if value is not None])
    for option, value in (("eps", eps), ("atol", atol), ("rtol", rtol)):
        if value is not None and (not is_real_number(value) or not value >= 0 or (option == "eps" and value == 0)):
            wanted = "a positive number" if option == "eps" else "a number >= 0"
            raise error(
                AutogradFunctionValueError,
                gradcheck_of(_name(fn)),
                f"{option} must be {wanted}, but got {type_name(value)} ({value!r})",
            )
    eps, atol, rtol = 1e-6 if eps is None else eps, 1e-5 if atol is None else atol, 1e-3 if rtol is None else rtol
    order, raise_exception = 1 if order is None else order, True if raise_exception is None else raise_exception
    if order not in (1, 2):
        raise error(AutogradFunctionValueError, gradcheck_of(_name(fn)), f"order must be 1 or 2, but got {order!r}")
    report = GradcheckReport(_name(fn))
    try:
        with jax.enable_x64(True):  # JAX's context manager: restores whatever setting (or context) was in force
            _gradcheck(fn, args, kwargs, eps, atol, rtol, order, check_forward_ad, check_batched_grad, report)
    except GradcheckError as err:
        if raise_exception:
            raise
        report.failure = str(err)
    except AutogradFunctionError as err:  # PyTorch's gradcheck(f, (x, y)) form: said where it fails
        if len(args) == 1 and isinstance(args[0], (tuple, list)) and not kwargs and err.args:
            err.args = (
                f"{err.args[0]} (jaxfn.gradcheck takes the arguments unpacked, gradcheck(f, x, y), where "
                "PyTorch's takes them as one tuple, gradcheck(f, (x, y))).",
                *err.args[1:],
            )
        raise
    return report


def _refuse_ambiguous_options(fn: Callable[..., Any], given: list[str]) -> None:
    """An option given to gradcheck that is also a parameter of ``fn`` could mean either."""
    target = _jaxfn_function(fn)
    try:
        signature = target._definition.signature if target is not None else inspect.signature(fn)
    except (TypeError, ValueError):
        return
    clash = [name for name in given if name in signature.parameters]
    if clash:
        raise error(
            GradcheckError,
            gradcheck_of(_name(fn)),
            f"{', '.join(map(repr, clash))} is both an option of gradcheck and a parameter of the function, so it "
            "is ambiguous here; pass the function's value through a lambda (gradcheck(lambda x: f(x, eps=1e-5), x, "
            "eps=1e-6))",
        )


def _gradcheck(fn, args, kwargs, eps, atol, rtol, order, forward_ad, batched_grad, report) -> None:
    who = gradcheck_of(_name(fn))  # what every message opens with
    with_paths, treedef = tree_flatten_with_path((args, kwargs))
    labels, heads = _labels(fn, args, [path for path, _ in with_paths])
    for label, (_, leaf) in zip(labels, with_paths):
        if is_torch_tensor(leaf):
            raise error(
                AutogradFunctionTypeError,
                who,
                f"argument '{label}' is a torch.Tensor, but gradcheck takes JAX or NumPy arrays; pass "
                "jnp.asarray(t.detach().cpu().numpy())",
            )
    leaves = [_as_checked(leaf) for _, leaf in with_paths]
    floating = [i for i, leaf in enumerate(leaves) if leaf_kind(leaf) == DIFF]
    checked = [i for i in floating if np.size(leaves[i])]  # a zero-size leaf has no element to check
    if not checked:
        raise error(GradcheckError, who, _EMPTY_INPUTS if floating else _NO_INPUTS)
    rng = np.random.default_rng(0)
    select, flags = _outputs_to_check(fn, args, kwargs, leaves, treedef)
    call = _Call(fn, treedef, leaves, checked, select)
    x0 = [leaves[i] for i in checked]
    checked_labels = [f"'{labels[i]}'" for i in checked]
    out_shapes = jax.eval_shape(call, x0)
    if not out_shapes:
        raise error(
            GradcheckError,
            who,
            "there is nothing to check: no output is floating-point or complex and differentiable with at least "
            "one element, so no gradient flows back",
        )
    plain = _plain(call)  # forward itself: no custom rule, in fn or in the jaxfn functions it calls
    inputs = sum(2 * np.size(x) if jnp.iscomplexobj(x) else np.size(x) for x in x0)
    outputs = sum(2 * np.prod(o.shape) if jnp.iscomplexobj(o) else np.prod(o.shape) for o in out_shapes)
    # A backward may branch on ctx.needs_input_grad (one flag per argument): every non-empty set of
    # the arguments differentiated (the others held constant) up to _EVERY_SET arguments; above,
    # all, each alone and each all but one, and the report says how many sets were not checked.
    patterns, described, left_out = _patterns([heads[i] for i in checked])
    if left_out:
        report.not_run.append(left_out)
    forward_mode, batching = _rules_to_check(fn, forward_ad, batched_grad, report)
    alone_outputs = len(out_shapes) > 1  # each output alone: the others get no cotangent (None, unmaterialized)
    if inputs * outputs <= JACOBIAN_ENTRIES and max(inputs, outputs) <= JACOBIAN_SIDE:
        _check_jacobians(call, plain, flags, x0, patterns, checked_labels, eps, atol, rtol, who)
    else:  # too large for the full Jacobian: each leaf along a random direction (PyTorch's fast mode)
        everything = list(range(len(x0)))
        for which, suffix, output in [
            *patterns,
            *((everything, _output_alone(j), j) for j in range(len(out_shapes)) if alone_outputs),
        ]:
            sub_x0 = [x0[k] for k in which]
            sub_labels = [checked_labels[k] + suffix for k in which]
            cotangent = _random_like(rng, out_shapes if output is None else out_shapes[output])
            scalar, reference = (
                lambda diff, f=f, c=cotangent, w=which, o=output: _vdot(c, _of_output(_restricted(f, x0, w, diff), o))
                for f in (call, plain)
            )
            case = _case(which, checked_labels, output, len(out_shapes))
            with _raising(
                who, "forward or backward", case, _GRADIENT_EXPECTED, _backward_fix(output, "forward and backward")
            ):
                _check(scalar, reference, sub_x0, sub_labels, eps, atol, rtol, rng, "", who)
    # listed once it passed: a failing check is the report's failure, not a check that passed
    report.ran.append("backward against finite differences of forward" + _sets(patterns, described, _DIFFERENTIATED))
    if alone_outputs:
        report.ran.append(
            f"backward with each of the {len(out_shapes)} outputs alone given a cotangent (the others none: None "
            "under ctx.set_materialize_grads(False)) against finite differences of forward"
        )
    if len(out_shapes) > 2:  # every output, and each alone, were given cotangents; the other sets were not
        n = len(out_shapes)
        sizes = "2" if n == 3 else f"2 to {n - 1}"
        report.not_run.append(
            f"backward with the other {2**n - 2 - n} sets of the {n} outputs given cotangents ({sizes} of them, the "
            "others none): every output and each alone were checked"
        )
    if forward_mode is not None:
        if _check_forward(call, plain, x0, patterns, checked_labels, out_shapes, eps, atol, rtol, rng, who, forward_ad):
            report.ran.append(
                f"{forward_mode} against finite differences of forward, element by element"
                + _sets(patterns, described, _PERTURBED)
            )
            if left_out:
                report.not_run.append(
                    left_out.replace("backward with", f"{forward_mode} with", 1).replace(
                        " differentiated (", " perturbed (", 1
                    )
                )
        else:
            report.not_run.append(f"{forward_mode}: a jaxfn function it calls has no forward-mode rule")
    if batching is not None:
        given = [with_paths[i][1] for i in checked]
        names = [labels[i] for i in (*checked, *call.others)], [heads[i] for i in (*checked, *call.others)]
        batchings, left_out_batchings = _check_batched(call, x0, given, names, out_shapes, atol, rtol, rng, who)
        if batchings is None:
            report.not_run.append(
                f"{batching}: no argument is an array to batch (a Python number is passed unbatched under "
                "jax.vmap, as a call passes it)"
            )
        else:
            report.ran.append(
                f"{batching} against a loop of forward (the value of every array output, integer and "
                f"non-differentiable ones included), and backward under jax.vmap: {batchings}"
            )
            if left_out_batchings:
                report.not_run.append(f"{batching} with {left_out_batchings}")
    if order == 2:
        _check_second(call, x0, patterns, checked_labels, out_shapes, eps, atol, rtol, rng, who)
        report.ran.append(
            "order 2: the derivative of backward against finite differences of backward"
            + _sets(patterns, described, _DIFFERENTIATED)
            + (f", and with each of the {len(out_shapes)} outputs alone given a cotangent" if alone_outputs else "")
        )
        if left_out:
            report.not_run.append(left_out.replace("backward with", "order 2: the derivative of backward with", 1))
    else:
        report.not_run.append("order 2: not asked for (order=2 checks the derivative of backward)")


def _rules_to_check(fn, forward_ad, batched_grad, report) -> tuple[str | None, str | None]:
    """Which of forward mode and batching to check (what each check is called), by default the
    rules the function has; what is not checked goes into ``report.not_run`` with why."""
    target = _jaxfn_function(fn)
    if target is None:
        forward_mode = None if forward_ad is False else "forward mode (jax.jvp)"
        batching = None if batched_grad is False else "jax.vmap"
    else:
        has_jvp, derived = target._definition.jvp is not None, target.forward_mode
        rule = "the jvp rule" if has_jvp else "forward mode derived from backward (forward_mode=True)"
        forward_mode = rule if forward_ad or (forward_ad is None and (has_jvp or derived)) else None
        if forward_ad is None and not (has_jvp or derived):
            report.not_run.append("forward mode: the function has no jvp rule (and not forward_mode=True)")
        has_vmap = target._definition.vmap is not None
        batching = None
        if batched_grad or (batched_grad is None and has_vmap):
            batching = "the vmap rule" if has_vmap else "jax.vmap"
        elif batched_grad is None:
            report.not_run.append("batching: the function has no vmap rule (jax.vmap batches forward's own operations)")
    if forward_ad is False:
        report.not_run.append("forward mode: turned off (check_forward_ad=False)")
    if batched_grad is False:
        report.not_run.append("batching: turned off (check_batched_grad=False)")
    return forward_mode, batching


class _Call:
    """``fn`` as a function of the checked leaves (the other arguments as given), giving the
    outputs to check; ``with_others`` calls it with the other array leaves replaced."""

    def __init__(self, fn, treedef, leaves, checked, select):
        self.fn, self.treedef, self.leaves, self.checked, self.select = fn, treedef, leaves, checked, select
        self.others = [i for i, leaf in enumerate(leaves) if _is_array(leaf) and i not in checked]

    def __call__(self, diff: list[Any]) -> list[Any]:
        return self.with_others([self.leaves[i] for i in self.others], diff)

    def with_others(self, others: list[Any], diff: list[Any]) -> list[Any]:
        return self.select(self.output(others, diff))

    def every(self, others: list[Any], diff: list[Any]) -> list[Any]:
        """Every leaf of the output: each array (integer, non-differentiable included), None for a
        Python value."""
        return [leaf if _is_array(leaf) else None for leaf in jax.tree_util.tree_leaves(self.output(others, diff))]

    def output(self, others: list[Any], diff: list[Any]) -> Any:
        full = list(self.leaves)
        for i, value in (*zip(self.others, others), *zip(self.checked, diff)):
            full[i] = value
        call_args, call_kwargs = tree_unflatten(self.treedef, full)
        return self.fn(*call_args, **call_kwargs)

    def key(self, flags: Any) -> Any:
        """What the call's compiled programs are kept under: the function, the structure, the
        arrays' shapes and dtypes and the Python values (strictly keyed); None where one of them
        can't be a key."""
        try:
            hash(self.fn)
            statics = tuple(
                (np.shape(leaf), str(np.asarray(leaf).dtype)) if _is_array(leaf) else static_key(leaf)
                for leaf in self.leaves
            )
            return (self.fn, structure_key(self.treedef), statics, tuple(self.checked), flags)
        except (TypeError, Unkeyable):
            return None


def _plain(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with every jaxfn function it calls running its forward's operations, no custom rule
    (backward, jvp, vmap): the reference every check compares a rule against."""

    def plain(*args: Any) -> Any:
        with plain_forward():
            return f(*args)

    return plain


_ALONE = " (differentiated alone, the other inputs held constant)"
_GRADIENT_EXPECTED = "finite differences of forward give a gradient"  # what a message about an exception expected
_CALL_RAN = "the call with the arguments given ran"
_FORWARD_FIX = "check the function's forward"
_DIFFERENTIATED = "differentiated (the others held constant)"
_PERTURBED = "perturbed (the others not: no tangent, needs_input_grad False)"
_NO_INPUTS = (
    "there is nothing to check: no argument has a floating-point or complex leaf (Python and NumPy floats count; "
    "integers, booleans and other values are passed through), so no gradient was compared"
)
_EMPTY_INPUTS = (
    "there is nothing to check: every floating-point or complex leaf of the arguments has zero size (a shape "
    "with a 0 in it), so there is no element to compare; give at least one argument a non-empty shape"
)


_EVERY_SET = 5  # up to this many arguments, backward is checked with every non-empty set of them differentiated


def _patterns(heads: list[str]) -> tuple[list[tuple[list[int], str, None]], str, str]:
    """The sets of checked leaves to differentiate (the others held constant), each with what a
    failure adds to the leaf's name; what the report's line adds; what it says was not checked.

    ``ctx.needs_input_grad`` has one flag per argument (``heads``: each checked leaf's argument):
    every non-empty set of the arguments up to ``_EVERY_SET`` of them (2^n - 1 sets), else all,
    each alone and each all but one; and each leaf of a pytree argument alone."""
    names = list(dict.fromkeys(heads))
    groups = [[k for k, head in enumerate(heads) if head == name] for name in names]
    n = len(groups)
    chosen, skipped = _argument_sets(n)
    if not skipped:
        described = f"every non-empty set of the {n} arguments" if n > 1 else ""
        left_out = ""
    else:
        described = f"all {n} arguments, each alone and each all but one"
        left_out = (
            f"backward with the other {skipped} of the {(1 << n) - 1} sets of the {n} arguments differentiated "
            f"(needs_input_grad patterns): all, each alone and each all but one were checked (every set is checked "
            f"up to {_EVERY_SET} arguments)"
        )
    patterns: list[tuple[list[int], str, None]] = []
    for which in chosen:
        leaves = [k for g in which for k in groups[g]]
        if len(which) == n:
            suffix = ""
        elif len(leaves) == 1:
            suffix = _ALONE
        else:
            suffix = (
                f" (with {_listed([repr(names[g]) for g in which])} differentiated, the other inputs held constant)"
            )
        patterns.append((sorted(leaves), suffix, None))
    several = [group for group in groups if len(group) > 1]
    patterns += [([k], _ALONE, None) for group in several for k in group]
    if several:
        described = f"{described}; " if described else ""
        described += "each leaf of a pytree argument alone"
    return patterns, described, left_out


def _argument_sets(n: int) -> tuple[list[list[int]], int]:
    """The sets of ``n`` arguments a check takes, all first, then each alone, then the others by
    size: every non-empty set up to ``_EVERY_SET`` arguments, else all, each alone and each all
    but one; and how many sets that leaves out."""
    if n <= _EVERY_SET:
        sets = sorted(range(1, 1 << n), key=lambda s: (s != (1 << n) - 1, bin(s).count("1") != 1, bin(s).count("1")))
        chosen = [[g for g in range(n) if s >> g & 1] for s in sets]
    else:
        chosen = [list(range(n)), *([g] for g in range(n)), *([h for h in range(n) if h != g] for g in range(n))]
    return chosen, (1 << n) - 1 - len(chosen)


def _sets(patterns: list, described: str, how: str) -> str:
    """What a report's line adds for the sets of inputs ``patterns`` (``how``: what is done to a set)."""
    return f", with {len(patterns)} sets of inputs {how}: {described}" if len(patterns) > 1 else ""


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _output_alone(j: int) -> str:
    return f" (output {j} alone given a cotangent, the others none)"


def _of_output(outs: list[Any], output: int | None) -> Any:
    """All the outputs, or output ``output`` alone (so the others get no cotangent)."""
    return outs if output is None else outs[output]


def _restricted(f: Callable[[list[Any]], Any], x0: list[Any], which: list[int], diff: list[Any]) -> Any:
    """``f`` of the inputs ``which`` only; the others are the constants ``x0``, so JAX does not
    differentiate them (their needs_input_grad is False)."""
    full = list(x0)
    for k, value in zip(which, diff):
        full[k] = value
    return f(full)


def _case(which: list[int], labels: list[str], output: int | None, outputs: int) -> str:
    """How a message says which case of backward's check ran: the inputs differentiated (``which``,
    of ``labels``) and the outputs given a cotangent (``output`` alone, or all where None)."""
    if len(which) == len(labels):
        inputs = "every input differentiated" if len(labels) > 1 else f"{labels[0]} differentiated"
    else:
        named = _listed([labels[k] for k in which])
        inputs = f"{named} differentiated (the other inputs held constant: needs_input_grad False)"
    if outputs == 1:
        cotangents = "its output given a cotangent"
    elif output is None:
        cotangents = f"each of the {outputs} outputs given a cotangent"
    else:
        cotangents = f"output {output} alone given a cotangent (the others none)"
    return f"with {inputs} and {cotangents}"


def _backward_fix(output: int | None, rules: str = "backward") -> str:
    """What a message about ``rules`` (backward) raising tells the user to do."""
    if output is None:
        return f"check the function's {rules}"
    return (
        f"check the function's {rules}: an output given no cotangent gets grad_output None under "
        "ctx.set_materialize_grads(False) (test it: `if grad is not None`), zeros otherwise"
    )


def _said(err: BaseException) -> str:
    """An exception's type and the first line of its message; for JAX's report that host code
    (a callback) raised, the host code's exception: itself where JAX kept it, else the last line
    of the traceback JAX's message carries."""
    context = err.__context__
    if context is not None and reports_callback_error(err, context):
        err = context
    else:
        carried = callback_exception(err)
        if carried is not None:
            return f"{carried[0]} ({carried[1]})"
    return f"{type(err).__name__} ({(str(err).splitlines() or [''])[0]})"


@contextlib.contextmanager
def _raising(who: str, what: str, case: str, expected: str, fix: str) -> Iterator[None]:
    """An exception raised while gradcheck runs one of its cases (``what`` ran ``case``, where
    ``expected`` says what came instead elsewhere) is a failure naming the case, with ``fix``,
    chained from the exception, as a jvp or vmap rule's is (a jaxfn refusal included);
    gradcheck's own failures pass through as they are."""
    try:
        yield
    except GradcheckError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's code (or a refusal of it) raised: a failure
        raise error(
            GradcheckError,
            who,
            f"{what} raised {_said(err)} {case}, where {expected}; {fix}",
        ) from err


# Up to this many entries (inputs x outputs, real and imaginary parts counted apart), the whole
# Jacobian is compared element by element, as PyTorch's gradcheck does; above (or with more than
# JACOBIAN_SIDE inputs or outputs), each input leaf is checked along a random direction
# (PyTorch's fast mode).
JACOBIAN_ENTRIES = 1 << 22
JACOBIAN_SIDE = 8192  # and at most this many inputs or outputs: one VJP per output, one pair of calls per input
_CHUNK = 1 << 20  # entries computed per vmapped batch


def _check_jacobians(call, plain, flags, x0, patterns, labels, eps, atol, rtol, who) -> None:
    """Every element of the Jacobian of the real view of ``call``: backward's against central
    finite differences of forward (one compiled program run without any custom rule), for each
    pattern of differentiated inputs (``patterns``, in order), then, with several outputs, for
    each output alone (the others get no cotangent). Complex inputs and outputs are split into
    real and imaginary parts, so JAX's convention for complex gradients is checked as a real
    Jacobian. The finite differences do not depend on which inputs are differentiated or which
    outputs carry a cotangent: computed once."""
    parts = [(k, part) for k, x in enumerate(x0) for part in (("real", "imag") if jnp.iscomplexobj(x) else (None,))]
    r0 = [jnp.real(x0[k]) if part == "real" else jnp.imag(x0[k]) if part == "imag" else x0[k] for k, part in parts]
    widths = [int(np.prod(o.shape)) * (2 if jnp.iscomplexobj(o) else 1) for o in jax.eval_shape(call, x0)]
    size, columns = sum(widths), np.cumsum([0, *widths])
    n = sum(int(np.size(r)) for r in r0)
    chunk = _chunk(n, size)
    numerical = None
    everything = list(range(len(x0)))
    alone = [(everything, _output_alone(j), j) for j in range(len(widths))] if len(widths) > 1 else []
    for which, suffix, output in [*patterns, *alone]:
        own = [j for j, (k, _) in enumerate(parts) if k in which]
        case = _case(which, labels, output, len(widths))
        analytical, value = _analytical_jacobian(call, x0, parts, r0, own, output, chunk, (who, case))
        if numerical is None:  # forward's value at x0, as backward's side computed it, validates the program
            numerical = _numerical_jacobian(call, plain, flags, x0, parts, r0, eps, chunk, value, who)
        cut = slice(None) if output is None else slice(columns[output], columns[output + 1])
        for j, ana in zip(own, analytical):
            (k, part), shape = parts[j], np.shape(r0[j])
            _compare(labels[k] + suffix, part, shape, ana, numerical[j][:, cut], atol, rtol, who)


def _chunk(n: int, size: int) -> int:
    """How many rows one batch computes: every row (2n moves, x0 and a nearby point; or ``size``
    cotangents) where that fits in ``_CHUNK`` entries."""
    return max(1, min(max(2 * n + 2, size), _CHUNK // max(n, size)))


_PROGRAMS: collections.OrderedDict[Any, Any] = collections.OrderedDict()  # the last _KEPT calls' programs
_KEPT = 32
_QUICK_COMPILE = {"xla_backend_optimization_level": 0}


def _run(program: tuple[Any, Any], *args: Any) -> Any:
    """The finite-difference program, compiled quickly where the backend takes the option."""
    quick, usual = program
    try:
        return quick(*args)
    except jax.errors.JaxRuntimeError as err:
        if "compile option" not in str(err):
            raise
    return usual(*args)


def _finite_differences_program(call: _Call, flags: Any, fresh: bool = False) -> Any:
    """One compiled program: forward, run without any custom rule, at a batch of moves of the
    checked real parts, each row its flat outputs. Kept per call structure (``_Call.key``), so
    the next check of the same function on arguments of the same shapes compiles nothing;
    ``fresh``: traced again (forward read a value that has changed since, a global), and kept."""
    key = call.key(flags)
    program = _PROGRAMS.get(key) if key is not None and not fresh else None
    if program is None:

        def perturbed(parts: tuple, others: list[Any], r0: list[Any], steps: list[Any]) -> Any:
            values = [r + d for r, d in zip(r0, steps)]
            with plain_forward():
                return _flat(call.with_others(others, _joined([None] * len(call.checked), list(parts), values)))

        batched = jax.vmap(perturbed, in_axes=(None, None, None, 0))
        # XLA's optimization level 0: the program runs once or twice, so compiling it is most of its
        # cost (an unrolled 50-step loop: 1 s instead of 2 s on a 2-core CPU); a backend without the
        # option compiles it as usual (_run)
        program = (
            jax.jit(batched, static_argnums=0, compiler_options=_QUICK_COMPILE),
            jax.jit(batched, static_argnums=0),
        )
        if key is not None:
            _PROGRAMS[key] = program
            while len(_PROGRAMS) > _KEPT:
                _PROGRAMS.popitem(last=False)
    else:
        _PROGRAMS.move_to_end(key)
    return program


def _joined(x0: list[Any], parts: list[tuple], values: list[Any]) -> list[Any]:
    """The leaves ``x0`` with the real ``parts`` (leaf index, "real" | "imag" | None) set to
    ``values``: real and imaginary parts joined into complex leaves."""
    leaves = list(x0)
    for (k, part), value in zip(parts, values):
        leaves[k] = value if part in (None, "real") else leaves[k] + 1j * value
    return leaves


def _flat(outs: list[Any]) -> Any:
    """The outputs as one float64 vector, complex ones split into real and imaginary parts."""
    pieces = [p for o in outs for p in ((jnp.real(o), jnp.imag(o)) if jnp.iscomplexobj(o) else (o,))]
    return jnp.concatenate([jnp.ravel(p).astype(jnp.float64) for p in pieces])


def _steps(r0: list[Any], moved: np.ndarray) -> list[np.ndarray]:
    """A batch of moves of the real parts ``r0`` from rows of joined moves (made on the host, one
    chunk at a time)."""
    sizes = [int(np.size(r)) for r in r0]
    offsets = np.cumsum([0, *sizes])
    return [moved[:, o : o + s].reshape((len(moved), *np.shape(r))) for r, s, o in zip(r0, sizes, offsets)]


def _numerical_jacobian(call, plain, flags, x0, parts, r0, eps, chunk, value, who) -> list[np.ndarray]:
    """Central differences of forward along every real input element, one (elements, size) block
    per part: the +eps and -eps evaluations of every element as one batch of the compiled
    program. Where that program can't be made (forward is host code, which a compiled program
    can't run without its rules), forward is run one element at a time, as it is called.

    A kept program holds what forward read when it was traced (a global, an object's attribute):
    the same batch also evaluates x0 and a nearby point, compared with forward run as it is called
    (``value``: forward at x0, as backward's side ran it; and forward at the nearby point); where
    they differ, forward is traced again. An exception forward raises is a failure (``who``: what
    the message opens with)."""
    sizes = [int(np.size(r)) for r in r0]
    n, offsets = sum(sizes), np.cumsum([0, *sizes])
    others = [call.leaves[i] for i in call.others]
    rng = np.random.default_rng(1)  # its own: the other checks' random directions stay as they were
    nearby = np.concatenate([np.ravel(rng.standard_normal(np.shape(r)) * 1e-2 * (1 + np.abs(r))) for r in r0])

    def batch(rows: np.ndarray) -> tuple:  # rows n to 2n - 1: the -eps moves; 2n: x0; 2n + 1: the nearby point
        moved = np.zeros((len(rows), n))
        step = np.nonzero(rows < 2 * n)[0]
        moved[step, rows[step] % n] = np.where(rows[step] < n, eps, -eps)
        moved[rows == 2 * n + 1] = nearby
        return (_steps(r0, moved),)

    def evaluate(program: Any) -> np.ndarray:
        return _in_chunks(lambda steps: _run(program, tuple(parts), others, r0, steps), batch, 2 * n + 2, chunk)

    fix = _FORWARD_FIX
    try:
        values = evaluate(_finite_differences_program(call, flags))
    except Exception:  # noqa: BLE001  (no program: one element at a time, which raises a real error itself)
        case = "with one input element at a time moved by eps and by -eps"
        with _raising(
            who, "forward (run without the function's rules, for the finite differences)", case, _CALL_RAN, fix
        ):
            return [_numerical_one_by_one(plain, x0, parts, r0, j, eps) for j in range(len(parts))]
    near = [jax.device_put(np.asarray(r) + m[0]) for r, m in zip(r0, _steps(r0, nearby[None]))]
    # forward at the nearby point as backward's side ran it at x0 (in jax.vjp, whose staged forward is compiled)
    case = "at a point near the arguments (each element moved by about 1%), where gradcheck checks its kept program"
    with _raising(who, "forward (run by jax.vjp)", case, _CALL_RAN, fix):
        called = jax.vjp(lambda values: _flat(call(_joined(x0, parts, values))), near)[0]
    expected = np.stack([np.asarray(value), np.asarray(called)])
    if not _same(values[2 * n :], expected):  # forward now computes something else: traced again
        values = evaluate(_finite_differences_program(call, flags, fresh=True))
    difference = (values[:n] - values[n : 2 * n]) / (2 * eps)  # (n, size)
    return [difference[o : o + s] for o, s in zip(offsets, sizes)]


def _same(program: np.ndarray, called: np.ndarray) -> bool:
    """Whether the compiled program's values are forward's as called, but for rounding (float32
    rounding inside forward included: a change of forward that moves its value at the nearby
    point by less is a change of its derivative within gradcheck's own tolerance)."""
    scale = np.max(np.abs(np.where(np.isfinite(called), called, 0)), initial=0.0)
    return bool(np.allclose(program, called, rtol=1e-6, atol=1e-6 * scale + 1e-12, equal_nan=True))


def _numerical_one_by_one(f, x0, parts, r0, j, eps) -> np.ndarray:
    """Central differences of ``f`` along every element of real part ``j``, one element at a time
    in a Python loop, as ``f`` is called (host code runs on concrete values, without its rules)."""

    def column(d):
        shifted = lambda step: [r + step * d if i == j else r for i, r in enumerate(r0)]  # noqa: E731
        return (_flat(f(_joined(x0, parts, shifted(eps)))) - _flat(f(_joined(x0, parts, shifted(-eps))))) / (2 * eps)

    n, shape = int(np.size(r0[j])), np.shape(r0[j])
    steps = jnp.eye(n, dtype=jnp.float64).reshape((n, *shape))
    return np.stack([np.asarray(column(d)) for d in steps])


def _analytical_jacobian(f, x0, parts, r0, own, output, chunk, named) -> tuple[list[np.ndarray], Any]:
    """Backward's Jacobian of ``f`` (of output ``output`` alone, the others given no cotangent;
    every output where None) with respect to the real parts ``own`` only (the others held
    constant, so JAX does not differentiate them): forward once, at ``x0`` and unbatched (no
    vmap rule runs), then one VJP per output element as one batch (one at a time where batching
    backward fails); one (elements, outputs) block per part of ``own``; and forward's flat value.
    An exception forward or backward raises is a failure naming the case (``named``: what the
    message opens with, and the case: the inputs differentiated, the outputs given a cotangent)."""
    who, case = named

    def outputs(values: list[Any]) -> Any:
        outs = f(_joined(x0, parts, [values[own.index(j)] if j in own else r for j, r in enumerate(r0)]))
        return _flat(outs if output is None else [outs[output]]), _flat(outs)

    with _raising(who, "forward (run by jax.vjp)", case, _CALL_RAN, _FORWARD_FIX):
        flat, pullback, value = jax.vjp(outputs, [r0[j] for j in own], has_aux=True)
    size = int(flat.shape[0])

    def batch(rows: np.ndarray) -> tuple:  # the unit cotangents of output elements `rows`
        units = np.zeros((len(rows), size))
        units[np.arange(len(rows)), rows] = 1.0
        return (units,)

    try:
        gradients = _in_chunks(jax.vmap(lambda cotangent: pullback(cotangent)[0]), batch, size, chunk)
    except Exception:  # noqa: BLE001  (batching failed: one at a time, which raises a real error itself)
        unit = lambda row: (jnp.arange(size) == row).astype(jnp.float64)  # noqa: E731
        with _raising(who, "backward", case, _GRADIENT_EXPECTED, _backward_fix(output)):
            gradients = jax.lax.map(lambda row: pullback(unit(row))[0], jnp.arange(size))
    return [np.asarray(g).reshape(size, -1).T for g in gradients], value


def _in_chunks(run: Callable[..., Any], batch: Callable[[np.ndarray], Any], total: int, chunk: int) -> Any:
    """``run(*batch(rows))`` over ``rows`` 0 to ``total - 1``, ``chunk`` at a time so memory stays
    bounded (``batch`` makes a chunk's arguments on the host); every chunk is padded to that length
    (repeating rows), so each operation keeps one shape and compiles once; concatenated (a pytree
    of NumPy arrays)."""
    pieces = []
    for start in range(0, total, chunk):
        count = min(chunk, total - start)
        arguments = batch(np.resize(np.arange(start, start + count), chunk))
        out = run(*jax.tree_util.tree_map(jnp.asarray, arguments, is_leaf=lambda v: isinstance(v, np.ndarray)))
        pieces.append(jax.tree_util.tree_map(lambda v, count=count: np.asarray(v)[:count], out))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *pieces)


def _excess(analytical: np.ndarray, numerical: np.ndarray, atol, rtol) -> np.ndarray:
    """How far each entry is beyond the tolerance (positive: a disagreement; NaN or inf: infinite)."""
    finite = np.isfinite(analytical) & np.isfinite(numerical)
    return np.where(finite, np.abs(analytical - numerical) - (atol + rtol * np.abs(numerical)), np.inf)


def _compare(label: str, part, shape: tuple, analytical: np.ndarray, numerical: np.ndarray, atol, rtol, who) -> None:
    """Raise naming the worst disagreement between two (input element, output) Jacobian blocks."""
    excess = _excess(analytical, numerical, atol, rtol)
    if not np.any(excess > 0):
        return
    element, output = np.unravel_index(int(np.argmax(excess)), excess.shape)
    index = tuple(int(i) for i in np.unravel_index(element, shape)) if shape else ()
    a, n = analytical[element, output], numerical[element, output]
    where = "" if part is None else f" of its {part} part"
    raise error(
        GradcheckError,
        who,
        f"the gradient for {label} disagrees with finite differences; worst at index {index}{where} (output "
        f"element {int(output)}): analytical {a:.6g}, numerical {n:.6g} (|difference| {abs(a - n):.3g} > atol "
        f"{atol:g} + rtol {rtol:g} * |numerical|); {int(np.sum(np.any(excess > 0, axis=1)))} of "
        f"{excess.shape[0]} elements disagree",
    )


def _check(scalar, reference, x0, labels, eps, atol, rtol, rng, what, who) -> None:
    """Each leaf along one random direction: the gradient of ``scalar`` against finite differences
    of ``reference`` (the same function run without custom rules); a failing leaf located
    element by element."""
    analytical = jax.grad(scalar)(x0)
    for k, (label, leaf) in enumerate(zip(labels, x0)):
        direction = _random_like(rng, leaf)
        numerical = float(_central(reference, x0, k, direction, eps))
        expected = float(jnp.sum(analytical[k] * direction).real)  # JAX's convention: Re(sum(g * d))
        if not (np.isfinite(expected) and np.isfinite(numerical)) or abs(expected - numerical) > atol + rtol * abs(
            numerical
        ):
            _locate(reference, x0, k, analytical[k], label, eps, atol, rtol, what, who)


def _check_second(call, x0, patterns, labels, out_shapes, eps, atol, rtol, rng, who) -> None:
    """``order=2``: the derivative of backward (reverse over reverse), along random directions,
    against finite differences of backward, for each set of inputs ``patterns`` (backward's: the
    others held constant, so their ``ctx.needs_input_grad`` is False in both differentiations)
    and, with several outputs, for each output alone given a cotangent (the others none)."""
    everything = list(range(len(x0)))
    alone = [(everything, _output_alone(j), j) for j in range(len(out_shapes))] if len(out_shapes) > 1 else []
    for which, suffix, output in [*patterns, *alone]:
        sub = [x0[k] for k in which]
        cotangent = _random_like(rng, out_shapes if output is None else out_shapes[output])
        scalar = lambda diff, c=cotangent, w=which, o=output: _vdot(c, _of_output(_restricted(call, x0, w, diff), o))  # noqa: E731
        u = _random_like(rng, sub)
        second = lambda diff, s=scalar, u=u: _vdot(u, jax.grad(s)(diff))  # noqa: E731
        case = _case(which, labels, output, len(out_shapes))
        fix = _backward_fix(output) + " (order=2 differentiates it with JAX)"
        with _raising(
            who, "backward or its derivative (order=2)", case, "finite differences of backward give a derivative", fix
        ):
            sub_labels = [labels[k] + suffix for k in which]
            _check(second, second, sub, sub_labels, eps, atol, rtol, rng, " of the backward (order=2)", who)


def _check_forward(call, plain, x0, patterns, labels, out_shapes, eps, atol, rtol, rng, who, forward_ad) -> bool:
    """Forward mode, element by element: for each set of inputs ``patterns`` (backward's: each leaf
    alone first, every input at once last), ``jax.jvp`` of the function of those inputs alone (the
    others closed over as constants, so they are not perturbed: their tangent is None under
    ``ctx.set_materialize_grads(False)``, their ``ctx.needs_input_grad`` False) along random
    directions, through the function's forward-mode rule, against the central difference of forward
    (no custom rule) along the same directions, every output element within ``atol + rtol *
    |numerical|``. A failing leaf alone is located by input element where a random combination of
    the outputs shows it, else by output element. False where JAX refuses forward mode (a jaxfn
    function inside has no forward-mode rule) and ``forward_ad`` is None; an exception the rule
    raises is a failure."""
    everything = list(range(len(x0)))
    ordered = sorted((which for which, _, _ in patterns), key=lambda w: (len(w) != 1, w == everything, len(w)))
    cotangent = _random_like(rng, out_shapes)  # to locate a failing leaf by input element
    for which in ordered:
        sub = [x0[k] for k in which]
        directions = [_random_like(rng, x) for x in sub]
        along = _perturbed(which, labels, len(x0))
        try:
            tangents = jax.jvp(lambda diff, w=which: call(replaced(x0, w, diff)), (sub,), (directions,))[1]
        except GradcheckError:
            raise
        except Exception as err:  # noqa: BLE001 - a refusal (no rule) is said as such; any other is a failure
            if forward_ad is None and (refused_forward_mode(err) or FORWARD_MODE_HELP in str(err)):
                return False
            raise error(
                GradcheckError,
                who,
                f"forward mode (jax.jvp) {along} raised {_said(err)}, where finite differences of forward give a "
                "derivative; check the function's jvp rule",
            ) from err
        shifted = lambda step, w=which, x=sub, d=directions: replaced(  # noqa: E731
            x0, w, [v + step * t for v, t in zip(x, d)]
        )
        what = "forward (run without the function's rules, for the finite differences)"
        with _raising(who, what, f"along forward mode's random directions {along}", _CALL_RAN, _FORWARD_FIX):
            above, below = plain(shifted(eps)), plain(shifted(-eps))
        numerical = [np.asarray((a - b) / (2 * eps)) for a, b in zip(above, below)]
        analytical = [np.asarray(t) for t in tangents]
        excess = [_excess(a, n, atol, rtol) for a, n in zip(analytical, numerical)]
        if not any(np.any(e > 0) for e in excess):
            continue
        if len(which) == 1:  # a leaf alone: the input element, where a combination of the outputs shows it
            (k,) = which
            scalar, reference = (lambda diff, f=f: _vdot(cotangent, f(diff)) for f in (call, plain))
            gradient = _along_basis(lambda d, k=k, f=scalar: _directional(f, x0, k, d), x0[k])
            _locate(reference, x0, k, gradient, labels[k], eps, atol, rtol, " in forward mode (jvp)", who, quiet=True)
        output = int(np.argmax([np.max(e, initial=-np.inf) for e in excess]))
        e = excess[output]
        worst = np.unravel_index(int(np.argmax(e)), np.shape(e)) if np.ndim(e) else ()
        a, n = analytical[output][worst], numerical[output][worst]
        count, total = sum(int(np.sum(e > 0)) for e in excess), sum(int(np.size(e)) for e in excess)
        hint = (
            "; a jvp rule must be linear in the tangents (no product of two tangents)"
            if len(which) > 1 and len(which) == len(x0)
            else ""
        )
        raise error(
            GradcheckError,
            who,
            f"forward mode (jvp) {along} disagrees with finite differences of forward along the same "
            f"direction, element by element; worst at output {output}, index {tuple(int(i) for i in worst)}: jvp "
            f"{_shown(a)}, numerical {_shown(n)} (|difference| {abs(a - n):.3g} > atol {atol:g} + rtol {rtol:g} * "
            f"|numerical|); {count} of {total} output elements disagree{hint}; check the function's jvp rule",
        )
    return True


def _perturbed(which: list[int], labels: list[str], count: int) -> str:
    """How a forward-mode check's message says which inputs had a tangent."""
    if len(which) == count > 1:
        return f"with every input's tangent set at once ({_listed(labels)}, random directions)"
    named = _listed([labels[k] for k in which])
    others = " (the other inputs not perturbed: no tangent, needs_input_grad False)" if count > 1 else ""
    return f"for {named}{' alone' if others else ''}{others}" if len(which) == 1 else f"for {named}{others}"


def _shown(value: Any) -> str:
    """A number in a message: 6 significant digits (an integer or a boolean as it is)."""
    value = np.asarray(value).item()
    return f"{value:.6g}" if isinstance(value, (float, complex)) else repr(value)


def _directional(scalar, x0, k, direction):
    """The derivative of ``scalar`` at ``x0`` along ``direction`` in leaf ``k`` alone, by
    ``jax.jvp`` of ``scalar`` as a function of that leaf (the others are constants: not perturbed)."""
    return jax.jvp(lambda leaf: scalar(replaced(x0, [k], [leaf])), (x0[k],), (direction,))[1]


def _along_basis(along, leaf) -> Any:
    """``along`` of every unit vector of ``leaf`` (one at a time, as ``_one_by_one``), in JAX's
    gradient convention for complex leaves (Re(g * 1) and Re(g * i) give the real and minus the
    imaginary part)."""
    size, shape = int(np.size(leaf)), np.shape(leaf)
    basis = jnp.eye(size, dtype=leaf.dtype).reshape((size, *shape))
    values = jax.lax.map(along, basis).reshape(shape)
    if jnp.iscomplexobj(leaf):
        values = values - 1j * jax.lax.map(along, 1j * basis).reshape(shape)
    return values


def _check_batched(call, x0, given, names, out_shapes, atol, rtol, rng, who) -> tuple[str | None, str]:
    """The function under ``jax.vmap`` (its vmap rule) against a Python loop of forward (no custom
    rule), the value of every array output (integer and non-differentiable ones too), and the
    gradient under ``jax.vmap`` against backward one example at a time, for each way a vmap rule is
    called: every array argument batched on axis 0 (also in a batch of one); each argument alone
    (all its leaves batched, the others unbatched: in_dims None); every other non-empty set of the
    arguments batched, the others unbatched (up to ``_EVERY_SET`` arguments; above, each all but
    one, and the others are listed); each leaf of a pytree argument alone; every one batched on
    its last axis; and mixed axes: each argument on its last axis, the others on axis 0. The
    examples are O(1) apart (x0, then x0 plus offsets
    of the scale of max(1, |x0|)); an integer or boolean array's examples are its own values
    rearranged (rolled, then permuted), so a rule that mixes examples or uses one example's indices
    for all fails. ``given``: the checked leaves as the call gave them: a Python number is passed as
    it is, unbatched, as ``jax.vmap`` passes it in a call. ``names``: the labels and argument names of
    the checked leaves, then of the other arrays. An exception raised under ``jax.vmap`` is a failure,
    and so is one that forward or backward raises one example at a time. Returns what the report
    says ran (None: no array to batch) and what it lists as not run ("": nothing)."""
    labels, heads = names
    m = len(x0)
    static = [not _is_array(leaf) for leaf in given]
    arrays = [k for k in range(m) if not static[k]]
    a = len(arrays)
    values = [*(x0[k] for k in arrays), *(call.leaves[i] for i in call.others)]
    if not values:
        return None, ""
    value_labels = [labels[k] for k in arrays] + list(labels[m:])
    value_heads = [heads[k] for k in arrays] + list(heads[m:])
    # at least three examples, as many as no argument's dimension, so a rule that broadcasts an
    # unbatched argument against the batch axis can't give the right shape by chance
    count = next(b for b in itertools.count(3) if all(b not in np.shape(v) for v in values))
    points = [values] + [
        [*(_apart(rng, x) for x in values[:a]), *(_rearranged(rng, v, j) for v in values[a:])] for j in range(1, count)
    ]
    cotangent = _random_like(rng, out_shapes)

    def checked(leaves: list[Any], held: list[Any] = given) -> list[Any]:  # the batched arrays, and `held`
        batched = iter(leaves[:a])
        return [held[k] if static[k] else next(batched) for k in range(m)]

    def outputs(leaves: list[Any]) -> Any:
        return call.every(leaves[a:], checked(leaves))

    def forward(leaves: list[Any]) -> Any:
        with plain_forward():
            return outputs(leaves)

    def gradient(leaves: list[Any]) -> Any:
        # a Python number is held constant here, as the array the other checks differentiate (not
        # differentiated: a backward that gives it a gradient, as gradcheck's first check asks, is not refused)
        loss = lambda diff: _vdot(cotangent, call.with_others(leaves[a:], checked([*diff, *leaves[a:]], x0)))  # noqa: E731
        return jax.grad(loss)(list(leaves[:a]))

    n = len(values)
    axis0 = "every argument batched on axis 0"
    patterns: list[tuple[list[int | None], int, str]] = [
        ([0] * n, count, axis0),
        ([0] * n, 1, f"{axis0}, a batch of 1"),
    ]
    described = [f"{axis0} (in a batch of 1 too)"]
    groups = list(dict.fromkeys(value_heads))
    if len(groups) > 1:
        patterns += [
            (
                [0 if h == head else None for h in value_heads],
                count,
                f"only '{head}' batched (in_dims None for the others)",
            )
            for head in groups
        ]
        described.append("each argument alone (the others unbatched)")
    several = [head for head in groups if value_heads.count(head) > 1]
    if several:
        patterns += [
            (
                [0 if j == i else None for j in range(n)],
                count,
                f"only '{value_labels[i]}' batched (in_dims None for the others)",
            )
            for i in range(n)
            if value_heads[i] in several
        ]
        described.append("each leaf of a pytree argument alone")
    left_out = ""
    if len(groups) > 2:  # the other sets of arguments batched together (the others unbatched)
        sets, left_out = _batched_sets(len(groups))
        patterns += [
            (
                [0 if h in chosen else None for h in value_heads],
                count,
                f"only {_listed([repr(h) for h in chosen])} batched (in_dims None for the others)",
            )
            for chosen in ([groups[g] for g in which] for which in sets)
        ]
        described.append(
            f"every set of {'2' if len(groups) == 3 else f'2 to {len(groups) - 1}'} of the {len(groups)} arguments "
            "(the others unbatched)"
            if not left_out
            else f"each all but one of the {len(groups)} arguments (the others unbatched)"
        )
    last = [int(np.ndim(v)) for v in values]
    if any(last):
        patterns.append((list(last), count, "every argument batched on its last axis"))
        described.append("on the last axis")
    mixed = [head for head in groups if any(last[i] for i in range(n) if value_heads[i] == head)]
    if len(groups) > 1 and mixed:  # batch axes that differ between arguments
        for head in mixed:
            axes: list[int | None] = [last[i] if value_heads[i] == head else 0 for i in range(n)]
            patterns.append((axes, count, f"'{head}' batched on its last axis, the others on axis 0"))
        described.append("mixed axes (each argument on its last axis, the others on axis 0)")
    expected: dict[tuple, Any] = {}
    ran: set[tuple] = set()
    for axes, size, where in patterns:
        if (tuple(axes), size) in ran:  # the same in_dims as a batching checked already
            continue
        ran.add((tuple(axes), size))
        mask = tuple(axis is not None for axis in axes)
        stacked = [
            v if axis is None else jnp.stack([p[i] for p in points[:size]], axis=axis)
            for i, (v, axis) in enumerate(zip(values, axes))
        ]
        checks = [("the output", outputs, forward), *([("the gradient", gradient, gradient)] if a else [])]
        for what, g, reference in checks:
            try:
                batched = jax.vmap(g, in_axes=(axes,))(stacked)
            except GradcheckError:
                raise
            except Exception as err:  # noqa: BLE001 - the vmap rule (or backward under vmap) raised: a failure
                first = (str(err).splitlines() or [""])[0]
                raise error(
                    GradcheckError,
                    who,
                    f"{what} under jax.vmap raised {type(err).__name__} ({first}) with {where}, where a loop of "
                    "forward computes it; check the function's vmap rule (or pass check_batched_grad=False to "
                    "check the rest)",
                ) from err
            if (what, mask, size) not in expected:
                ran_by = "forward (run without the function's rules)" if what == "the output" else "backward"
                case = f"one example at a time, for the check of jax.vmap with {where}"
                with _raising(who, ran_by, case, "jax.vmap computed it", f"check the function's {ran_by.split()[0]}"):
                    expected[what, mask, size] = [
                        reference([p[i] if batched_i else values[i] for i, batched_i in enumerate(mask)])
                        for p in points[:size]
                    ]
            one_by_one = expected[what, mask, size]
            if what == "the gradient":
                items = [(f"'{value_labels[k]}'", k) for k in range(a)]
            else:
                items = [(f"output {k}", k) for k, leaf in enumerate(one_by_one[0]) if leaf is not None]
            for name, k in items:
                _compare_batched(what, name, where, batched[k], [o[k] for o in one_by_one], atol, rtol, who)
    unbatched = [repr(labels[k]) for k in range(m) if static[k]]
    return _listed(described) + (
        f"; {_listed(unbatched)} never batched (a Python number: passed as given, as a call passes it, and held "
        "constant in the gradient)"
        if unbatched
        else ""
    ), left_out


def _batched_sets(n: int) -> tuple[list[list[int]], str]:
    """The sets of 2 to ``n - 1`` of ``n`` arguments the batching check batches together (all and
    each alone are checked apart), of ``_argument_sets``; and what the report lists as not run
    ("": nothing)."""
    chosen, skipped = _argument_sets(n)
    sets = [which for which in chosen if 1 < len(which) < n]
    if not skipped:
        return sets, ""
    return sets, (
        f"the other {skipped} of the {(1 << n) - 1} sets of the {n} arguments batched (the others unbatched, "
        f"in_dims None): all, each alone and each all but one were checked (every set is checked up to "
        f"{_EVERY_SET} arguments)"
    )


def _apart(rng: np.random.Generator, x: Any) -> Any:
    """Another example for a batch: ``x`` plus random offsets of the scale of max(1, |x|), so the
    examples are O(1) apart (a rule that mixes them can't pass within the tolerance)."""
    scale = max(1.0, float(np.sqrt(np.mean(np.abs(np.asarray(x)) ** 2)))) if np.size(x) else 1.0
    return x + scale * _random_like(rng, x)


def _rearranged(rng: np.random.Generator, v: Any, j: int) -> Any:
    """Another example for a batch of an integer or boolean array: its own values (so valid
    indices stay valid), rolled by one for the second example, permuted for the others; any
    other array as given."""
    dtype = getattr(v, "dtype", None)
    if dtype is None or not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)):
        return v
    flat = np.ravel(np.asarray(v))
    moved = np.roll(flat, 1) if j == 1 else rng.permutation(flat)
    return jnp.asarray(moved.reshape(np.shape(v)), dtype)


def _compare_batched(what: str, name: str, where: str, batched: Any, one_by_one: list[Any], atol, rtol, who) -> None:
    if batched is None or any(o is None for o in one_by_one):
        raise error(
            GradcheckError,
            who,
            f"{what} for {name} under jax.vmap is {'not ' if batched is None else ''}an array with {where}, but "
            f"computed one example at a time it is {'' if batched is None else 'not '}one; check the function's "
            "vmap rule",
        )
    batched, expected = np.asarray(batched), np.stack([np.asarray(o) for o in one_by_one])
    if batched.shape != expected.shape:
        raise error(
            GradcheckError,
            who,
            f"{what} for {name} under jax.vmap has shape {batched.shape} with {where}, but computed one example at a "
            f"time it has {expected.shape}; check the function's vmap rule",
        )
    if dtype_kind(expected.dtype) == DIFF or dtype_kind(batched.dtype) == DIFF:
        finite = np.isfinite(batched) & np.isfinite(expected)
        excess = np.where(finite, np.abs(batched - expected) - (atol + rtol * np.abs(expected)), np.inf)
        excess = np.where(np.isnan(batched) & np.isnan(expected), -1, excess)
        tolerance = f" > atol {atol:g} + rtol {rtol:g} * |value|"
    else:  # an integer or boolean output: equal or not
        excess = np.where(batched != expected, 1.0, -1.0)
        tolerance = ", where they must be equal"
    if not np.any(excess > 0):
        return
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
    b, e = batched[worst], expected[worst]
    difference = abs(np.asarray(b).astype(np.complex128) - np.asarray(e).astype(np.complex128))
    raise error(
        GradcheckError,
        who,
        f"{what} for {name} under jax.vmap disagrees with the same computed one example at a time, with {where}; "
        f"worst at batch element {worst[0]}, index {worst[1:]}: batched {_shown(b)}, one at a time {_shown(e)} "
        f"(|difference| {difference:.3g}{tolerance}); {int(np.sum(excess > 0))} of {excess.size} elements disagree; "
        "check the function's vmap rule, or its backward under vmap",
    )


def _locate(scalar, x0, k, analytical, label, eps, atol, rtol, what, who, quiet=False) -> None:
    """Finite differences for every element of leaf ``k``; raise naming the worst one (``quiet``:
    return where no element disagrees)."""
    size = int(np.size(x0[k]))
    numerical = _along_basis(lambda d: _central(scalar, x0, k, d, eps), x0[k])
    analytical, numerical = np.asarray(analytical), np.asarray(numerical)
    excess = _excess(analytical, numerical, atol, rtol)
    if quiet and not np.any(excess > 0):
        return
    worst = np.unravel_index(int(np.argmax(excess)), np.shape(excess)) if np.ndim(excess) else ()
    index = tuple(int(i) for i in worst)
    raise error(
        GradcheckError,
        who,
        f"the gradient{what} for {label} disagrees with finite differences; worst at index {index}: "
        f"analytical {analytical[worst]:.6g}, numerical {numerical[worst]:.6g} (|difference| "
        f"{abs(analytical[worst] - numerical[worst]):.3g} > atol {atol:g} + rtol {rtol:g} * |numerical|); "
        f"{int(np.sum(excess > 0))} of {size} elements disagree",
    )


def _central(scalar, x0, k, direction, eps):
    """The central difference of ``scalar`` at ``x0`` along ``direction`` in leaf ``k``."""

    def shifted(step):
        return [leaf + step * direction if i == k else leaf for i, leaf in enumerate(x0)]

    return (scalar(shifted(eps)) - scalar(shifted(-eps))) / (2 * eps)


def _as_checked(leaf: Any) -> Any:
    """A leaf as gradcheck passes it: floating values (arrays of any precision, Python and NumPy
    scalars) in float64 or complex128; everything else as given."""
    if isinstance(leaf, (float, complex)) or (isinstance(leaf, np.generic) and np.iscomplexobj(leaf)):
        leaf = np.asarray(leaf)
    elif isinstance(leaf, np.generic) and leaf_kind(np.asarray(leaf)) == DIFF:
        leaf = np.asarray(leaf)
    if leaf_kind(leaf) == DIFF:
        return jnp.asarray(leaf, jnp.complex128 if jnp.iscomplexobj(leaf) else jnp.float64)
    return leaf


def _outputs_to_check(fn, args, kwargs, leaves, treedef) -> tuple[Callable[[Any], list[Any]], Any]:
    """From an output, the arrays to check: floating or complex, and (for a jaxfn function) not
    marked non-differentiable. Python values and integer arrays are left out."""
    target = _jaxfn_function(fn)
    flags = None if target is None else _output_flags(target, *tree_unflatten(treedef, leaves))

    def select(out: Any) -> list[Any]:
        out_leaves = jax.tree_util.tree_leaves(out)
        keep = flags if flags is not None and len(flags) == len(out_leaves) else [True] * len(out_leaves)
        return [leaf for leaf, k in zip(out_leaves, keep) if k and _is_inexact_array(leaf) and np.size(leaf)]

    return select, None if flags is None else tuple(flags)


def _output_flags(target: AutogradFunction, args: tuple, kwargs: dict) -> list[bool]:
    """One per output leaf: whether it carries a gradient (False for a Python value), from forward's
    output description, never by rebuilding its pytree around flags (a user's node may refuse them)."""
    info = target.outputs(*args, **kwargs)
    flags = iter(info.differentiable)
    return [next(flags) if array else False for array in info.is_array]


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def _is_inexact_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray)) and dtype_kind(value.dtype) == DIFF


def _random_like(rng: np.random.Generator, tree: Any, differentiable: Any = None) -> Any:
    """Random values shaped like each floating or complex leaf of ``tree``; None elsewhere."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    flags = [True] * len(leaves)
    if differentiable is not None:
        flags = [flag is True for flag in jax.tree_util.tree_leaves(differentiable, is_leaf=lambda v: v is None)]
        flags = flags if len(flags) == len(leaves) else [True] * len(leaves)
    drawn = []
    for leaf, flag in zip(leaves, flags):
        dtype = getattr(leaf, "dtype", None)
        if not flag or dtype is None or dtype_kind(dtype) != DIFF:
            drawn.append(None)
        elif jnp.issubdtype(dtype, jnp.complexfloating):
            drawn.append(jnp.asarray(rng.standard_normal(leaf.shape) + 1j * rng.standard_normal(leaf.shape), dtype))
        else:
            drawn.append(jnp.asarray(rng.standard_normal(leaf.shape), dtype))
    return jax.tree_util.tree_unflatten(treedef, drawn)


def _vdot(weights: Any, values: Any) -> Any:
    """The sum over matching leaves of Re<weight, value>, skipping outputs without a weight."""
    pairs = zip(jax.tree_util.tree_leaves(weights, is_leaf=lambda x: x is None), jax.tree_util.tree_leaves(values))
    return sum((jnp.vdot(w, v.astype(w.dtype)).real for w, v in pairs if w is not None), jnp.zeros((), jnp.float64))


def _labels(fn: Callable[..., Any], args: tuple, paths: list[tuple]) -> tuple[list[str], list[str]]:
    """A name for each leaf, the parameter's name (from fn's signature) and its key path; and the
    name of the argument it is in (one ``ctx.needs_input_grad`` flag)."""
    names = _positional_names(fn, len(args))
    labels, heads = [], []
    for path in paths:
        (top, key, *rest) = path
        if top.idx == 1:  # a keyword argument
            head = str(key.key)
        else:
            head = names[key.idx] if key.idx < len(names) else f"args[{key.idx}]"
        labels.append(head + keystr(tuple(rest)))
        heads.append(head)
    return labels, heads


def _name(fn: Callable[..., Any]) -> str:
    """What gradcheck's messages call ``fn``: a jaxfn function's ``name``, else its ``__name__``."""
    target = _jaxfn_function(fn)
    if target is not None:
        return target.name
    function = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(function, "__name__", None) or type(fn).__name__


def _jaxfn_function(fn: Callable[..., Any]) -> AutogradFunction | None:
    """The jaxfn function behind ``fn`` (itself, or a ``jaxfn.Function``'s ``.apply``), if any."""
    if isinstance(fn, AutogradFunction):
        return fn
    owner = getattr(fn, "__self__", None)
    return (
        owner._jaxfn
        if isinstance(owner, type) and isinstance(getattr(owner, "_jaxfn", None), AutogradFunction)
        else None
    )


def _positional_names(fn: Callable[..., Any], count: int) -> list[str]:
    jaxfn_function = _jaxfn_function(fn)
    try:
        if jaxfn_function is None:
            parameters = list(inspect.signature(fn).parameters.values())
        else:
            parameters = list(jaxfn_function._definition.signature.parameters.values())[1:]  # after ctx
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
