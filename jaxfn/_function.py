"""``autograd_function`` and ``Function``: a forward and a backward made one ``jax.custom_vjp``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import CustomVJPPrimal

from . import _arguments, _eager, _forward_mode, _gradients, _outputs
from ._context import Context
from ._errors import AutogradFunctionTypeError, prefix

# The words jax.custom_vjp's TypeError uses when forward mode reaches it.
_JVP_REFUSAL = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"

_FORWARD_MODE_HELP = (
    "{name} was differentiated in forward mode (jax.jvp, jax.jacfwd, jax.linearize), but it "
    "defines a backward (reverse mode) only, and jax.custom_vjp refuses forward mode. Use "
    "reverse mode (jax.grad, jax.vjp, jax.jacrev), or build it with "
    "jaxfn.autograd_function(forward, backward, forward_mode=True) (or forward_mode = True on a "
    "jaxfn.Function) so that the same backward also gives forward mode."
)


class AutogradFunction:
    """A differentiable function made of a ``forward`` and a ``backward`` (see ``autograd_function``)."""

    def __init__(
        self,
        forward: Callable[..., Any],
        backward: Callable[..., Any],
        *,
        name: str | None = None,
        forward_mode: bool = False,
    ):
        self.name = name if name is not None else getattr(forward, "__name__", "function")
        _check_definition(self.name, "forward", forward)
        _check_definition(self.name, "backward", backward)
        self.forward = forward
        self.backward = backward
        self.forward_mode = bool(forward_mode)
        self._signature = inspect.signature(forward)
        self._backward_signature = inspect.signature(backward)
        self._positional = _arguments.positional_names(self._signature)
        self._eager = _eager.EagerCache()
        self.__doc__ = forward.__doc__
        self.__name__ = self.name

    def __repr__(self) -> str:
        return f"<jaxfn.AutogradFunction '{self.name}'>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        arguments = _arguments.split(_arguments.bind(self.name, self._signature, args, kwargs, self._positional))
        if _eager.outside_traces(arguments.arrays):
            return self._eager.call(arguments, self._primal, lambda: self._call(arguments))
        return self._call(arguments)

    def _primal(self, args: _arguments.Arguments, arrays: tuple[Any, ...]) -> Any:
        """Forward's output alone: what a call that nothing differentiates needs."""
        return self._run_forward(args, arrays, [False] * len(arrays))[1]

    def _call(self, arguments: _arguments.Arguments) -> Any:
        try:
            structure = arguments.structure()  # the custom_vjp keeps no reference to this call's arrays
            built = _forward_mode.build(self, structure) if self.forward_mode else self._build(structure)
            return built(*arguments.arrays)
        except TypeError as err:
            if _JVP_REFUSAL in str(err):
                raise AutogradFunctionTypeError(_FORWARD_MODE_HELP.format(name=prefix(self.name))) from err
            raise

    # -- one call: the custom_vjp ----------------------------------------------------------
    def _build(self, args: _arguments.Arguments) -> Callable[..., Any]:
        """The ``jax.custom_vjp`` for one call's static structure, over its array leaves.

        JAX may trace ``fwd`` of one call several times (once per set of differentiated
        arguments) before an earlier trace's ``bwd`` runs, and it keeps only the latest trace's
        residual tree structure. So each trace's static state goes into ``traces``, and the
        trace's index travels as the shape of a zero-size residual, ``(0, index)``: shapes are
        static, so each ``bwd`` reads its own trace's state.
        """
        traces: list[tuple[Any, ...]] = []

        @jax.custom_vjp
        def primal(*arrays: Any) -> Any:
            return self._primal(args, arrays)

        def fwd(*primals: CustomVJPPrimal) -> tuple[Any, Any]:
            arrays = [p.value for p in primals]
            perturbed = [p.perturbed for p in primals]
            ctx, out, info = self._run_forward(args, arrays, perturbed)
            saved, static = ctx.to_residuals()
            avals = _arguments.shape_dtypes(arrays)
            traces.append((static, info, avals, perturbed))
            return out, (saved, jnp.zeros((0, len(traces) - 1), jnp.uint8))

        def bwd(residuals: Any, cotangents: Any) -> tuple[Any, ...]:
            saved, token = residuals
            static, info, avals, perturbed = traces[token.shape[1]]
            ctx = Context.from_residuals(saved, static)
            grads = self._run_backward(ctx, _outputs.grad_outputs(info, cotangents, ctx.materialize_grads))
            return tuple(_gradients.to_cotangents(self.name, args, grads, avals, perturbed))

        primal.defvjp(fwd, bwd, symbolic_zeros=True)
        return primal

    def _run_forward(
        self, args: _arguments.Arguments, arrays: Any, perturbed: list[bool]
    ) -> tuple[Context, Any, _outputs.Outputs]:
        """Call the user's forward on one trace's arrays, with a fresh context."""
        owners = [args.owners[i] for i in args.array_positions()]
        needs = {name: False for name in args.names}
        for owner, flag in zip(owners, perturbed):
            needs[args.names[owner]] = needs[args.names[owner]] or bool(flag)
        ctx = Context(self.name, needs, inputs=arrays)
        out = _arguments.call_forward(self.forward, self._signature, ctx, args.names, args.values(arrays))
        ctx._jaxfn["in_forward"] = False
        out, info = _outputs.check(self.name, out, ctx._jaxfn["non_differentiable"])
        return ctx, out, info

    def _run_backward(self, ctx: Context, grad_outputs: list[Any]) -> dict[str, Any]:
        """Call the user's backward, and return its gradients by parameter name."""
        try:
            self._backward_signature.bind(ctx, *grad_outputs)
        except TypeError:
            raise AutogradFunctionTypeError(
                f"{prefix(self.name)}: backward must accept ctx and {len(grad_outputs)} grad_output "
                f"argument(s), one per output of forward, but its signature is "
                f"{self._backward_signature}."
            ) from None
        returned = self.backward(ctx, *grad_outputs)
        names = tuple(self._parameter_names())
        return _gradients.by_parameter(self.name, names, returned)

    def _parameter_names(self) -> list[str]:
        return list(self._signature.parameters)[1:]


def _check_definition(name: str, role: str, function: Any) -> None:
    """A forward or backward must be callable and take the context first."""
    if not callable(function):
        raise AutogradFunctionTypeError(
            f"{prefix(name)}: {role} must be a function taking ctx first, but got a {type(function).__name__}."
        )
    try:
        has_ctx = _arguments.context_parameter(function) is not None
    except (TypeError, ValueError):  # no signature to read (some builtins): trust the caller
        return
    if not has_ctx:
        raise AutogradFunctionTypeError(
            f"{prefix(name)}: {role} must take the context as its first parameter, as in "
            f"{role}(ctx, ...), but its signature is {inspect.signature(function)}."
        )


def autograd_function(
    forward: Callable[..., Any],
    backward: Callable[..., Any],
    *,
    name: str | None = None,
    forward_mode: bool = False,
) -> AutogradFunction:
    """Make a differentiable JAX function from a ``forward`` and a ``backward``, as R torch does.

    Usage template::

        def forward(ctx, input, weight, bias=None):   # ctx first, then any parameters
            ctx.save_for_backward(input=input, weight=weight, bias=bias)  # or (*values) -> saved_tensors
            ctx.scale = 2                              # attributes reach backward too
            ctx.mark_non_differentiable(...)           # outputs that carry no gradient
            ctx.set_materialize_grads(False)           # unused outputs' grads arrive as None
            return input @ weight.T                    # array, tuple/list or pytree of arrays

        def backward(ctx, grad_output):                # one grad_output per tuple/list output
            s = ctx.saved_variables                    # s.input, s["weight"]
            if ctx.needs_input_grad.input:             # or ["input"], or [0]
                ...
            return {"input": ..., "weight": ...}       # or a tuple per parameter, a bare array, None

        linear = jaxfn.autograd_function(forward, backward)

    Differences from R torch / PyTorch / ``jax.custom_vjp``:

    * pytree arguments are looked inside; float/complex array leaves are differentiable, integer
      arrays pass through, everything else is static (a plain Python value, also under ``jit``);
    * JAX arrays are immutable: ``ctx.mark_dirty`` only checks its arguments;
    * complex gradients follow JAX's convention (no conjugate in backward's formula);
    * no residual tuples, ``nondiff_argnums`` or symbolic zeros to handle by hand: ``ctx`` does it,
      and ``needs_input_grad`` is exact;
    * ``forward_mode=True`` derives ``jax.jvp``/``jax.jacfwd`` from the same backward.

    Args:
      forward: ``forward(ctx, *args, **kwargs)``, returning the output.
      backward: ``backward(ctx, *grad_outputs)``, returning the gradients.
      name: what error messages call the function (default ``forward.__name__``).
      forward_mode: also support forward-mode autodiff, by transposing backward.

    Returns:
      A callable ``jaxfn.AutogradFunction``.

    Raises:
      AutogradFunctionError: if forward or backward is not a function taking ctx first.

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
    return AutogradFunction(forward, backward, name=name, forward_mode=forward_mode)


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

    The class name is the function's name in error messages; ``forward_mode = True`` as a class
    attribute is ``autograd_function(..., forward_mode=True)``.
    """

    forward_mode: bool = False
    _jaxfn: AutogradFunction | None = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        forward, backward = getattr(cls, "forward", None), getattr(cls, "backward", None)
        cls._jaxfn = None
        if forward is not None and backward is not None:
            cls._jaxfn = AutogradFunction(forward, backward, name=cls.__name__, forward_mode=cls.forward_mode)

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Call the function (as PyTorch's ``Function.apply``)."""
        if cls._jaxfn is None:
            raise AutogradFunctionTypeError(
                f"{prefix(cls.__name__)}: a jaxfn.Function subclass needs static methods forward(ctx, ...) "
                "and backward(ctx, grad_output) before .apply can be called."
            )
        return cls._jaxfn(*args, **kwargs)
