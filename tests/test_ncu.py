"""env_pool.ncu: the Nsight Compute summary for the agent.

ncu runs on the GPU machines only; its CSV parser is tested here on a sample written by hand
in ncu's documented ``--csv --page details`` format (tests/data/ncu_details_sample.csv: the
preamble lines, one row per metric, thousands separators, units per row, an "n/a" value).
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from env_pool.isolation.sandbox import SandboxLimits, run_sandboxed
from env_pool.ncu import parse_ncu_csv, summarize, unavailable_reason
from env_pool.pool import EnvPool
from tasks.loader import load_tasks

SAMPLE = Path(__file__).parent / "data" / "ncu_details_sample.csv"
CORPUS = Path(__file__).parent / "env_corpus"


@pytest.fixture(scope="module")
def tasks():
    return {t.id: t for t in load_tasks()[0]}


def files_of(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file() and p.name != "case.json"}


def test_parser_reads_every_launch_with_units_converted():
    softmax, matmul = parse_ncu_csv(SAMPLE.read_text())
    assert (softmax.launch, matmul.launch) == (0, 1)
    assert softmax.name.startswith("softmax_rows_kernel") and softmax.block == "(256, 1, 1)" and softmax.grid == "(4096, 1, 1)"
    assert softmax.duration_us == pytest.approx(21.76)
    assert matmul.duration_us == pytest.approx(1210.0)  # "msecond" -> us
    assert (softmax.memory_pct, softmax.dram_pct, softmax.compute_pct) == (87.41, 87.41, 31.12)
    assert softmax.achieved_occupancy_pct == 82.73 and matmul.theoretical_occupancy_pct == 50
    assert (softmax.registers, matmul.registers) == (30, 38)
    assert softmax.shared_bytes == 64  # static 64 B + dynamic 0 B; the driver's reserve is not the kernel's
    assert matmul.shared_bytes == pytest.approx(8190.0)  # 8.19 Kbyte/block


def test_parser_ignores_noise_and_tolerates_extra_columns():
    text = SAMPLE.read_text().replace('"Metric Value"\n', '"Metric Value","Rule Name","Rule Type","Rule Description"\n', 1)
    lines = text.splitlines()
    noisy = "\n".join(lines[:8] + ["app output line", "==PROF== Disconnected"] + lines[8:])
    assert [k.name for k in parse_ncu_csv(noisy)] == [k.name for k in parse_ncu_csv(SAMPLE.read_text())]
    assert parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n") == []


def test_summary_names_each_kernel_and_its_bottleneck():
    text = summarize(parse_ncu_csv(SAMPLE.read_text()), max_kernels=20)
    lines = text.splitlines()
    assert "2 kernel launch(es)" in lines[0] and "1231.8 us" in lines[0]
    row = next(line for line in lines if line.lstrip().startswith("0 ") and "softmax_rows_kernel" in line)
    for cell in ("21.8 us", "83%", "87%", "31%", "30", "64 B", "(256, 1, 1) x (4096, 1, 1)"):
        assert cell in row, f"{cell!r} missing from {row!r}"
    assert "tiled_matmul_kernel<32>" in text and "const float" not in text  # argument lists dropped
    assert "0: 2% of the time, memory-bound: near peak bandwidth" in text
    assert "1: 98% of the time, memory-bound" in text and "theoretical occupancy" not in text.split("1: 98%")[0]
    assert summarize([], 20).startswith("ncu profiled no kernel")


def test_summary_is_capped_at_max_kernels():
    kernels = parse_ncu_csv(SAMPLE.read_text())
    text = summarize(kernels, max_kernels=1)
    assert "tiled_matmul_kernel" not in text and "1 more launches not shown" in text


def test_ncu_is_unavailable_on_a_cpp_worker_and_without_a_gpu(tmp_path, tasks):
    cpp = EnvPool({"work_dir": str(tmp_path)})
    files = files_of(CORPUS / "legit" / "gelu_omp")
    answer = asyncio.run(cpp.ncu(tasks["level1/01_gelu"], files))
    assert answer.startswith("unavailable:") and "backend is cpp" in answer
    cuda = EnvPool({"work_dir": str(tmp_path), "backend": "cuda"})
    if not Path("/dev/nvidia0").exists():
        assert unavailable_reason(cuda.ctx) == "unavailable: no NVIDIA GPU on this machine"


def test_sandbox_loopback_lets_a_run_talk_to_itself_and_nothing_else(tmp_path):
    code = ("import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "socket.create_connection(s.getsockname(), timeout=5); print('loopback ok')\n")
    shut = run_sandboxed([sys.executable, "-c", code], b"", tmp_path, SandboxLimits(wall_s=30))
    assert shut.failure == "crash" and "Network is unreachable" in shut.output
    opened = run_sandboxed([sys.executable, "-c", code], b"", tmp_path, SandboxLimits(wall_s=30, loopback=True))
    assert opened.failure is None and "loopback ok" in opened.output and "loopback" in opened.isolation
    assert "netns" in opened.isolation


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["legit/softmax_warp_cuda", "legit/gelu_cuda"])
def test_ncu_summarises_a_cuda_candidate_on_the_gpu(tmp_path, tasks, case: str):
    folder = CORPUS / case
    meta = json.loads((folder / "case.json").read_text())
    # ncu_admin: the corpus is trusted, and the lent GPU machines restrict counters to admins.
    pool = EnvPool({"work_dir": str(tmp_path), "backend": "cuda", "ncu_admin": True, "ncu_timeout_s": 300.0})
    answer = asyncio.run(pool.ncu(tasks[meta["task"]], files_of(folder)))
    print(answer)
    assert answer.startswith("ncu: "), answer
    kernel = "softmax" if "softmax" in case else "gelu"
    assert kernel in answer and " us " in answer and "%" in answer
