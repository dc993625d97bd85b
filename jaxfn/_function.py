"""``autograd_function`` and ``Function``: a forward and a backward made one ``jax.custom_vjp``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal

import jax

from . import (
    _arguments,
    _closures,
    _eager,
    _finite_differences,
    _forward_mode,
    _host,
    _jax_private,
    _outputs,
    _primitive,
    _reverse_mode,
    _rule,
)
from ._errors import AutogradFunctionError, AutogradFunctionTypeError, error


class AutogradFunction:
    """A differentiable function made of a `forward` and a `backward`.

    What [`autograd_function`][jaxfn.autograd_function] returns (its parameters are this
    class's), and what a [`Function`][jaxfn.Function] subclass's `apply` calls. Call it as
    forward is called, without `ctx`: arguments, keywords and defaults are bound as Python binds
    them. Outside any JAX transformation the call runs forward op by op (compiled once per call
    signature with `jit=True`); under `jax.jit`, `jax.grad`, `jax.vmap` and the others it is one
    custom rule: a `jax.custom_vjp`, a `jax.custom_jvp` that transposes backward
    (`forward_mode=True`), or a JAX primitive that carries a `jvp` or `vmap` rule too. It
    pickles by its forward, backward and options.

    Attributes:
      name (str): what error messages call the function, and the first part of its saves' names.
      forward (Callable[..., Any]): the forward it was made with.
      backward (Callable[..., Any] | str): the backward it was made with (or `"finite_differences"`).
      forward_mode (bool): whether forward mode is derived from backward (`forward_mode=True`).
      jit (bool): whether eager calls are compiled (`jit=True`).

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> double = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="double")
    >>> double
    <jaxfn.AutogradFunction 'double'>
    >>> print(double(jnp.ones(2)), jax.grad(lambda x: double(x).sum())(jnp.ones(2)))
    [2. 2.] [2. 2.]
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        backward: Callable[..., Any] | Literal["finite_differences"],
        *,
        name: str | None = None,
        forward_mode: bool = False,
        setup_context: Callable[..., Any] | None = None,
        host: bool = False,
        output: Any = None,
        jit: bool = False,
        jvp: Callable[..., Any] | None = None,
        vmap: Callable[..., Any] | None = None,
    ):
        # the options as given: with forward and backward, what pickling rebuilds the function from
        self._options = {key: value for key, value in locals().items() if key not in ("self", "forward", "backward")}
        self.name = name if name is not None else getattr(forward, "__name__", "function")
        self._user = (forward, backward, jvp, vmap)  # what the user wrote (read-only), checked for held values
        if isinstance(backward, str):  # "finite_differences": backward and jvp made from a host forward
            self._definition = _finite_differences.definition(
                self.name, backward, host, forward, setup_context, jvp, vmap
            )
        else:
            self._definition = _rule.Definition.of(self.name, forward, backward, setup_context, jvp, vmap)
        self.forward_mode, self.jit = bool(forward_mode), bool(jit)
        _refuse_combinations(self.name, _option_combinations(self._definition, self.forward_mode, host, self.jit))
        self._host = _host.HostFunction(self._definition, output) if host else None
        # the plan, decided once: which builder, and whether forward mode is the function's own
        self._forward_mode = self.forward_mode or self._definition.jvp is not None  # derived, or the user's jvp
        if vmap is not None:  # a hijax primitive that carries the vmap rule
            self._builder = functools.partial(_primitive.build, forward_mode=self.forward_mode)
        else:
            self._builder = _forward_mode.build if self._forward_mode else _reverse_mode.build
        # what forward and backward close over may become parameters (SPEC 15) where they are plain functions
        self._closed_over_parameters = not (host or setup_context or jvp or vmap)
        self._compiled = _eager.Compiled(self._definition, self._traced) if self.jit else None
        self.__doc__ = forward.__doc__
        self.__name__ = self.name
        # forward's parameters without ctx, as inspect.signature (and so jax.jit's static_argnames) reads them
        signature = self._definition.signature
        self.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])

    @property
    def forward(self) -> Callable[..., Any]:
        return self._user[0]

    @property
    def backward(self) -> Callable[..., Any] | str:
        return self._user[1]

    def __repr__(self) -> str:
        return f"<jaxfn.AutogradFunction '{self.name}'>"

    def __reduce__(self) -> Any:
        return (_rebuild, (*self._user[:2], self._options))

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        """Refused, with the fix: the function is called directly, `f(x)` (PyTorch's `apply` is a
        class's: a `jaxfn.Function` subclass's).

        Args:
          *args: the call's positional arguments, as the function takes them.
          **kwargs: the call's keyword arguments.
        """
        raise error(
            AutogradFunctionTypeError,
            self.name,
            f"a function made by jaxfn.autograd_function (or jaxfn.from_torch) is called directly, as R torch's "
            f"is, but it was called as {self.name}.apply(...) (the class form's call, a jaxfn.Function subclass's, "
            f"as in PyTorch); call it with the same arguments: {self.name}(...)",
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is not None and not kwargs:
            out = self._compiled.fast_call(args)
            if out is not _eager.MISS:
                return out
        arguments = self._definition.bind(args, kwargs)
        if not _jax_private.outside_traces(arguments.arrays):
            return self._traced(arguments)
        if self._host is not None:
            return self._host.eager(arguments)
        if self._compiled is not None:
            return self._compiled(arguments)
        return _eager.call(self._definition, arguments)

    def _traced(self, arguments: _arguments.Arguments) -> Any:
        """The call under a JAX transformation, through this function's builder; JAX's refusals
        said in jaxfn's words (forward mode on a function without it is refused here, also where
        JAX would refuse only when a ``jit`` around it compiles)."""
        definition, arguments = _closures.of(self._definition, arguments, self._user, self._closed_over_parameters)
        if not self._forward_mode and any(_jax_private.is_forward_mode_tracer(a) for a in arguments.arrays):
            raise error(AutogradFunctionTypeError, self.name, _rule.FORWARD_MODE_HELP)
        if _jax_private.plain_forward_on():  # forward mode's gate transposes through this call's forward
            if self._host is None:
                return _eager.call(definition, arguments)
            # host code runs as itself (on saved values only, it needs no transpose), noted for the message
            _rule.note_host_in_plain_forward(self.name)
        if self._host is not None:  # the host code's callbacks, as a rule like any other
            definition = self._host.rule
        rule = self._builder(definition, arguments.structure())  # keeps no reference to the arrays
        arrays = _rule.vary_together(arguments, arguments.arrays)
        try:
            try:
                return rule(*arrays)
            except NotImplementedError as err:
                if not _jax_private.refused_in_eager_shard_map(err):
                    raise
            # inside an un-jitted jax.shard_map: JAX takes the call under jit (Python outputs kept)
            return _eager.keeping_python_values(jax.jit(lambda *a: _eager.box_python_values(rule(*a))))(*arrays)
        except AutogradFunctionError:
            raise
        except Exception as err:  # noqa: BLE001 - JAX's own refusals, said in jaxfn's words
            explanation = _explain(err)
            if explanation is None:
                raise
            raise error(AutogradFunctionTypeError, self.name, explanation) from err

    def outputs(self, *args: Any, **kwargs: Any) -> _outputs.Outputs:
        """For a call, the description of forward's output (which leaves are arrays, which carry a
        gradient), from an abstract run of forward (``jax.eval_shape``); ``jaxfn.gradcheck``
        uses it to leave out outputs marked non-differentiable."""
        arguments = self._definition.bind(args, kwargs)
        if self._host is not None:
            return self._host.outputs(arguments)
        rule = _rule.Rule(self._definition, arguments.structure())
        return jax.eval_shape(rule.primal, *arguments.arrays)[1].info

    def output_differentiable(self, *args: Any, **kwargs: Any) -> Any:
        """For a call, whether each output leaf carries a gradient (`None` for Python values).

        Read from an abstract run of forward (`jax.eval_shape`): nothing is computed. Outputs
        marked with `ctx.mark_non_differentiable` and integer outputs carry none.

        Args:
          *args: the call's positional arguments, as the function takes them.
          **kwargs: the call's keyword arguments.

        Returns:
          Forward's output structure with a bool (or `None`) in place of each leaf.
        """
        info = self.outputs(*args, **kwargs)
        return info.rebuild(info.differentiable, python_values=False)  # a flag per array leaf, None elsewhere


def _explain(err: Exception) -> str | None:
    """jaxfn's words for a JAX refusal that a user of a jaxfn function can meet; None for others."""
    if _jax_private.refused_forward_mode(err):
        return _rule.FORWARD_MODE_HELP
    if _jax_private.refused_closure(err):
        return _closures.CLOSURE_HELP
    if _jax_private.refused_fwd_output(err):
        return _rule.OUTPUT_DIFFERS
    return None


def _refuse_combinations(name: str, refusals: dict[str, bool]) -> None:
    """Options that can't go together, refused when the function is made: ``refusals`` holds each
    sentence and whether it applies; the first that does is raised."""
    for sentence, applies in refusals.items():
        if applies:
            raise error(AutogradFunctionTypeError, name, sentence)


def _option_combinations(definition: _rule.Definition, forward_mode: bool, host: bool, jit: bool) -> dict[str, bool]:
    """The options' combinations ``_refuse_combinations`` refuses, and whether each applies."""
    return {
        "host=True runs NumPy code that JAX can't transpose, trace or compile, so it can't be combined with "
        "forward_mode=True or jit=True; drop one of them": host and (forward_mode or jit),
        "it has a jvp rule and forward_mode=True, which would derive another jvp from backward; drop "
        "forward_mode=True to use your jvp, or drop the jvp to derive it": forward_mode and definition.jvp is not None,
        "it has forward_mode=True, whose tangent rule differentiates backward, but backward is marked "
        "jaxfn.once_differentiable; drop one of the two": forward_mode and definition.once_differentiable,
    }


def _rebuild(forward: Any, backward: Any, options: dict[str, Any]) -> AutogradFunction:
    return AutogradFunction(forward, backward, **options)


def autograd_function(
    forward: Callable[..., Any],
    backward: Callable[..., Any] | Literal["finite_differences"],
    *,
    name: str | None = None,
    forward_mode: bool = False,
    setup_context: Callable[..., Any] | None = None,
    host: bool = False,
    output: Any = None,
    jit: bool = False,
    jvp: Callable[..., Any] | None = None,
    vmap: Callable[..., Any] | None = None,
) -> AutogradFunction:
    """Make a differentiable JAX function from a `forward` and a `backward`, as R torch does.

    Usage template:

    ```python
    def forward(ctx, input, weight, bias=None):  # ctx first, then any parameters
        # by name (saved_variables), or by position: (*values) -> saved_tensors
        ctx.save_for_backward(input=input, weight=weight, bias=bias)
        ctx.scale = 2                      # attributes reach backward too
        ctx.mark_non_differentiable(...)   # outputs that carry no gradient
        ctx.set_materialize_grads(False)   # unused outputs' grads arrive as None
        return input @ weight.T            # array, tuple/list or pytree of arrays

    def backward(ctx, grad_output):        # one grad_output per tuple/list output
        s = ctx.saved_variables            # s.input, s["weight"]
        if ctx.needs_input_grad.input:     # or ["input"], or [0]
            ...
        # or a tuple per parameter, a bare array, None
        return {"input": ..., "weight": ...}

    linear = jaxfn.autograd_function(forward, backward)
    ```

    Differences from R torch / PyTorch / `jax.custom_vjp`:

    * pytree arguments are looked inside; float/complex array leaves are differentiable, integer
      arrays pass through, everything else is static (a plain Python value, also under `jit`);
    * JAX arrays are immutable: `ctx.mark_dirty` only checks its arguments;
    * complex gradients follow JAX's convention (no conjugate in backward's formula);
    * no residual tuples, `nondiff_argnums` or symbolic zeros to handle by hand: `ctx` does it,
      and `needs_input_grad` is exact;
    * `forward_mode=True` derives `jax.jvp`/`jax.jacfwd` from the same backward; or give a
      `jvp` rule of your own, and a `vmap` rule for `jax.vmap`, as PyTorch's
      `autograd.Function` takes them;
    * host code with no derivative at all (a simulator, a SciPy routine) takes
      `"finite_differences"` in place of backward (with `host=True`).

    Args:
      forward: `forward(ctx, *args, **kwargs)`, returning the output: an array, a tuple/list of
        arrays, or any pytree of arrays (Python values in it come back unchanged). Any
        parameters, defaults, keywords and `*args`, bound as Python binds them.
      backward: `backward(ctx, *grad_outputs)`, given one `grad_output` per element of a
        tuple/list output (else one), returning the gradients: a dict keyed by parameter name,
        a tuple/list with one entry per argument, a bare array, or `None` (`None` and missing
        keys mean zero). Or the string `"finite_differences"`, with `host=True`: backward and a
        jvp rule by central differences of forward, each gradient in one host call (step
        `cbrt(eps)·max(1, |x|)` per element; the manual's Host functions page states the cost and
        accuracy).
      name: what error messages call the function, and the first part of its saves' names
        (`"linear.input"`); default `forward.__name__`.
      forward_mode: also support forward-mode autodiff (`jax.jvp`, `jax.jacfwd`), by
        transposing backward (which must be linear in `grad_output`). Not with a `jvp` rule.
      setup_context: PyTorch 2's form: `forward(*args)` takes no ctx, and
        `setup_context(ctx, inputs, output)` saves what backward needs.
      host: forward and backward are NumPy/SciPy code, run through `jax.pure_callback`
        (under `jit`, `grad` and `vmap`); backward is once-differentiable. Not with
        `forward_mode=True` or `jit=True`.
      output: with `host=True`, the output's `jax.ShapeDtypeStruct` (pytree), checked
        against what forward returns; by default it is derived once by running forward on ones.
      jit: compile eager calls (outside any JAX transformation) with `jax.jit`, once per call
        signature (static values keyed strictly). Without it, an eager call runs forward's
        Python op by op, every time, as PyTorch does. Calls inside `jit`/`grad`/`vmap` are
        the same either way.
      jvp: a forward-mode rule of your own, as PyTorch's `jvp`: `jvp(ctx, *tangents)` gets one
        tangent per argument of forward (each `*args` element apart), in the argument's
        structure: the tangent of each float/complex leaf, zeros where JAX is not
        differentiating it (`None` with `ctx.set_materialize_grads(False)`), `None` for integer
        and static leaves. It returns one tangent per output, in forward's output structure
        (`None` for a zero tangent). Its `ctx` holds what forward saved with
        `ctx.save_for_forward(...)` (as `saved_tensors` and `saved_variables`) and the
        attributes forward set. It serves `jax.jvp`, `jax.jacfwd` and `jax.linearize`;
        backward still serves reverse mode. Not with `forward_mode=True`.
      vmap: a batching rule of your own, as PyTorch's `vmap`: `vmap(info, in_dims, *args)` gets
        `info.batch_size` (and `info.randomness`, always `"error"`: random values come from key
        arguments), `in_dims` with one entry per argument (the batch axis of each array leaf,
        `None` where it is not batched and for static values), and forward's arguments, batched.
        It returns `(outputs, out_dims)`: the batched outputs in forward's structure and one
        batch axis (or `None`) per output, or one int for all. It serves `jax.vmap` in place of
        batching forward's operations; the gradients of a batched call still come from
        backward.

    Returns:
      A callable [`AutogradFunction`][jaxfn.AutogradFunction].

    Raises:
      AutogradFunctionError: if forward or backward is not a function taking ctx first (nor
        backward `"finite_differences"` with `host=True`), or the options can't go together.

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> def forward(ctx, tensor, constant):
    ...     ctx.save_for_backward(constant=constant)
    ...     return tensor * constant
    >>> def backward(ctx, grad_output):
    ...     return {"tensor": grad_output * ctx.saved_variables.constant}
    >>> mul_constant = jaxfn.autograd_function(forward, backward)
    >>> print(jax.grad(lambda x: mul_constant(x, 2).sum())(jnp.ones(1)))
    [2.]
    """
    return AutogradFunction(**locals())  # the parameters as given, which are AutogradFunction's


def once_differentiable(backward: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a backward that may be differentiated only once, as PyTorch's decorator does.

    The first derivative works as usual; differentiating backward again (`jax.grad` of
    `jax.grad`, `jax.hessian`) raises `AutogradFunctionError` naming the function, instead
    of a wrong or confusing result. Use it on a backward that calls code JAX can't differentiate
    (NumPy, SciPy, a callback). It can't be combined with `forward_mode=True`, which
    differentiates backward.

    Args:
      backward: the backward to mark, a function or a `staticmethod` (put the decorator below
        `@staticmethod`, as in PyTorch).

    Returns:
      A backward that computes the same, marked once-differentiable.

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> class Cube(jaxfn.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x**3
    ...     @staticmethod
    ...     @jaxfn.once_differentiable
    ...     def backward(ctx, grad_output):
    ...         (x,) = ctx.saved_tensors
    ...         return grad_output * 3 * x**2
    >>> float(jax.grad(Cube.apply)(2.0))
    12.0
    """
    function = backward.__func__ if isinstance(backward, staticmethod) else backward

    @functools.wraps(function)
    def once(ctx: Any, *grad_outputs: Any) -> Any:
        return function(ctx, *grad_outputs)

    setattr(once, _rule.ONCE_DIFFERENTIABLE, True)
    return once


class Function:
    """PyTorch-style definition: subclass with static ``forward`` and ``backward``, call ``.apply``.

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> class Exp(jaxfn.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         result = jnp.exp(x)
    ...         ctx.save_for_backward(result)
    ...         return result
    ...     @staticmethod
    ...     def backward(ctx, grad_output):
    ...         (result,) = ctx.saved_tensors
    ...         return grad_output * result
    >>> float(jax.grad(Exp.apply)(0.0))
    1.0

    The class name is the function's name in error messages; `forward_mode = True` (and
    `jit`, `host`, `output`, `setup_context`) as a class attribute is
    `autograd_function(..., forward_mode=True)`. With `host = True`, the class attribute
    `backward = "finite_differences"` in place of a backward method differentiates forward by
    central differences.

    The static methods a subclass defines (each as the parameter of the same name of
    [`autograd_function`][jaxfn.autograd_function]):

    * `forward(ctx, *args, **kwargs)`: the output (`forward(*args)` without `ctx` where
      `setup_context` is set);
    * `backward(ctx, *grad_outputs)`, or `vjp` (PyTorch's other name for it; one of the two):
      the gradients;
    * `setup_context(ctx, inputs, output)` (optional): PyTorch 2's form, saves what backward
      needs;
    * `jvp(ctx, *tangents)` (optional): a forward-mode rule, one tangent per output;
    * `vmap(info, in_dims, *args)` (optional): a batching rule, returning
      `(outputs, out_dims)`.

    Attributes:
      forward_mode: `True` derives forward mode from backward (default `False`).
      setup_context: PyTorch 2's form: set it (a static method), and forward takes no ctx.
      host: `True` runs forward and backward as NumPy code, through `jax.pure_callback`.
      output: with `host = True`, the output's `jax.ShapeDtypeStruct` (else derived once).
      jit: `True` compiles eager calls with `jax.jit`, once per call signature.
      generate_vmap_rule: PyTorch's flag: `True` asks for JAX's own batching, which is what a
        class without a `vmap` rule gets anyway; `True` with a `vmap` rule is an error.
    """

    forward_mode: bool = False
    setup_context: Callable[..., Any] | None = None  # PyTorch 2's form: set it, and forward takes no ctx
    host: bool = False  # forward and backward in NumPy, through jax.pure_callback
    output: Any = None  # with host: the output's ShapeDtypeStruct (else derived once)
    jit: bool = False  # compile eager calls with jax.jit, once per call signature
    generate_vmap_rule: bool = False  # PyTorch's flag: True means JAX's own batching (the default without vmap)
    _jaxfn: AutogradFunction | None = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        forward, backward, vjp = (getattr(cls, n, None) for n in ("forward", "backward", "vjp"))
        jvp, vmap = getattr(cls, "jvp", None), getattr(cls, "vmap", None)
        refusals = {
            "it defines both backward and vjp, which are two names for the same rule (as in PyTorch); "
            "keep one": backward is not None and vjp is not None,
            "it sets generate_vmap_rule = True, which asks for JAX's own batching, and defines a vmap rule too "
            "(as in PyTorch, the two exclude each other); drop one": vmap is not None and cls.generate_vmap_rule,
        }
        _refuse_combinations(cls.__name__, refusals)
        backward = backward if backward is not None else vjp
        cls._jaxfn = None
        if forward is not None and backward is not None:
            options = {n: getattr(cls, n) for n in ("forward_mode", "setup_context", "host", "output", "jit")}
            cls._jaxfn = AutogradFunction(forward, backward, name=cls.__name__, jvp=jvp, vmap=vmap, **options)
            if "apply" not in cls.__dict__:  # .apply's signature: forward's, without ctx
                cls.apply = classmethod(_apply_with_signature(cls._jaxfn.__signature__))  # type: ignore[method-assign]

    def __new__(cls, *args: Any, **kwargs: Any) -> Function:
        if args or kwargs:  # Exp(x): PyTorch's Functions are called through .apply too
            raise error(AutogradFunctionTypeError, cls.__name__, _CALLED_DIRECTLY.format(cls=cls.__name__, how="("))
        return super().__new__(cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # Exp()(x)
        name = type(self).__name__
        raise error(AutogradFunctionTypeError, name, _CALLED_DIRECTLY.format(cls=name, how="()("))

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Call the function (as PyTorch's `Function.apply`).

        Args:
          *args: forward's positional arguments, without `ctx`.
          **kwargs: forward's keyword arguments.

        Returns:
          Forward's output (differentiable through backward, and the `jvp` and `vmap` rules).

        Raises:
          AutogradFunctionError: if the class defines no `forward` or no `backward` (or `vjp`).
        """
        if cls._jaxfn is None:
            raise error(
                AutogradFunctionTypeError,
                cls.__name__,
                "a jaxfn.Function subclass needs static methods forward(ctx, ...) and backward(ctx, grad_output) "
                "before .apply can be called",
            )
        return cls._jaxfn(*args, **kwargs)


def _apply_with_signature(signature: inspect.Signature) -> Callable[..., Any]:
    """``Function.apply`` for one subclass, with forward's signature (without ctx), so that
    ``jax.jit(F.apply, static_argnames=("flag",))`` finds the flag's position."""

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        return Function.apply.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined]

    apply.__doc__ = Function.apply.__doc__
    first = inspect.Parameter("cls", inspect.Parameter.POSITIONAL_ONLY)
    apply.__signature__ = signature.replace(parameters=[first, *signature.parameters.values()])  # type: ignore[attr-defined]
    return apply


_CALLED_DIRECTLY = (
    "a jaxfn.Function subclass is called through its apply class method, as in PyTorch, but it was called as "
    "{cls}{how}...); call {cls}.apply(...) with the same arguments"
)
