"""The filters a composed program passes before it is a task, each naming why it rejects one.

Static (no code run): it parses, defines the entry points, and calls nothing stochastic.
Dynamic (tasks/screen.py): it runs on its own as ``python task.py`` would, in eager and under
torch.compile, agrees with itself, has outputs that are finite on several fresh input sets and
that those sets tell from zeros, a constant and an input returned unchanged (tasks/discriminate.py,
the harness's rule), takes more than a handful of distinct values, agrees with its own float64
twin and with torch.compile on each set, depends on its inputs, and its eager time lies in the
backend's window.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from tasks.screen import ScreenResult, screen_task
from tasks.task import Task

STOCHASTIC_NAMES = ("dropout", "rrelu", "bernoulli", "multinomial", "rand", "randn", "randint", "randperm", "normal_",
                    "uniform_", "poisson", "gumbel", "exponential_", "geometric_", "cauchy_", "log_normal_")
ENTRY_POINTS = ("Model", "get_inputs", "get_init_inputs")


def static_problem(source: str) -> str:
    """Why the program fails before it runs; empty when it does not."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return f"does not parse: {err}"
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    missing = [name for name in ENTRY_POINTS if name not in defined]
    if missing:
        return f"does not define {', '.join(missing)}"
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        return "Model has no forward"
    for node in ast.walk(forward):  # random weights in __init__ are seeded; randomness in forward is not
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if name.lower() in STOCHASTIC_NAMES or "dropout" in name.lower():
            return f"stochastic: Model calls {name}"
    return ""


@dataclass(frozen=True)
class Demands:
    """What the dynamic filters ask of a synthesised task beyond running (configs/schema.py SynthConfig)."""

    input_sets: int = 5  # fresh sets of the task's own inputs every output check runs on (the verifier's 5)
    stable: bool = True  # the reference agrees with its float64 twin (and torch.compile) on each set
    min_distinct: float = 0.05  # the lowest share of distinct values an output may take on a set
    min_spread: float = 10.0  # the fewest tolerance widths the middle 98% of an output's values may span on a set


def dynamic_problem(task: Task, backend: str, window_ms: tuple[float, float], try_compile: bool,
                    demands: Demands = Demands()) -> ScreenResult:
    """Every way the program fails as a benchmark (``.problems``, each under its filter in ``.filters``), and its eager time."""
    why = standalone_problem(task.source)
    if why:
        result = ScreenResult(task.id, backend)
        result.fail("standalone", why)
        return result
    return screen_task(task, backend=backend, window_ms=window_ms, try_compile=try_compile, transforms=False,
                       input_sets=demands.input_sets, stable=demands.stable, min_distinct=demands.min_distinct,
                       min_spread=demands.min_spread)


def standalone_problem(source: str) -> str:
    """Why the file would not load as ``python task.py`` (its module run, Model built, get_inputs called); empty if it does.

    Compiled without the flags of the code that loads it: the project's loader compiles under
    ``from __future__ import annotations``, which hid a copied ``input: Tensor`` annotation whose
    ``Tensor`` was never imported (issue 36). The forward pass is the eager filter's to run next
    (the future flag changes annotations only, never what forward computes)."""
    scope: dict = {"__name__": "synth_standalone"}
    try:
        exec(compile(source, "task.py", "exec", dont_inherit=True), scope)
        scope["Model"](*scope["get_init_inputs"]())
        if isinstance(scope.get("batch_size"), int):  # one sample shows that it runs; its size is the screen's business
            scope["batch_size"] = 1
        scope["get_inputs"]()
    except Exception as err:  # noqa: BLE001 - whatever stops it is the reason
        return f"does not run on its own (python task.py): {type(err).__name__}: {str(err)[:200]}"
    return ""
