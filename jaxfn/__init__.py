"""jaxfn: R torch's ``autograd_function`` (and PyTorch's ``autograd.Function``) on JAX."""

__version__ = "0.7.3"

from ._anomaly import detect_anomaly as detect_anomaly
from ._anomaly import set_detect_anomaly as set_detect_anomaly
from ._compare import Report as Report
from ._compare import compare as compare
from ._context import Context as Context
from ._errors import AutogradFunctionError as AutogradFunctionError
from ._errors import GradcheckError as GradcheckError
from ._function import AutogradFunction as AutogradFunction
from ._function import Function as Function
from ._function import autograd_function as autograd_function
from ._function import once_differentiable as once_differentiable
from ._gradcheck import gradcheck as gradcheck
from ._saves import saved as saved
from ._torch import from_torch as from_torch

__all__ = [
    "AutogradFunction",
    "AutogradFunctionError",
    "Context",
    "Function",
    "GradcheckError",
    "Report",
    "autograd_function",
    "compare",
    "detect_anomaly",
    "from_torch",
    "gradcheck",
    "once_differentiable",
    "saved",
    "set_detect_anomaly",
]
