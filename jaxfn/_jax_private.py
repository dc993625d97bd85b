"""Every use of JAX's private or undocumented API, in one place.

jaxfn stays on JAX's public API everywhere else. What is here has no public spelling; each
entry says what it is for and falls back to a safe answer where JAX moved it. The test suite
runs on the oldest and the newest JAX the package allows, so a move shows up there.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax._src import core as _jax_core  # JAX's private core (jax 0.10-0.12), for the three functions named below
from jax.ad_checkpoint import checkpoint_name
from jax.core import Tracer
from jax.core import eval_jaxpr as _eval_jaxpr
from jax.extend.core import ClosedJaxpr, Jaxpr

# The cheapest test of "no JAX transformation is active" (a JAX that moved it: every call counts as traced).
_trace_state_clean: Callable[[], bool] = getattr(_jax_core, "trace_state_clean", lambda: False)

try:  # the class of concrete JAX arrays, named without starting a backend
    from jax._src.array import ArrayImpl as CONCRETE_ARRAY
except ImportError:  # pragma: no cover - a JAX that moved it: no call takes the short path
    CONCRETE_ARRAY = type("NoConcreteArray", (), {})


def concrete_arrays_outside_traces(args: tuple[Any, ...]) -> bool:
    """Whether every value is a concrete JAX array and no JAX transformation is active: the
    cheapest test, for the short path of ``jit=True`` calls."""
    for a in args:
        if type(a) is not CONCRETE_ARRAY:
            return False
    return _trace_state_clean()


def outside_traces(arrays: tuple[Any, ...] | list[Any]) -> bool:
    """Whether no JAX transformation is active and no array is a tracer (an eager call)."""
    return _trace_state_clean() and not any(isinstance(a, Tracer) for a in arrays)


# The newest JAX whose upgrade flags jaxfn knows: there, a flag it lacks is one not yet added
# (jax 0.10.0 has no jax_remat3); beyond it, one retired, when the new implementation is the only one.
NEWEST_KNOWN_JAX = (0, 12)


def jax_version() -> tuple[int, ...]:
    return jax.__version_info__[:2]


def upgrade_flag(name: str) -> bool:
    """Whether one of JAX's upgrade flags is on (see ``NEWEST_KNOWN_JAX`` for a flag JAX lacks)."""
    value = getattr(jax.config, name, None)
    return jax_version() > NEWEST_KNOWN_JAX if value is None else bool(value)


def remat3() -> bool:
    """Whether JAX's new checkpoint implementation is on (``jax_remat3``: off by default in jax
    0.10-0.12; on where JAX has retired the flag)."""
    return upgrade_flag("jax_remat3")


def custom_vjp3() -> bool:
    """Whether JAX's new custom-derivative implementation is on (``jax_custom_vjp3``: off by
    default in jax 0.10-0.12; on where JAX has retired the flag)."""
    return upgrade_flag("jax_custom_vjp3")


# What jax.custom_vjp's TypeError says when forward mode reaches it (jax 0.10-0.12), and the methods
# of JAX's hijax custom_vjp (jax_custom_vjp3) that refuse it; what JAX says of a value closed over
# from another trace (its UnexpectedTracerError, or a custom rule's "closed-over value" refusal).
_JVP_REFUSAL = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"
_HIJAX_JVP = ("jvp", "lin", "linearized")


def refused_forward_mode(err: Exception) -> bool:
    """Whether ``err`` is JAX refusing forward mode on a ``jax.custom_vjp``: its TypeError, or with
    ``jax_custom_vjp3`` on a bare NotImplementedError from the ``jvp``/``lin`` methods of JAX's
    hijax custom_vjp (jax/_src/hijax.py)."""
    in_hijax = _jax_functions(err, "hijax.py")
    return _JVP_REFUSAL in str(err) or (isinstance(err, NotImplementedError) and any(f in _HIJAX_JVP for f in in_hijax))


def refused_closure(err: Exception) -> bool:
    """Whether ``err`` is JAX refusing a value that a custom rule reads from another trace."""
    return isinstance(err, jax.errors.UnexpectedTracerError) or "closed-over value" in str(err)


def refused_transpose_of_custom_vjp(err: Exception) -> bool:
    """Whether ``err`` is JAX failing to transpose a ``jax.custom_vjp`` call (its equation's name
    in the message, jax 0.10-0.12; ``CustomVJPTraced`` with ``jax_custom_vjp3``)."""
    return any(name in str(err) for name in ("custom_vjp_call", "CustomVJPTraced"))


def refused_transpose_of_product(err: Exception) -> bool:
    """Whether ``err`` is JAX's transpose rules asserting that one operand of a product (or a
    select's predicate) is not linear: a bare AssertionError (jax 0.10-0.12)."""
    return isinstance(err, AssertionError)


def x64() -> bool:
    """Whether 64-bit types are on (a result's dtype depends on it)."""
    return bool(jax.config.read("jax_enable_x64"))


def is_differentiating_tracer(value: Any) -> bool:
    """Whether ``value`` is a tracer of a forward- or reverse-mode differentiation (JAX's tracers of
    forward and reverse mode, jax._src.interpreters.ad; no public names)."""
    return type(value).__name__ in ("JVPTracer", "LinearizeTracer")


def refused_in_eager_shard_map(err: Exception) -> bool:
    """Whether ``err`` is JAX's refusal of a custom_vjp with symbolic zeros inside an un-jitted
    ``jax.shard_map`` (it has no public type: its message names the case). Under ``jax.jit``
    the same function works, so jaxfn calls it through ``jax.jit`` there."""
    return isinstance(err, NotImplementedError) and "symbolic_zeros support with shard_map" in str(err)


# Settings that jax.jit's cache keys on (JAX's own config states; no public way to define one), off
# by default. Each is on or off here (a context, or the whole program); calling it with a value gives
# a context in which it has that value, and jax.jit traces again where it differs (so a jax.jit
# traced inside plain forward never hands its plain program to a later call).
from jax._src.config import bool_state as _bool_state  # noqa: E402


def _jit_keyed_setting(name: str, help: str) -> Any:
    return _bool_state(name, False, help=help, include_in_jit_key=True, include_in_trace_context=True)


anomaly_context = _jit_keyed_setting(  # with anomaly_context(True): ...
    "jaxfn_detect_anomaly",
    "jaxfn: check every jaxfn function's outputs and gradients for NaN/Inf (jaxfn.detect_anomaly)",
)


def anomaly_on() -> bool:
    """Whether jaxfn's anomaly-detection state is on here (a context, or the whole program)."""
    return bool(anomaly_context.value)


def set_anomaly(value: bool) -> None:
    """Set the state for the whole program."""
    anomaly_context._set(value)


plain_forward_context = _jit_keyed_setting(  # with plain_forward_context(True): ...
    "jaxfn_plain_forward",
    "jaxfn: jaxfn functions run their forward's operations with no custom rule (jaxfn's checks inside)",
)


def plain_forward_on() -> bool:
    """Whether jaxfn functions run as plain forward code here (``_rule.plain_forward``)."""
    return bool(plain_forward_context.value)


# JAX's own report of what a differentiation keeps (jax.ad_checkpoint.print_saved_residuals prints it):
# saved_residuals(f, *args, **kwargs) is the (aval, description) of every residual kept to differentiate f.
from jax._src.ad_checkpoint import saved_residuals as _saved_residuals  # noqa: E402

saved_residuals: Callable[..., list[tuple[Any, str]]] = _saved_residuals


# How saved_residuals describes a residual (jax 0.10-0.12): "named 'linear.input' from ...",
# "from the argument x", "output of custom_vjp_call from <file>:<line>".
def residual_name(description: str) -> str | None:
    """The checkpoint name in a residual's description, or None."""
    return description[len("named '") :].split("'", 1)[0] if description.startswith("named '") else None


def residual_is_argument(description: str) -> bool:
    """Whether the residual is one of the differentiated function's arguments."""
    return description.startswith("from the argument")


def residual_of_custom_vjp_in(description: str, package: str) -> bool:
    """Whether the residual is the output of a custom_vjp call made in ``package``'s code."""
    return description.startswith("output of custom_vjp_call from") and package in description


# JAX's hijax primitives (jax.experimental.hijax, experimental): a primitive whose rules are
# Python methods. The class is VJPHiPrimitive in jax 0.10, HiPrim from jax 0.11; its
# symbolic zero is ``Zero``, and the avals it takes are ``ShapedArray``s.
from jax.experimental import hijax as _hijax  # noqa: E402

HI_PRIMITIVE: Any = getattr(_hijax, "HiPrim", None) or _hijax.VJPHiPrimitive
HI_ZERO: Any = _hijax.Zero
SHAPED_ARRAY: Any = _hijax.ShapedArray


def batch_axis(axis_data: Any) -> tuple[int, Any, Any]:
    """A hijax primitive's ``batch`` rule's ``axis_data`` read (jax 0.10-0.12): the batch's size,
    its axis name and its ``spmd_axis_name`` (None where JAX gives none)."""
    return axis_data.size, getattr(axis_data, "name", None), getattr(axis_data, "spmd_name", None)


def is_gradient_accumulator(value: Any) -> bool:
    """Whether ``value`` is where a hijax primitive's ``transpose`` puts a linear input's
    cotangent (``accum``, jax >= 0.10), rather than a value of a non-linear input."""
    return callable(getattr(value, "accum", None))


def reports_callback_error(err: BaseException, raised: BaseException) -> bool:
    """Whether ``err`` is JAX's report that a host callback of a compiled program raised
    ``raised``. JAX keeps no reference to the callback's exception (no ``__cause__``): its
    runtime error (``jax.errors.JaxRuntimeError``, "CpuCallback error calling callback: ...")
    carries only the exception's text, with its traceback."""
    return isinstance(err, jax.errors.JaxRuntimeError) and str(raised) in str(err)


def callback_exception(err: BaseException) -> tuple[str, str] | None:
    """The type name and message of the exception a host callback raised, read from the text of
    JAX's report of it (``jax.errors.JaxRuntimeError``: "CpuCallback error calling callback:
    Traceback (most recent call last): ... module.Name: message", jax 0.10-0.12); None for any
    other error, or a text not of that form."""
    text = str(err)
    if not isinstance(err, jax.errors.JaxRuntimeError) or "Traceback (most recent call last)" not in text:
        return None
    raised = [line for line in text.splitlines() if line and not line[0].isspace()][-1]
    kind, colon, message = raised.partition(": ")
    if not colon or not all(part.isidentifier() for part in kind.split(".")):  # a module's exception: module.Name
        return None
    return kind.rsplit(".", 1)[-1], message


def is_forward_mode_tracer(value: Any) -> bool:
    """Whether ``value`` is a tracer of forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``)
    at the call itself. With ``jax_use_direct_linearize`` on (the default from jax 0.7; the flag
    is read where it exists) reverse mode traces with ``LinearizeTracer`` instead, so a
    ``JVPTracer`` is forward mode."""
    return type(value).__name__ == "JVPTracer" and bool(getattr(jax.config, "jax_use_direct_linearize", True))


def refused_fwd_output(err: Exception) -> bool:
    """JAX's TypeError when a custom_vjp's fwd gives an output other than its primal's (the text
    of jax 0.10-0.12's ``_flatten_fwd``: "Custom VJP fwd rule ... must produce a pair" or "...
    must produce primal outputs with equal container")."""
    return isinstance(err, TypeError) and all(part in str(err) for part in ("Custom VJP fwd rule", "must produce"))


# Primitives that call back into Python (jax.pure_callback, io_callback, jax.debug.callback): their
# names in jaxprs (jax 0.10-0.12).
_CALLBACKS = ("pure_callback", "io_callback", "debug_callback", "callback")


def calls_back(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (or a jaxpr it holds) calls back into Python."""
    return _any_equation(jaxpr, lambda eqn: eqn.primitive.name in _CALLBACKS)


def uses_mesh_axes(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (or a jaxpr it holds) names mesh axes (a collective, ``psum``, ``pvary``,
    ``all_gather``, ``axis_index``...: a parameter ``axes`` or ``axis_name`` holding a string, as
    jax 0.10-0.12 keep them), so that it can run only inside ``jax.shard_map``."""

    def names_an_axis(value: Any) -> bool:
        return isinstance(value, str) or (isinstance(value, (tuple, list)) and any(map(names_an_axis, value)))

    return _any_equation(
        jaxpr, lambda eqn: names_an_axis(eqn.params.get("axes")) or names_an_axis(eqn.params.get("axis_name"))
    )


def _any_equation(jaxpr: Any, test: Callable[[Any], bool]) -> bool:
    """Whether an equation of ``jaxpr``, or of a jaxpr it holds at any depth, passes ``test``."""
    return any(test(eqn) or any(_any_equation(sub, test) for sub in sub_jaxprs(eqn.params)) for eqn in jaxpr.eqns)


def sub_jaxprs(params: dict[str, Any]) -> list[Any]:
    """The jaxprs an equation holds in its parameters (a jit's, a cond's branches, a scan's body;
    closed ones opened), as jax 0.10-0.12 keep them."""
    return [
        item.jaxpr if isinstance(item, ClosedJaxpr) else item
        for item in _items(params.values())
        if isinstance(item, (ClosedJaxpr, Jaxpr))
    ]


def _items(values: Iterable[Any]) -> list[Any]:
    """``values`` with each tuple or list among them replaced by its items (how JAX holds several
    jaxprs in one parameter, and shapes or arguments in one local)."""
    return [item for value in values for item in (value if isinstance(value, (tuple, list)) else (value,))]


def sub_jaxpr_operands(eqn: Any, sub: Any) -> int | None:
    """How many of ``eqn``'s first inputs ``sub`` does not receive, where it receives the rest in
    order (0 for a call of its inputs as they are, a jit's or a scan's; 1 for a cond's branches,
    which get every operand but the branch index, jax 0.10-0.12); None for other layouts (a while
    loop's bodies)."""
    count = len(eqn.invars)
    if len(sub.invars) == count:
        return 0
    if eqn.primitive.name == "cond" and len(sub.invars) == count - 1:
        return 1
    return None


def has_tangent(dtype: Any) -> bool:
    """Whether JAX differentiates values of an extended ``dtype``: its tangent dtype (jax._src.core's;
    public only through an array's aval) is not float0, as it is for values JAX never differentiates
    (integers, PRNG keys); Flax's fp8 fm32 scales are their own."""
    return _jax_core.primal_dtype_to_tangent_dtype(dtype) != jax.dtypes.float0


def traced(function: Any, arrays: Any) -> tuple[Any, list[Any], Any]:
    """``function`` traced on ``arrays`` (``jax.make_jaxpr``, whose cache holds the function
    weakly): its program, the values it reads from outside its arguments (the program's constants,
    the very objects it read) and its output's tree structure. jax 0.10-0.11 give a
    ``ClosedJaxpr``, jax 0.12 a ``Jaxpr`` that holds its constants: both have ``.jaxpr`` and
    ``.consts``. (``jax.closure_convert`` caches each traced function with its constants, so a
    fresh function a call keeps its tracers alive: not used.)"""
    closed, shapes = jax.make_jaxpr(function, return_shape=True)(*arrays)
    return closed.jaxpr, list(closed.consts), jax.tree_util.tree_structure(shapes)


def run_traced(program: Any, consts: list[Any], arrays: Any) -> list[Any]:
    """A program from ``traced``, run on other constants and arrays (``jax.core.eval_jaxpr``, in
    ``jax.core`` on jax 0.10-0.12)."""
    return _eval_jaxpr(program, consts, *arrays)


# aval_of(struct): the abstract value of a jax.ShapeDtypeStruct (jax.eval_shape's), keeping the mesh
# axes it varies over inside jax.shard_map (a ShapedArray built from shape and dtype alone drops
# them): jax._src.core's shaped_abstractify, jax 0.10-0.12.
aval_of = _jax_core.shaped_abstractify


def batched_aval(aval: Any, size: int) -> Any:
    """``aval`` with a leading batch axis of ``size`` and its weak type; inside ``jax.shard_map``
    its varying axes kept too (``ShapedArray.update``, jax 0.10-0.12). Elsewhere its sharding is
    not kept: on an Explicit mesh it would declare the new batch axis replicated."""
    shape = (size, *aval.shape)
    if inside_shard_map():
        return aval.update(shape=shape)
    return SHAPED_ARRAY(shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def inside_shard_map() -> bool:
    """Whether the current trace is inside ``jax.shard_map`` (the abstract mesh's manual axes,
    ``jax.sharding.get_abstract_mesh().manual_axes``, jax 0.10-0.12)."""
    return bool(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()))


# jax.export serializes a program, and refuses one holding a host callback only after tracing it
# ("serialization of host_callbacks is not yet implemented", jax 0.10-0.12), with no function
# named: a host call traced while an export's own frame is on the stack is refused first.
import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

_EXPORT_FILE = _os.path.join("jax", "_src", "export", "_export.py")


def inside_export() -> bool:
    """Whether ``jax.export`` is tracing the current call (its module's frame is on the stack)."""
    return _on_stack(_EXPORT_FILE)


# What jax.numpy says when a function whose output's size depends on the values (a compaction) runs
# under a trace without a static size: the context its ConcretizationTypeError carries, the same
# text in jax 0.10.2 and 0.12 (jnp.nonzero's, which jnp.where with one argument, jnp.argwhere,
# jnp.flatnonzero and Array.nonzero call; jnp.unique's, which the set functions call), each with
# the keyword that fixes the size.
_SIZE_DEPENDS_ON_VALUES = (
    ("The size argument of jnp.nonzero must be statically specified", "jnp.nonzero", "size"),
    ("jnp.unique()", "jnp.unique", "size"),
    ("The error arose in union1d()", "jnp.union1d", "size"),
    ("The error arose in setdiff1d()", "jnp.setdiff1d", "size"),
    ("pass a static `length` argument", "jnp.bincount", "length"),
    ("the total number of repeats must be static", "jnp.repeat", "total_repeat_length"),
)
_JAX_NUMPY_DIR = _os.path.join("jax", "_src", "numpy") + _os.sep
_JAX_DIR = _os.path.dirname(jax.__file__) + _os.sep


def sized_by_values(err: BaseException) -> tuple[str, str] | None:
    """Where ``err`` is jax.numpy refusing, under a trace, a function whose output's size depends
    on the values: the function the user called (``jnp.argwhere``, ``jnp.where``, ``x.nonzero``,
    read from the traceback: the outermost frame in jax.numpy, as jax 0.10.2-0.12 lay them out;
    else the function whose text matched) and the keyword that fixes the size; else None."""
    text = str(err) if isinstance(err, jax.errors.ConcretizationTypeError) else ""  # no other error matches
    found = next(((name, keyword) for key, name, keyword in _SIZE_DEPENDS_ON_VALUES if key in text), None)
    if found is None:
        return None
    names = _jax_functions(err, _JAX_NUMPY_DIR)
    if names and names[0] == "meth" and len(names) > 1:  # Array's method wrapper (array_methods.py)
        return f"x.{names[1].lstrip('_')}", found[1]
    if names and names[0].isidentifier() and not names[0].startswith("_"):
        return f"jnp.{names[0]}", found[1]
    return found


def raised_in_array_method(err: BaseException, name: str) -> bool:
    """Whether ``err`` was raised inside JAX's array method ``name`` (a frame of JAX's code named
    ``name`` or ``_name``, as jax 0.10-0.12 spell Array's methods)."""
    return name in [function.lstrip("_") for function in _jax_functions(err, _JAX_DIR)]


def _jax_functions(err: BaseException, path: str) -> list[str]:
    """The names of the functions in ``err``'s traceback that run JAX's code at ``path`` (a file,
    or a folder ending in a separator), outermost first."""
    return [
        frame.f_code.co_name
        for frame, _ in traceback.walk_tb(err.__traceback__)
        if path in frame.f_code.co_filename.replace("/", _os.sep)
    ]


def concretized(err: BaseException) -> Any:
    """The tracer whose concrete value ``err`` (a tracer error) asked for, where it can be told; else
    None.

    JAX raises these errors in a frame that was handed the tracer (``Tracer.__bool__``'s
    ``self``, ``concrete_or_error``'s ``val``, a shape tuple holding it): the innermost frame of the
    traceback that holds a tracer (in a local, or a tuple or list a local is) holds it. Where that
    frame holds more than one, which one is not known: None. A guess about JAX's code that fails
    safe (None: the message says the fix in general), jax 0.10-0.12."""
    for frame, _ in reversed(list(traceback.walk_tb(err.__traceback__))):
        held = {id(item): item for item in _items(frame.f_locals.values()) if isinstance(item, Tracer)}
        if held:
            return next(iter(held.values())) if len(held) == 1 else None
    return None


# Which JAX transformation traced a value (jax 0.10.2-0.12, read from jax._src.interpreters: no
# public names): a ``BatchTracer`` is jax.vmap's (batched where its ``batch_dim`` is not None); a
# ``DynamicJaxprTracer`` is a value of the function a trace stages out (its ``val`` a ``Var``; its
# ``_trace.frame`` holds the function's ``invars``, the outer values it lifted in
# ``constvar_to_val``, and ``debug_info.traced_for``: "jit", "fori_loop", "scan", "while_body",
# "custom_vjp fun"...). A custom rule's function is traced inside the outer trace's
# ``process_custom_vjp_call``/``process_custom_jvp_call``, whose ``tracers`` are its arguments.
_LOOPS = ("fori_loop", "scan", "while_body", "while_cond", "while_loop", "map")


def traced_by(value: Any) -> str | None:
    """Which transformation made ``value`` (a tracer) a traced argument: 'jit' (an argument of the
    function ``jax.jit`` traced), 'vmap' (batched by ``jax.vmap``), 'loop' (an argument of a
    ``lax.fori_loop``/``lax.scan``/``lax.while_loop`` body: its index, carry or element); None
    where that is not known (computed inside a trace, or any other transformation). Follows a
    value lifted into an inner trace, and a custom rule's argument to the value it was called with.
    Fails safe: None wherever JAX's layout is not the one known."""
    try:
        return _traced_by(value, _sys._getframe(1), 0)
    except Exception:  # noqa: BLE001 - a JAX laid out otherwise: not known
        return None


def _traced_by(value: Any, frame: Any, depth: int) -> str | None:
    if depth > 16:
        return None
    kind = type(value).__name__
    if kind == "BatchTracer":
        return "vmap" if getattr(value, "batch_dim", None) is not None else None
    if kind != "DynamicJaxprTracer":
        return None
    trace, var = value._trace, value.val
    lifted = next((outer for const, outer in trace.frame.constvar_to_val.items() if const is var), None)
    if lifted is not None:
        return _traced_by(lifted, frame, depth + 1)
    position = next((i for i, invar in enumerate(trace.frame.invars) if invar is var), None)
    if position is None:
        return None  # computed inside the trace
    traced_for = str(getattr(trace.frame.debug_info, "traced_for", None))
    if traced_for == "jit":
        # not known: with jax_custom_vjp3 (it traces forward as a jit of its own), under jax.eval_shape
        # or jax.make_jaxpr (they trace as jit does: no static_argnames), and under jax.vmap (jit's
        # arguments may be batched ones)
        unknown = (depth == 0 and custom_vjp3()) or _on_stack(_API_FILE, _ABSTRACT_TRACES) or _under_vmap(trace)
        return None if unknown else "jit"
    if traced_for in _LOOPS:
        return "loop"
    if not traced_for.startswith(("custom_vjp", "custom_jvp")):
        return None
    caller = _custom_call(frame, len(trace.frame.invars))
    return None if caller is None else _traced_by(caller.f_locals["tracers"][position], caller.f_back, depth + 1)


def _custom_call(frame: Any, count: int) -> Any:
    """The frame of the nearest custom rule's call on the stack from ``frame`` outward, where it
    has ``count`` arguments (its ``tracers``); else None."""
    while frame is not None and frame.f_code.co_name not in ("process_custom_vjp_call", "process_custom_jvp_call"):
        frame = frame.f_back
    tracers = None if frame is None else frame.f_locals.get("tracers")
    return frame if isinstance(tracers, (list, tuple)) and len(tracers) == count else None


def _under_vmap(trace: Any) -> bool:
    """Whether a ``jax.vmap`` trace encloses ``trace`` (its ``parent_trace`` chain)."""
    for _ in range(64):
        trace = getattr(trace, "parent_trace", None)
        if trace is None:
            return False
        if type(trace).__name__ == "BatchTrace":
            return True
    return True


_API_FILE = _os.path.join("jax", "_src", "api.py")
_ABSTRACT_TRACES = frozenset({"eval_shape", "make_jaxpr", "make_jaxpr_f"})  # jax 0.10-0.12's names in api.py


def _on_stack(file: str, names: frozenset[str] | None = None) -> bool:
    """Whether a frame of JAX's module ``file`` (running one of its functions ``names``, where
    given) is on the stack, from the caller's outward."""
    return any(
        frame.f_code.co_filename.endswith(file) and (names is None or frame.f_code.co_name in names)
        for frame, _ in traceback.walk_stack(_sys._getframe(1))
    )


# JAX's loggers of a failed host callback (jax 0.10-0.12): they log its traceback before JAX raises.
CALLBACK_LOGGERS = ("jax._src.debugging", "jax._src.callback")


@functools.cache
def checkpoint_name_batches(remat3: bool) -> bool:
    """Whether JAX's ``checkpoint_name`` works under ``jax.vmap`` with this ``jax_remat3`` setting
    (it does not on jax 0.10 with it on: its hijax primitive there has no batching rule)."""
    try:
        jax.eval_shape(jax.vmap(lambda x: checkpoint_name(x, "jaxfn.probe")), jax.ShapeDtypeStruct((1,), np.float32))
    except NotImplementedError:
        return False
    return True
