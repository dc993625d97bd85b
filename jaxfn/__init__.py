"""jaxfn: R torch's ``autograd_function`` (and PyTorch's ``autograd.Function``) on JAX."""

__version__ = "0.4.1"

from ._anomaly import detect_anomaly as detect_anomaly
from ._anomaly import set_detect_anomaly as set_detect_anomaly
from ._context import Context as Context
from ._errors import AutogradFunctionError as AutogradFunctionError
from ._errors import GradcheckError as GradcheckError
from ._function import AutogradFunction as AutogradFunction
from ._function import Function as Function
from ._function import autograd_function as autograd_function
from ._function import once_differentiable as once_differentiable
from ._gradcheck import gradcheck as gradcheck
from ._saves import saved as saved

__all__ = [
    "AutogradFunction",
    "AutogradFunctionError",
    "Context",
    "Function",
    "GradcheckError",
    "autograd_function",
    "detect_anomaly",
    "gradcheck",
    "once_differentiable",
    "saved",
    "set_detect_anomaly",
]
