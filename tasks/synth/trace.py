"""What a program computes, as the sequence of operators its forward pass calls: the contamination screen's view.

Two programs that compute the same thing look alike here however they are written (a
``nn.Tanh()`` module and ``torch.tanh(x)`` are both ``tanh``; MinGPT's NewGELU formula is the
same ``mul pow mul add mul tanh add mul`` in KernelBench and in transformers), where the AST
shingles they were compared by before measured code style (issue 36).

The forward pass runs under a ``TorchFunctionMode``: every call of a torch function or tensor
method at the program's own level is recorded, not what it calls inside (``F.layer_norm`` is one
operator, not the kernels it launches), so a conv is ``conv2d``, an LSTM ``lstm``, a transformer
its attention and norms: the trace stays short and tracing never unrolls a recurrence into
thousands of kernels. Model and inputs are built on the meta device (no memory, no compute:
KernelBench's level 3 holds GiBs of weights); a program that needs real values (``.item()``)
is run again on the CPU.

Each operator is a token: its name with aliases folded (``__rmul__``, ``mul_``, ``multiply``
are ``mul``; ``mm``, ``bmm`` and ``@`` are ``matmul``) and the key arguments that change what a
kernel must do, not its sizes: a reduction over some dims or over all of them (``sum:all``),
a grouped convolution (``conv2d:grouped``). A fused operator that is a short formula of others
(``silu``, ``mish``, ``softsign``) is traced as that formula. Shape and layout calls (view, permute, size,
contiguous, dropout in eval...) and factories (zeros, randn) are not computation and are left out.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

TRACE_VERSION = 4  # bumped when the tokens change: KernelBench's cached traces are keyed by it

# Calls that move, view or describe data, or make it from nothing: no kernel worth writing.
LAYOUT = {
    "size", "dim", "numel", "shape", "stride", "__get__", "__len__", "__getitem__", "__setitem__", "__iter__",
    "__format__", "__repr__", "__bool__", "__index__", "__int__", "__float__", "item", "tolist", "element_size",
    "to", "type", "cpu", "cuda", "float", "double", "half", "contiguous", "clone", "detach", "requires_grad_",
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "permute", "transpose", "t", "mT", "expand",
    "expand_as", "repeat", "squeeze", "unsqueeze", "select", "narrow", "split", "chunk", "unbind", "cat", "concat",
    "concatenate", "stack", "flip", "roll", "copy_", "dropout", "alpha_dropout", "dropout2d", "dropout3d",
    "zeros", "zeros_like", "ones", "ones_like", "empty", "empty_like", "full", "full_like", "randn", "rand",
    "randn_like", "rand_like", "randint", "arange", "linspace", "tensor", "as_tensor", "eye", "new_zeros", "new_ones",
    "new_empty", "new_full", "new_tensor", "is_floating_point", "is_contiguous", "get_device", "data_ptr", "__hash__",
    "__contains__", "has_torch_function", "unsafe_split", "masked_select", "type_as", "data", "device", "dtype",
    "is_cuda", "ndim", "__reversed__", "__array__", "storage_offset",
}
# Names folded into one: the same computation spelt another way.
ALIASES = {
    "radd": "add", "iadd": "add", "rsub": "sub", "isub": "sub", "subtract": "sub",
    "rmul": "mul", "imul": "mul", "multiply": "mul", "truediv": "div", "rtruediv": "div", "itruediv": "div",
    "divide": "div", "true_divide": "div", "rdiv": "div", "floordiv": "floor_divide", "rpow": "pow", "ipow": "pow",
    "float_power": "pow", "mm": "matmul", "bmm": "matmul", "rmatmul": "matmul", "clip": "clamp",
    "clamp_min": "clamp", "clamp_max": "clamp", "absolute": "abs", "negative": "neg", "arctan": "atan",
    "greater": "gt", "less": "lt", "greater_equal": "ge", "less_equal": "le", "equal": "eq", "not_equal": "ne",
    "special_erf": "erf",
    # bias + x @ W.T is a linear layer: DeepSpeed's ZeRO-3 replaces F.linear process-wide with a
    # function that calls addmm (a test suite's process that ran it first traced Linear so).
    "addmm": "linear",
}
# Fused operators that KernelBench writes out as their formula: traced as the formula's operators,
# so that both spellings meet (F.silu against level1/25_Swish's x * torch.sigmoid(x): a 200-task
# synth run accepted a one-operator silu task at score 0).
COMPOSITES = {
    "silu": ("sigmoid", "mul"),  # x * sigmoid(x)
    "mish": ("softplus", "tanh", "mul"),  # x * tanh(softplus(x))
    "softsign": ("abs", "add", "div"),  # x / (1 + |x|)
}
# Operators whose key argument is the dims they reduce over: over some (the usual) or over all of them.
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "std", "var", "norm", "logsumexp", "argmax",
              "argmin", "all", "any", "nansum", "nanmean", "median"}
GROUPED = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}


class _Recorder(TorchFunctionMode):
    """Every torch call at the program's level, as a token (the mode is off inside a call: what it calls is not seen)."""

    def __init__(self):
        super().__init__()
        self.tokens: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        token = token_of(func, args, kwargs)
        if token:
            self.tokens.extend(COMPOSITES.get(token, (token,)))
        return func(*args, **kwargs)


def token_of(func, args: tuple, kwargs: dict) -> str:
    """The call's token, or "" for a layout call."""
    name = getattr(func, "__name__", "") or str(func)
    if name in LAYOUT:
        return ""
    name = ALIASES.get(name.strip("_"), name.strip("_"))  # __rmul__, mul_: mul
    if name in LAYOUT or not name:
        return ""
    if name in ("max", "min") and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return f"{name}imum"  # torch.max(a, b): elementwise, no reduction
    if name in REDUCTIONS:
        dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], (int, tuple, list)) else None)
        return f"{name}:all" if dim is None or dim == () or dim == [] else name
    if name in GROUPED:
        groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)  # the 7th argument of F.conv* and F.conv_transpose*
        return f"{name}:grouped" if isinstance(groups, int) and groups > 1 else name
    return name


def trace_forward(model_fn, inputs_fn) -> list[str]:
    """The tokens of ``model_fn()(*inputs_fn())``, built on the meta device, else (a value needed) on the CPU.

    Raises what the program raises on the CPU too: a program that cannot run has no trace."""
    try:
        return _trace(model_fn, inputs_fn, "meta")
    except Exception:  # noqa: BLE001 - .item() on meta, an operator without a meta kernel: the real run decides
        return _trace(model_fn, inputs_fn, "cpu")


def _trace(model_fn, inputs_fn, device: str) -> list[str]:
    torch.manual_seed(0)
    with torch.device(device):
        model = model_fn()
        inputs = inputs_fn()
    if hasattr(model, "eval"):
        model = model.eval()
    recorder = _Recorder()
    with torch.no_grad(), recorder:
        model(*inputs)
    return recorder.tokens


def trace_problem(problem) -> list[str]:
    """The tokens of a built problem (tasks/task.py ``Problem``): its Model on its own inputs."""
    return trace_forward(lambda: problem.model_cls(*problem.get_init_inputs()), problem.get_inputs)
