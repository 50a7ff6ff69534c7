"""The filters a composed program passes before it is a task, each naming why it rejects one.

Static (no code run): it parses, defines the entry points, and calls nothing stochastic.
Dynamic (tasks/screen.py): it runs in eager and under torch.compile, agrees with itself, has
finite outputs that its own inputs tell from zeros, a constant and an input returned unchanged
(tasks/discriminate.py, the harness's rule), depends on its inputs, and its eager time lies in
the backend's window.
"""
from __future__ import annotations

import ast

from tasks.screen import screen_task
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


def dynamic_problem(task: Task, backend: str, window_ms: tuple[float, float], try_compile: bool) -> tuple[str, float | None]:
    """(why the program fails as a benchmark, or empty; its eager time in ms)."""
    result = screen_task(task, backend=backend, window_ms=window_ms, try_compile=try_compile, transforms=False)
    return "; ".join(result.problems), result.eager_ms
