"""The crawl: seed operators from torch.nn, torch.nn.functional, torch and transformers (activations, norms), each with a recipe that runs.

An operator (Op) is code the composer can write into a program: an optional constructor line
(``self.{attr} = nn.LayerNorm({F})``) and a forward expression (``self.{attr}(x)``, ``F.gelu(x)``).
Placeholders name the current tensor's sizes ({F}: last dim, {C}: channels, {L}: sequence) and
sampled hyperparameters ({F_out}, {C_out}, {k}, {g}).

Recipes come two ways:
- probed: a module built with no arguments, or a function called on the tensor alone, that
  returns a float tensor of the input's shape is an elementwise operator (most activations);
- written: operators that need sizes (Linear, LayerNorm, Conv2d, pools, reductions) have a
  recipe in RECIPES below.

Every name crawled gets a verdict; what is excluded is written to the catalogue with why
(no recipe for its arguments, stochastic, fails on a float tensor, a loss, a container...).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYOUTS = {"flat": (8, 64), "seq": (4, 16, 64), "image": (2, 8, 16, 16)}  # probe shapes per layout
STOCHASTIC = ("dropout", "rrelu", "bernoulli", "multinomial", "rand", "normal", "poisson", "gumbel", "alpha_dropout")
NOT_OPERATORS = ("loss", "container", "sequential", "modulelist", "moduledict", "parameterlist", "parameterdict",
                 "identity", "flatten", "unflatten", "module", "lazy", "transformer", "rnn", "lstm", "gru",
                 "embedding", "upsample", "pixel", "fold", "channelshuffle", "zeropad", "constantpad", "reflectionpad",
                 "replicationpad", "circularpad", "multiheadattention", "bilinear")
MODE_DEPENDENT = ("batchnorm", "batch_norm")  # running statistics: the output depends on train or eval mode
# Jumps in the output where the input crosses a threshold (an integer, zero, a shrink's lambda). On a
# computed value one flip moves the result by a whole step: a trunc before a LayerNorm put 2,308 of
# 1.38M values outside tolerance in float64 (issue 36), so a correct kernel that sums in another
# order fails. Composed only as a chain's first operator, on the program's input, whose values a
# kernel and the float64 check see exactly as the reference does.
DISCONTINUOUS = ("sign", "frac", "round", "floor", "ceil", "trunc", "hardshrink", "threshold", "heaviside")
# A pole: 1/x of a computed value near zero is huge or infinite (tanh then reciprocal gave inf on 2
# of 5 input sets, issue 36), and a heavy tail no tolerance tames. Not composed.
SINGULAR = ("reciprocal",)


@dataclass(frozen=True)
class Op:
    """One operator the composer can use."""

    name: str  # "nn.GELU", "F.softplus", "torch.tanh", "transformers.NewGELUActivation"
    origin: str  # torch.nn | torch.nn.functional | torch | transformers
    layouts: tuple[str, ...]  # input layouts it accepts (LAYOUTS)
    call: str  # forward expression of x; {attr} is the module attribute when there is a constructor
    init: str = ""  # constructor expression ("" for functions)
    params: dict[str, list] = field(default_factory=dict)  # sampled hyperparameters: name -> choices
    prelude: str = ""  # source the program needs besides torch (a transformers class, copied)
    weight: float = 1.0  # relative draw probability in the composer
    first_only: bool = False  # discontinuous (DISCONTINUOUS): composed only on the program's input
    imports: str = ""  # import lines the prelude needs ("from torch import Tensor"), written at the program's top


def _r(name, origin, layouts, call, init="", **params) -> Op:
    return Op(name, origin, tuple(layouts), call, init, {k: list(v) for k, v in params.items()})


ALL = ("flat", "seq", "image")
# Operators whose arguments need sizes: the recipe says how to fill them from the current shape.
RECIPES: dict[str, Op] = {op.name: op for op in [
    _r("nn.Linear", "torch.nn", ("flat", "seq"), "self.{attr}(x)", "nn.Linear({F}, {F_out})", F_out=(128, 256, 512, 1024)),
    _r("nn.LayerNorm", "torch.nn", ("flat", "seq"), "self.{attr}(x)", "nn.LayerNorm({F})"),
    _r("nn.RMSNorm", "torch.nn", ("flat", "seq"), "self.{attr}(x)", "nn.RMSNorm({F})"),
    _r("nn.GroupNorm", "torch.nn", ("image",), "self.{attr}(x)", "nn.GroupNorm({g}, {C})", g=(1, 2, 4)),
    _r("nn.InstanceNorm2d", "torch.nn", ("image",), "self.{attr}(x)", "nn.InstanceNorm2d({C}, affine=True)"),
    _r("nn.Conv2d", "torch.nn", ("image",), "self.{attr}(x)", "nn.Conv2d({C}, {C_out}, {k}, padding={k} // 2)",
       C_out=(8, 16, 32), k=(1, 3, 5)),
    _r("nn.ConvTranspose2d", "torch.nn", ("image",), "self.{attr}(x)", "nn.ConvTranspose2d({C}, {C_out}, 3, padding=1)",
       C_out=(8, 16)),
    _r("nn.Conv1d", "torch.nn", ("seq",), "self.{attr}(x)", "nn.Conv1d({L}, {L}, {k}, padding={k} // 2)", k=(3, 5)),
    _r("nn.MaxPool2d", "torch.nn", ("image",), "self.{attr}(x)", "nn.MaxPool2d(2)"),
    _r("nn.AvgPool2d", "torch.nn", ("image",), "self.{attr}(x)", "nn.AvgPool2d(2)"),
    _r("nn.Softmax", "torch.nn", ALL, "self.{attr}(x)", "nn.Softmax(dim=-1)"),
    _r("nn.LogSoftmax", "torch.nn", ALL, "self.{attr}(x)", "nn.LogSoftmax(dim=-1)"),
    _r("nn.Softmin", "torch.nn", ALL, "self.{attr}(x)", "nn.Softmin(dim=-1)"),
    _r("nn.GLU", "torch.nn", ALL, "self.{attr}(x)", "nn.GLU(dim=-1)"),
    _r("nn.PReLU", "torch.nn", ALL, "self.{attr}(x)", "nn.PReLU()"),
    _r("F.softmax", "torch.nn.functional", ALL, "F.softmax(x, dim=-1)"),
    _r("F.log_softmax", "torch.nn.functional", ALL, "F.log_softmax(x, dim=-1)"),
    _r("F.normalize", "torch.nn.functional", ALL, "F.normalize(x, dim=-1)"),
    _r("F.layer_norm", "torch.nn.functional", ("flat", "seq"), "F.layer_norm(x, (x.shape[-1],))"),
    _r("F.leaky_relu", "torch.nn.functional", ALL, "F.leaky_relu(x, {slope})", slope=(0.01, 0.1, 0.2)),
    _r("F.hardtanh", "torch.nn.functional", ALL, "F.hardtanh(x, -{clip}, {clip})", clip=(0.5, 1.0, 2.0)),
    _r("F.max_pool2d", "torch.nn.functional", ("image",), "F.max_pool2d(x, 2)"),
    _r("F.avg_pool2d", "torch.nn.functional", ("image",), "F.avg_pool2d(x, 2)"),
    _r("torch.sum", "torch", ALL, "torch.sum(x, dim=-1, keepdim=True)"),
    _r("torch.mean", "torch", ALL, "torch.mean(x, dim=-1, keepdim=True)"),
    _r("torch.amax", "torch", ALL, "torch.amax(x, dim=-1, keepdim=True)"),
    _r("torch.logsumexp", "torch", ALL, "torch.logsumexp(x, dim=-1, keepdim=True)"),
    _r("torch.cumsum", "torch", ALL, "torch.cumsum(x, dim=-1)"),
    _r("torch.clamp", "torch", ALL, "torch.clamp(x, -{clip}, {clip})", clip=(0.5, 1.0, 3.0)),
    _r("torch.mul_weight", "torch", ALL, "x * self.{attr}", "nn.Parameter(torch.randn({F}))"),
    _r("torch.add_bias", "torch", ALL, "x + self.{attr}", "nn.Parameter(torch.randn({F}))"),
    _r("torch.scale", "torch", ALL, "x * {scale}", scale=(0.5, 2.0, 0.125)),
    _r("torch.matmul_self_t", "torch", ("seq",), "torch.matmul(x, x.transpose(-1, -2)) / x.shape[-1] ** 0.5"),
    _r("torch.residual_tanh", "torch", ALL, "x + torch.tanh(x)"),
]}
# transformers' norms (its activations come from ACT2CLS); Qwen2's and Mistral's are Llama's under other names.
TRANSFORMERS_NORMS = (("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
                      ("transformers.models.t5.modeling_t5", "T5LayerNorm"),
                      ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"))
# Elementwise torch functions tried by probing (domain-safe on any real input).
TORCH_UNARY = ("tanh", "sigmoid", "abs", "sin", "cos", "erf", "exp", "neg", "square", "atan", "sign", "frac", "round",
               "floor", "ceil", "trunc", "log1p", "sqrt", "rsqrt", "log", "reciprocal", "expm1", "sinh", "cosh", "asinh")


def crawl() -> tuple[list[Op], list[dict]]:
    """(usable operators, excluded names with why) from every source installed here."""
    ops, excluded = [], []
    for origin, names in _candidates():
        for name, obj in names:
            op, why = _probe(origin, name, obj)
            if op is not None:
                ops.append(op)
            else:
                excluded.append({"name": name, "origin": origin, "why": why})
    return ops, excluded


def _candidates():
    yield "torch.nn", [(f"nn.{n}", getattr(nn, n)) for n in sorted(dir(nn))
                       if isinstance(getattr(nn, n), type) and issubclass(getattr(nn, n), nn.Module)]
    yield "torch.nn.functional", [(f"F.{n}", getattr(F, n)) for n in sorted(dir(F))
                                  if not n.startswith("_") and inspect.isroutine(getattr(F, n))]
    yield "torch", [(f"torch.{n}", getattr(torch, n)) for n in TORCH_UNARY]
    yield "torch", [(name, None) for name in RECIPES if name.startswith("torch.") and name[6:] not in TORCH_UNARY]
    try:
        from transformers.activations import ACT2CLS
    except Exception:  # transformers absent or changed: its operators are simply not crawled
        return
    classes = {cls.__name__: cls for cls in (c[0] if isinstance(c, tuple) else c for c in ACT2CLS.values())}
    for module, name in TRANSFORMERS_NORMS:
        try:
            classes[name] = getattr(importlib.import_module(module), name)
        except Exception:  # a transformers release without it: not crawled
            continue
    yield "transformers", [(f"transformers.{n}", cls) for n, cls in sorted(classes.items())]


def _probe(origin: str, name: str, obj) -> tuple[Op | None, str]:
    lowered = name.lower()
    if any(word in lowered.split(".")[-1] for word in STOCHASTIC):
        return None, "stochastic: its output is random"
    if name.endswith("_") and not name.endswith("__"):
        return None, "in place: it would change the program's input (the environment rejects input mutation)"
    if any(word in lowered for word in MODE_DEPENDENT):
        return None, "its output depends on train or eval mode (running statistics)"
    if lowered.split(".")[-1] in SINGULAR:
        return None, "a pole at zero: on computed values its output is infinite or heavy-tailed beyond any tolerance"
    if name in RECIPES:
        return _checked(RECIPES[name])
    if any(word in lowered.split(".")[-1] for word in NOT_OPERATORS):
        return None, "not a tensor-to-tensor operator this composer writes (a loss, container, embedding, reshaping or recurrent layer)"
    if origin == "transformers":
        return _transformers_op(name, obj)
    short = name.split(".", 1)[1]
    if origin == "torch.nn":
        try:
            obj()
        except Exception as err:
            return None, f"no recipe for its constructor's arguments ({type(err).__name__}: {str(err)[:80]})"
        op = Op(name, origin, ALL, "self.{attr}(x)", f"nn.{short}()")
    else:
        op = Op(name, origin, ALL, f"{'F' if origin.endswith('functional') else 'torch'}.{short}(x)")
    return _checked(op, elementwise=True)


def _transformers_op(name: str, cls) -> tuple[Op | None, str]:
    if not cls.__module__.startswith("transformers"):
        return None, f"torch's own {cls.__module__}.{cls.__name__} (crawled from torch)"
    try:  # copied without decorators (a hub-kernel hook): the program is self-contained
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError) as err:
        return None, f"its source cannot be copied into a program ({err})"
    tree.body[0].decorator_list = []
    source = ast.unparse(tree)
    imports = _imports_for(source, cls)
    short = name.split(".", 1)[1]
    sized = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
             if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    if sized:  # a norm: its one size is the last dimension's
        return _checked(Op(name, "transformers", ("flat", "seq"), "self.{attr}(x)", f"{short}({{F}})", prelude=source,
                           imports=imports), elementwise=True)
    return _checked(Op(name, "transformers", ALL, "self.{attr}(x)", f"{short}()", prelude=source, imports=imports),
                    elementwise=True)


def _imports_for(source: str, cls) -> str:
    """Import lines for the names the copied class takes from torch through its module (``Tensor`` in an annotation).

    A generated file must run on its own (``python task.py``): the annotation ``input: Tensor`` is
    evaluated when the class is defined, and transformers imports ``Tensor`` where we copied nothing."""
    module = importlib.import_module(cls.__module__)
    used = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    names = sorted(n for n in used if n not in PROGRAM_SCOPE and getattr(torch, n, None) is not None
                   and getattr(module, n, None) is getattr(torch, n))
    return "".join(f"from torch import {n}\n" for n in names)


def _checked(op: Op, elementwise: bool = False) -> tuple[Op | None, str]:
    """The op run on each layout's probe tensor; the layouts where it works (twice alike, finite) are kept."""
    kept = []
    why = "fails on every layout"
    for layout in op.layouts:
        x = torch.randn(*LAYOUTS[layout])
        try:
            first, second = (run_op(op, x, {k: v[0] for k, v in op.params.items()}, seed) for seed in (0, 1))
        except Exception as err:
            why = f"fails on a float tensor ({type(err).__name__}: {str(err)[:80]})"
            continue
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            why = "does not return a float tensor"
            continue
        if first.shape == x.shape and torch.equal(first, x):
            why = "the identity: returns its input"
            continue
        if elementwise and first.shape != x.shape:
            why = "changes the shape and has no recipe for it"
            continue
        if first.shape == second.shape and not torch.equal(first, second) and not op.init:
            why = "stochastic: the same input gave different outputs"
            continue
        kept.append(layout)
    if not kept:
        return None, why
    first_only = op.name.lower().split(".")[-1] in DISCONTINUOUS
    return Op(op.name, op.origin, tuple(kept), op.call, op.init, op.params, op.prelude, op.weight, first_only, op.imports), ""


def fill(template: str, x_shape: tuple[int, ...], params: dict) -> str:
    sizes = {"F": x_shape[-1], "C": x_shape[1] if len(x_shape) > 1 else x_shape[-1], "L": x_shape[1] if len(x_shape) > 2 else 1}
    return template.format(**sizes, **params, attr="{attr}")


PROGRAM_SCOPE = ("torch", "nn", "F", "math")  # what every generated program imports


def run_op(op: Op, x: torch.Tensor, params: dict, seed: int = 0) -> torch.Tensor:
    """The op applied to ``x`` as the generated program would apply it (its module built from ``seed``)."""
    scope = {"torch": torch, "nn": nn, "F": F, "math": __import__("math")}
    if op.prelude:  # compiled as the program will be: without this file's `from __future__ import annotations`
        exec(compile(op.imports + op.prelude, f"<{op.name}>", "exec", dont_inherit=True), scope)
    holder = nn.Module()
    if op.init:
        torch.manual_seed(seed)
        setattr(holder, "op", eval(fill(op.init, tuple(x.shape), params), scope))
    with torch.no_grad():
        return eval(fill(op.call, tuple(x.shape), params).replace("{attr}", "op"), {**scope, "self": holder, "x": x})


CATEGORIES = (  # (category, words in an operator's name), the first that matches; the report's breakdown
    ("convolution", ("conv",)), ("pooling", ("pool",)), ("normalization", ("norm",)),
    ("softmax", ("softmax", "softmin", "logsumexp", "glu")), ("matmul", ("linear", "matmul")),
    ("reduction", ("sum", "mean", "amax", "cumsum")),
    ("pointwise math", ("torch.",)),
)


def category(name: str) -> str:
    """The kind of operator ``name`` is (convolution, normalization, ..., activation), for the quality report."""
    lowered = name.lower()
    for kind, words in CATEGORIES:
        if any(word.lower() in lowered for word in words):
            return kind
    return "activation"


def write_catalogue(path: Path, ops: list[Op], excluded: list[dict]) -> None:
    """The crawl's record: every operator kept (with its recipe) and every name excluded, with why."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [{k: v for k, v in asdict(op).items() if k != "prelude"} for op in ops]
    path.write_text(json.dumps({"torch": torch.__version__, "kept": kept, "excluded": excluded}, indent=1))
