"""The agent's tools against the real cpp environment (EnvPool on this CPU), and SKILL.md's example.

Evaluations cost 5-15 s each here, so the default tests run few of them: a compile error, a
known-good kernel through verify, the SKILL.md worked example through verify, a submit that
fails fast, and the reference profile. The timed submit of a good kernel is `slow`.
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from env_pool.pool import EnvPool
from protocol.results import EvalResult, Milestone
from protocol.trajectory import ToolCall
from rollout.env_client import EnvClient, LocalEnvClient
from rollout.parser import parse_tool_calls
from rollout.skill import skill_text
from rollout.tool_results import truncate
from rollout.tool_specs import format_tool_prompt
from rollout.toolbox import ToolBox
from rollout.workspace import Workspace
from tasks.loader import load_task_file, load_tasks
from tasks.rules import STRICT
from tasks.task import Task

LEGIT = Path(__file__).parent / "env_corpus" / "legit"
SETTINGS = {"repetitions": 5, "warmup": 1, "run_timeout_s": 60.0, "memory_limit_mb": 4096, "compile_timeout_s": 120.0}

# The task of SKILL.md's worked example; n is not a multiple of 4, so the CUDA tail path runs too.
ADD_RELU = '''"""relu(a + b) elementwise: the task of SKILL.md's worked example."""
import torch
import torch.nn as nn

n = 1048579
PRESETS = {"cpp": {"n": 262147}, "cuda": {"n": 16777219}}


class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b)


def get_inputs():
    return [torch.randn(n), torch.randn(n)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def tasks() -> dict:
    return {t.id: t for t in load_tasks()[0]}


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> EnvPool:
    return EnvPool({**SETTINGS, "work_dir": str(tmp_path_factory.mktemp("env")), "backend": "cpp"})


def toolbox(tmp_path, task, env, backend="cpp", max_chars=4000) -> ToolBox:
    ws = Workspace.create(tmp_path / "workspaces", "ep", task, backend, skill_text(backend))
    return ToolBox(task, ws, env, backend, max_chars)


def run(box: ToolBox, name: str, **arguments):
    return asyncio.run(box.call(ToolCall(name, arguments)))


def write_folder(box: ToolBox, folder: Path) -> None:
    for f in sorted(folder.iterdir()):
        if f.name != "case.json":
            assert run(box, "write_file", path=f.name, content=f.read_text()).valid


def worked_example(backend: str) -> dict[str, str]:
    """The files of SKILL.md's worked example, as the agent would copy them out of the text."""
    text = skill_text(backend)
    files = {}
    for name in ("kernel.cpp" if backend == "cpp" else "kernel.cu", "model_new.py"):
        match = re.search(rf"^`{re.escape(name)}`:\n\n```\w*\n(.*?)^```", text, re.S | re.M)
        assert match, f"SKILL for {backend} has no `{name}` block in its worked example"
        files[name] = match.group(1)
    return files


# ----------------------------------------------------------------------------- no environment needed


@pytest.mark.parametrize("backend", ["cpp", "cuda"])
def test_skill_states_the_rules_in_force_from_the_config(backend):
    strict, paper = skill_text(backend, "strict"), skill_text(backend, "paper")
    assert "{{" not in strict + paper
    assert "atol = rtol = 1e-4" in strict and "1e-2" not in strict and "fallback too" in strict
    assert "atol = rtol = 1e-2" in paper and "cuBLAS for GEMMs" in paper and "Torch stays forbidden" in paper
    assert strict.replace(STRICT.skill_libraries, "").count("cuBLAS for GEMMs") == 0

def test_schemas_are_openai_functions_and_ncu_is_offered_on_cuda_only(tmp_path, tasks):
    cpp = toolbox(tmp_path, tasks["level1/01_gelu"], env=None).schemas()
    names = [s["function"]["name"] for s in cpp]
    assert names == ["list_files", "read_file", "write_file", "profile_reference", "compile", "verify", "profile", "submit"]
    for s in cpp:
        assert s["type"] == "function" and s["function"]["description"]
        assert s["function"]["parameters"]["type"] == "object"
    write = next(s for s in cpp if s["function"]["name"] == "write_file")["function"]["parameters"]
    assert write["required"] == ["path", "content"] and write["properties"]["content"]["type"] == "string"
    cuda = toolbox(tmp_path / "c", tasks["level1/01_gelu"], env=None, backend="cuda").schemas()
    assert "ncu" in [s["function"]["name"] for s in cuda]


def test_tool_prompt_lists_every_tool_and_its_own_call_form_parses(tmp_path, tasks):
    schemas = toolbox(tmp_path, tasks["level1/01_gelu"], env=None).schemas()
    prompt = format_tool_prompt(schemas, "hermes")
    assert all(json.dumps(s) in prompt for s in schemas) and "<tool_call>" in prompt
    example = prompt[prompt.index("<tool_call>\n"):prompt.index("</tool_call>\n") + len("</tool_call>")]
    filled = example.replace("<function-name>", '"verify"').replace("<args-json-object>", "{}")
    assert parse_tool_calls(filled, "hermes").calls == [ToolCall("verify", {})]
    assert "function calling" in format_tool_prompt(schemas, "openai")
    with pytest.raises(ValueError, match="tool_call_format"):
        format_tool_prompt(schemas, "xml")


@pytest.mark.parametrize("name, arguments, expected", [
    ("run_shell", {"cmd": "ls"}, "unknown tool 'run_shell'. The tools are: list_files, read_file"),
    ("read_file", {}, "read_file needs 'path'. Expected: {\"name\": \"read_file\", \"arguments\": {\"path\": \"...\"}}"),
    ("read_file", {"path": 3}, "'path' must be a string, got int"),
    ("read_file", {"path": "reference.py", "start_line": "2"}, "'start_line' must be an integer, got str"),
    ("verify", {"fast": True}, "verify does not take 'fast' (it takes no arguments)"),
    ("write_file", {"path": "kernel.cpp", "text": "x"}, "write_file needs 'content'"),
])
def test_unknown_tools_and_bad_arguments_are_invalid_and_explained(tmp_path, tasks, name, arguments, expected):
    result = run(toolbox(tmp_path, tasks["level1/01_gelu"], env=None), name, **arguments)
    assert not result.valid and result.eval is None and result.reward is None and not result.ends_episode
    assert expected in result.text, result.text
    assert result.summary and "\n" not in result.summary


def test_files_are_listed_read_and_written_and_rules_are_explained(tmp_path, tasks):
    box = toolbox(tmp_path, tasks["level1/01_gelu"], env=None)
    assert run(box, "write_file", path="model_new.py", content="x = 1\n").text == "wrote model_new.py (6 bytes, 1 lines)"
    listing = run(box, "list_files").text
    assert re.search(r"reference.py\s+\d+ bytes  \(read-only\)", listing) and "model_new.py" in listing
    assert run(box, "read_file", path="model_new.py").text == "x = 1\n"
    refused = run(box, "write_file", path="reference.py", content="")
    assert refused.valid and "read-only" in refused.text and "model_new.py" in refused.text
    assert "leaves the workspace" in run(box, "read_file", path="../../etc/passwd").text
    unavailable = run(box, "ncu")
    assert unavailable.valid and "unavailable on the cpp backend" in unavailable.text


def test_long_observations_are_truncated_saying_what_was_cut(tmp_path, tasks):
    task = tasks["level1/01_gelu"]
    box = toolbox(tmp_path, task, env=None, max_chars=200)
    first = run(box, "read_file", path="reference.py")
    assert len(first.text) <= 200 and "not shown; call read_file with start_line=" in first.text
    resume = int(re.search(r"start_line=(\d+)", first.text).group(1))
    lines = task.source.splitlines(keepends=True)
    assert first.text.startswith("".join(lines[:resume - 1]))
    rest = run(box, "read_file", path="reference.py", start_line=resume)
    assert rest.text.startswith(f"[reference.py from line {resume} of {len(lines)}]\n{lines[resume - 1]}")
    assert truncate("a" * 1000, 100) == "a" * 69 + "\n[... 931 more characters cut]"  # 99 characters: within the limit
    assert truncate("short", 100) == "short"


# ----------------------------------------------------------------------------- the real cpp environment

def test_local_client_is_an_env_client(pool):
    assert isinstance(LocalEnvClient(pool), EnvClient)


def test_compile_error_comes_back_short_with_file_and_line(tmp_path, tasks, pool):
    box = toolbox(tmp_path, tasks["level1/01_gelu"], LocalEnvClient(pool))
    broken = "".join(f"extern \"C\" void f{i}(float* y) {{ y[0] = undefined_{i}; }}\n" for i in range(30))
    run(box, "write_file", path="kernel.cpp", content=broken)
    run(box, "write_file", path="model_new.py", content=(LEGIT / "gelu_omp" / "model_new.py").read_text())
    result = run(box, "compile")
    assert result.valid and result.reward is None and result.eval.failure == "compile_error"
    assert result.text.startswith("compile: FAILED (compile_error)")
    assert "kernel.cpp:1:" in result.text and "undefined_0" in result.text and "more errors" in result.text
    assert len(result.text) < 1500, result.text
    assert result.summary.startswith("compile_error:")


def test_known_good_kernel_verifies_correct_through_the_tools(tmp_path, tasks, pool):
    box = toolbox(tmp_path, tasks["level1/01_gelu"], LocalEnvClient(pool))
    write_folder(box, LEGIT / "gelu_omp")
    compiled = run(box, "compile")
    assert compiled.text.startswith("compile: OK"), compiled.text
    result = run(box, "verify")
    assert result.valid and not result.ends_episode
    assert result.eval.milestone == Milestone.CORRECT and result.reward == 1.0, result.text
    assert result.text.startswith("verify: CORRECT") and "5/5 input sets passed" in result.text
    assert result.summary == "CORRECT"


def test_an_evaluation_the_environment_failed_to_run_earns_no_reward(tmp_path):
    # A task without a Model fails in the trusted harness: the environment's fault (infra), not the kernel's.
    broken = Task(id="broken/no_model", level=1, source="x = 1\n")
    env = EnvPool({**SETTINGS, "work_dir": str(tmp_path / "env"), "backend": "cpp", "infra_retries": 0})
    box = toolbox(tmp_path, broken, LocalEnvClient(env))
    assert run(box, "write_file", path="model_new.py", content="class ModelNew:\n    pass\n").valid
    result = run(box, "verify")
    assert result.eval.failure == "infra" and result.reward is None, (result.eval.failure, result.reward, result.text)


def test_skill_worked_example_passes_in_the_cpp_environment(tmp_path, pool):
    (tmp_path / "add_relu.py").write_text(ADD_RELU)
    task = load_task_file(tmp_path / "add_relu.py", base=tmp_path)
    box = toolbox(tmp_path, task, LocalEnvClient(pool))
    for name, text in worked_example("cpp").items():
        assert run(box, "write_file", path=name, content=text).valid
    result = run(box, "verify")
    assert result.eval.milestone == Milestone.CORRECT, result.text


def test_submit_ends_the_episode_with_the_final_evaluation(tmp_path, tasks, pool):
    box = toolbox(tmp_path, tasks["level1/01_gelu"], LocalEnvClient(pool))
    result = run(box, "submit")  # nothing written: the final evaluation fails at once
    assert result.valid and result.ends_episode and isinstance(result.eval, EvalResult)
    assert result.eval.failure == "missing_files" and result.reward == -1.0
    assert result.text.startswith("submitted; final evaluation:\nsubmit: FAILED (missing_files)")


def test_an_unsubmitted_empty_workspace_is_judged_as_the_environment_would_without_it(tmp_path, tasks, pool):
    """An episode that ends without submit and without model_new.py needs no evaluation: the
    local verdict is the environment's (missing_files, FAIL, the failure reward), with no env call."""
    task = tasks["level1/01_gelu"]
    box = toolbox(tmp_path, task, env=None)  # any call to the environment would fail
    assert run(box, "write_file", path="notes.md", content="plan: a GELU kernel").valid
    local = box.unsubmitted_without_solution(-1.0)
    assert local is not None and local.failure == "missing_files"
    assert local.milestone == Milestone.FAIL and local.reward == -1.0 and "model_new.py is missing" in local.message
    env = asyncio.run(LocalEnvClient(pool).evaluate(task, box.workspace.solution_files(), "full"))
    assert (env.failure, env.milestone, env.reward) == (local.failure, local.milestone, local.reward)
    assert EvalResult.from_dict(local.to_dict()) == local
    assert run(box, "write_file", path="model_new.py", content="class ModelNew: pass\n").valid
    assert box.unsubmitted_without_solution(-1.0) is None  # a solution: the real final evaluation judges it


def test_profile_reference_shows_shapes_time_and_top_operators(tmp_path, tasks, pool):
    box = toolbox(tmp_path, tasks["level2/03_gemm_layernorm_gelu"], LocalEnvClient(pool))
    result = run(box, "profile_reference")
    assert result.valid and result.eval is None and result.reward is None
    assert "inputs: float32[256, 512]" in result.text and "eager time:" in result.text
    ops = re.findall(r"^\s+([\d.]+)%\s+[\d.]+\s+[\d.]+\s+(aten::\w+)$", result.text, re.M)
    # the model's three operators lead, in order of self time (which leads is the machine's: on a
    # loaded 2-core CI machine the layer norm once took longer than the GEMM)
    assert {name for _, name in ops[:3]} == {"aten::addmm", "aten::gelu", "aten::native_layer_norm"}, result.text
    assert [float(share) for share, _ in ops] == sorted((float(share) for share, _ in ops), reverse=True)
    assert asyncio.run(pool.profile_reference(box.task)) is pool.reference_profiles.cache[(box.task.id, "cpp")]  # cached


def test_a_hanging_reference_costs_one_profile_not_the_worker(tmp_path):
    (tmp_path / "hang.py").write_text(ADD_RELU.replace("return torch.relu(a + b)", "import time; time.sleep(600)"))
    task = load_task_file(tmp_path / "hang.py", base=tmp_path)
    quick = EnvPool({**SETTINGS, "work_dir": str(tmp_path / "env"), "run_timeout_s": 5.0})
    result = run(toolbox(tmp_path, task, LocalEnvClient(quick)), "profile_reference")
    assert result.valid and "took longer than 5 s" in result.text, result.text
    assert result.summary == "reference profile failed" and not quick.reference_profiles.cache  # not cached


@pytest.mark.slow
def test_known_good_kernel_submitted_reaches_correct_or_better_with_timings(tmp_path, tasks, pool):
    box = toolbox(tmp_path, tasks["level1/01_gelu"], LocalEnvClient(pool))
    write_folder(box, LEGIT / "gelu_omp")
    result = run(box, "submit")
    assert result.ends_episode and result.eval.milestone >= Milestone.CORRECT, result.text
    assert result.reward == result.eval.reward >= 1.0
    assert re.search(r"time: yours [\d.]+ ms, eager [\d.]+ ms \(speedup [\d.]+x\), torch.compile [\d.]+ ms", result.text)


def test_ray_client_spreads_requests_over_workers_and_returns_eval_results(tmp_path, tasks):
    import ray

    from env_pool.pool import EnvWorker
    from rollout.env_client import RayEnvClient

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        workers = [EnvWorker.remote({**SETTINGS, "work_dir": str(tmp_path / f"w{i}")}) for i in range(2)]
        client = RayEnvClient(workers)
        files = {p.name: p.read_text() for p in (LEGIT / "gelu_omp").iterdir() if p.name != "case.json"}

        async def both():
            return await asyncio.gather(*(client.evaluate(tasks["level1/01_gelu"], files, "compile") for _ in range(2)))

        results = asyncio.run(both())
        assert all(isinstance(r, EvalResult) and r.failure is None for r in results)
        assert [ray.get(w.health.remote())["stats"]["evaluated"] for w in workers] == [1, 1]
        assert client.pending == [0, 0]
    finally:
        ray.shutdown()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compiles without a GPU)")
def test_skill_cuda_worked_example_compiles_for_hopper_with_nvcc(tmp_path):
    (tmp_path / "add_relu.py").write_text(ADD_RELU)
    task = load_task_file(tmp_path / "add_relu.py", base=tmp_path)
    cuda_pool = EnvPool({**SETTINGS, "work_dir": str(tmp_path / "env"), "backend": "cuda"})
    box = toolbox(tmp_path, task, LocalEnvClient(cuda_pool), backend="cuda")
    for name, text in worked_example("cuda").items():
        assert run(box, "write_file", path=name, content=text).valid
    result = run(box, "compile")
    assert result.eval.failure is None and result.text.startswith("compile: OK"), result.text


@pytest.mark.gpu
def test_skill_worked_example_passes_in_the_cuda_environment(tmp_path):
    (tmp_path / "add_relu.py").write_text(ADD_RELU)
    task = load_task_file(tmp_path / "add_relu.py", base=tmp_path)
    gpu_pool = EnvPool({**SETTINGS, "work_dir": str(tmp_path / "env"), "backend": "cuda"})
    box = toolbox(tmp_path, task, LocalEnvClient(gpu_pool), backend="cuda")
    for name, text in worked_example("cuda").items():
        assert run(box, "write_file", path=name, content=text).valid
    result = run(box, "profile")
    assert result.eval.milestone >= Milestone.CORRECT, result.text


@pytest.mark.gpu
def test_profile_reference_on_the_gpu_ranks_operators_by_device_time(tmp_path, tasks):
    gpu_pool = EnvPool({**SETTINGS, "work_dir": str(tmp_path / "env"), "backend": "cuda"})
    box = toolbox(tmp_path, tasks["level2/03_gemm_layernorm_gelu"], LocalEnvClient(gpu_pool), backend="cuda")
    result = run(box, "profile_reference")
    assert "eager time:" in result.text and "inputs: float32[" in result.text, result.text
    shares = [float(p) for p in re.findall(r"^\s+([\d.]+)%", result.text, re.M)]
    assert shares and sum(shares) <= 100.5, result.text  # operator rows only: kernels are not counted twice
    assert "aten::" in result.text.split("top operators")[1], result.text
