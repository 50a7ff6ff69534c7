"""The metrics sink (JSONL and TensorBoard, resumable), the end-of-run plots, and the progress display."""
from __future__ import annotations

import asyncio
import io
import json
import logging
from types import SimpleNamespace

import pytest

from launch.metrics import METRICS_FILE, TB_DIR, MetricsSink, read_metrics
from launch.plots import PLOTS, milestone_figure, reward_figure, write_plots, y_range
from launch.progress import ProgressDisplay
from protocol.step_record import MILESTONE_RATES, REWARD, STALENESS, TOKENS_PER_S, episode_metrics


def tensorboard_scalars(out_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out_dir / TB_DIR))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


def log_steps(out_dir, steps, offset: float = 0.0, **kwargs) -> None:
    with MetricsSink(out_dir, **kwargs) as sink:
        for step in steps:
            assert sink.log(step, {"reward": {"mean": step + offset}, "loss": 0.5}, stage="rft")


def test_each_step_becomes_one_jsonl_record_and_tensorboard_scalars(tmp_path):
    with MetricsSink(tmp_path) as sink:
        sink.log(1, {"reward": {"mean": 1.5, "min": -1}, "loss": float("nan"), "ok": True, "note": "warm-up"}, stage="rft")
        sink.log(2, {"reward": {"mean": 2.0}})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    first = records[0]
    assert (first["stage"], first["reward/mean"], first["reward/min"], first["loss"], first["ok"], first["note"]) == (
        "rft", 1.5, -1, None, True, "warm-up")  # NaN is null: JSON has no NaN
    assert json.loads((tmp_path / METRICS_FILE).read_text().splitlines()[1])["reward/mean"] == 2.0
    assert tensorboard_scalars(tmp_path, "reward/mean") == [(1, 1.5), (2, 2.0)]
    assert tensorboard_scalars(tmp_path, "ok") == [(1, 1.0)]


def test_resuming_from_a_checkpoint_replaces_the_steps_after_it_in_both_sinks(tmp_path):
    log_steps(tmp_path, range(1, 6))  # the run reached step 5; its last checkpoint is step 3
    log_steps(tmp_path, range(4, 7), offset=100.0, resume_step=3)
    records = read_metrics(tmp_path)
    assert [(r["step"], r["reward/mean"]) for r in records] == [(1, 1), (2, 2), (3, 3), (4, 104), (5, 105), (6, 106)]
    assert tensorboard_scalars(tmp_path, "reward/mean") == [(1, 1), (2, 2), (3, 3), (4, 104), (5, 105), (6, 106)]


def test_reopening_without_a_resume_step_continues_and_skips_steps_already_logged(tmp_path, caplog):
    log_steps(tmp_path, [1, 2])
    with caplog.at_level(logging.WARNING, logger="cuda_agent.metrics"), MetricsSink(tmp_path) as sink:
        assert sink.last_step == 2
        assert not sink.log(2, {"reward": {"mean": 99.0}})
        assert sink.log(3, {"reward": {"mean": 3.0}})
    assert "step 2 is already logged (last 2); skipped" in caplog.text
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 2), (3, 3)]


def test_a_record_torn_by_a_crash_is_dropped_and_the_next_record_stays_readable(tmp_path):
    log_steps(tmp_path, [1], tensorboard=False)
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 2, "reward/me')
    log_steps(tmp_path, [2], tensorboard=False)
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_episode_metrics_gives_the_mean_reward_and_the_rate_of_each_milestone_reached():
    episodes = [SimpleNamespace(reward=r, milestone=m) for r, m in [(-1.0, 0), (1.0, 1), (2.0, 2), (3.0, 3)]]
    m = episode_metrics(episodes)
    assert m[REWARD] == 1.25 and m["reward/min"] == -1.0 and m["reward/max"] == 3.0 and m["episodes"] == 4
    assert [m[k] for k in MILESTONE_RATES.values()] == [0.75, 0.5, 0.25]
    assert episode_metrics([]) == {"episodes": 0}


def test_plots_of_reward_and_milestone_rates_are_written_from_the_jsonl(tmp_path):
    with MetricsSink(tmp_path, tensorboard=False) as sink:
        for step in range(1, 7):
            episodes = [SimpleNamespace(reward=float(step % 3), milestone=step % 4), SimpleNamespace(reward=-1.0, milestone=0)]
            sink.log(step, episode_metrics(episodes), stage="rft" if step < 4 else "agentic_ppo")
    written = write_plots(tmp_path)
    assert written == [tmp_path / PLOTS["reward"], tmp_path / PLOTS["milestones"]]
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, f"{path.name}: not a drawn PNG ({len(data)} bytes)"


def demo_records() -> list[dict]:
    """The CPU demo's metrics: one step of each stage, every episode failed, so every series is flat."""
    flat = {"episodes": 4, REWARD: -1.0, "reward/min": -1.0, "reward/max": -1.0, **{k: 0.0 for k in MILESTONE_RATES.values()}}
    return [{"step": i, "stage": stage, **flat}
            for i, stage in enumerate(("single_turn_ppo", "rft", "value_pretrain", "agentic_ppo"), 1)]


def test_stage_names_are_readable_inside_the_figure_and_apart():
    for fig in (reward_figure(demo_records()), milestone_figure(demo_records())):
        fig.tight_layout()
        renderer = fig.canvas.get_renderer()
        labels = [t for t in fig.axes[0].texts if t.get_text() in ("single turn ppo", "rft", "value pretrain", "agentic ppo")]
        assert len(labels) == 4, [t.get_text() for t in fig.axes[0].texts]
        boxes = [t.get_window_extent(renderer) for t in labels]
        page = fig.bbox
        for label, box in zip(labels, boxes):
            assert label.get_fontsize() >= 9 and label.get_rotation() == 0, (label.get_text(), label.get_fontsize())
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (
                f"{label.get_text()!r} is clipped: {box} outside the figure {page}")
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b), f"stage names overlap: {a} and {b}"


def test_a_flat_reward_keeps_an_axis_at_least_one_reward_unit_tall():
    # matplotlib's own limits for a constant -1 were -1.04..-0.96: a flat line drawn as if it moved.
    lo, hi = reward_figure(demo_records()).axes[0].get_ylim()
    assert hi - lo >= 1.0 and lo < -1.0 < hi, (lo, hi)
    assert y_range([0.5, 2.5]) == pytest.approx((0.3, 2.7)), "a series that moves keeps a 10% margin"


def test_milestone_series_that_coincide_stay_visible_by_their_style():
    lines = [line for line in milestone_figure(demo_records()).axes[0].get_lines() if line.get_label() in MILESTONE_RATES]
    styles = {(line.get_linestyle(), line.get_marker(), line.get_markersize()) for line in lines}
    assert len(lines) == 3 and len(styles) == 3, "three series on top of one another must differ in line, marker and size"
    sizes = sorted(line.get_markersize() for line in lines)
    assert sizes[0] < sizes[1] < sizes[2], "hollow markers of decreasing size show each one under the next"


def test_runs_side_by_side_say_where_each_first_reached_the_threshold(tmp_path):
    from launch.plots import comparison_figure

    def run(rewards, seconds_a_step):
        return [{"step": k + 1, "time": 100.0 + k * seconds_a_step, "reward/mean": r} for k, r in enumerate(rewards)]

    fig = comparison_figure({"fast": run([0.0, 0.5, 1.0, 1.0, 1.0], 2.0), "flat": run([0.0] * 5, 1.0)}, threshold=0.6)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    # The first 3-step mean at 0.6 or more is steps 2-4's (0.83), six seconds after step 1's end.
    assert labels == ["fast (0.6 at step 4, 6 s)", "flat (0.6 not reached)"], labels
    by_time = fig.axes[1].get_lines()[0].get_xdata()
    assert list(by_time) == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_no_plot_is_written_for_metrics_never_logged(tmp_path):
    assert write_plots(tmp_path) == []
    log_steps(tmp_path, [1], tensorboard=False)
    assert write_plots(tmp_path) == [tmp_path / PLOTS["reward"]]  # reward logged, no milestone rates


def test_progress_is_one_plain_log_line_per_step_when_not_on_a_terminal(caplog):
    from rich.console import Console

    display = ProgressDisplay(10, stage="agentic_ppo", console=Console(file=io.StringIO(), force_terminal=False))
    assert not display.live_mode
    metrics = {**episode_metrics([SimpleNamespace(reward=2.0, milestone=2), SimpleNamespace(reward=-1.0, milestone=0)]),
               TOKENS_PER_S: 1234.4, "env": {"queue_depth": 3}, STALENESS: 0.25}
    with caplog.at_level(logging.INFO, logger="cuda_agent.progress"), display:
        display.update(4, metrics)
    assert caplog.messages == [
        "step 4/10 [agentic_ppo] | reward 0.5 | correct 50% eager 50% torch.compile 0% | 1234 tok/s | env queue 3 | staleness 0.25"]


def test_the_learning_checks_progress_line_shows_no_speed_milestones(caplog):
    from rich.console import Console

    display = ProgressDisplay(12, stage="agentic_ppo", console=Console(file=io.StringIO(), force_terminal=False),
                              env_kind="verifier")
    metrics = {**episode_metrics([SimpleNamespace(reward=1.0, milestone=1), SimpleNamespace(reward=-1.0, milestone=0)]),
               TOKENS_PER_S: 99.0, STALENESS: 0.0}
    with caplog.at_level(logging.INFO, logger="cuda_agent.progress"), display:
        display.update(3, metrics)
    assert caplog.messages == ["step 3/12 [agentic_ppo] | reward 0 | correct 50% | 99 tok/s | env queue - | staleness 0.00"]


def test_progress_on_a_terminal_draws_a_live_panel_with_every_figure():
    from rich.console import Console

    out = io.StringIO()
    display = ProgressDisplay(10, stage="rft", console=Console(file=out, force_terminal=True, width=100))
    assert display.live_mode
    with display:
        display.update(3, {REWARD: 1.75, MILESTONE_RATES["correct"]: 0.5, TOKENS_PER_S: 88.0, "env/queue_depth": 2,
                           "buffer/depth": 5, STALENESS: 1.0})
    text = out.getvalue()
    for expected in ("rft: step 3/10", "reward", "1.75", "correct", "50%", "tokens/s", "88", "env queue", "buffer depth",
                     "staleness", "1.00"):
        assert expected in text, f"{expected!r} missing from the live panel:\n{text}"


def test_a_long_wait_off_a_terminal_is_a_line_when_it_begins_and_a_line_with_its_detail_every_heartbeat(caplog):
    # Five minutes passed in silence between Ray's start-up lines and the first step's line.
    from rich.console import Console

    display = ProgressDisplay(4, stage="single_turn_ppo", console=Console(file=io.StringIO(), force_terminal=False),
                              heartbeat_s=0.05, refresh_s=0.01)
    asked = []

    async def detail() -> str:
        asked.append(1)
        return f"{len(asked)} of 4 done, 2 in flight (1 generating, 1 in the environment), {len(asked)} turn(s) so far"

    async def wait() -> None:
        async with display.watched_phase("generating 4 episodes", detail):
            await asyncio.sleep(0.2)

    with caplog.at_level(logging.INFO, logger="cuda_agent.progress"):
        asyncio.run(wait())
    lines = caplog.messages
    assert lines[0] == "step 1/4 [single_turn_ppo]: generating 4 episodes", lines
    beats = lines[1:]
    assert beats and all(line.startswith("step 1/4 [single_turn_ppo]: generating 4 episodes: ") for line in beats), lines
    assert "in flight (1 generating, 1 in the environment)" in beats[-1] and beats[-1].endswith(" s)"), beats
    assert len(asked) >= len(beats), "each heartbeat says what the detail said last"


def test_a_terminal_shows_the_phase_under_way_and_its_detail():
    from rich.console import Console

    out = io.StringIO()
    display = ProgressDisplay(2, stage="rft", console=Console(file=out, force_terminal=True, width=120), refresh_s=0.01)

    async def wait() -> None:
        async def detail() -> str:
            return "1 of 4 done, 3 in flight"

        async with display.watched_phase("generating 4 episodes", detail):
            await asyncio.sleep(0.1)
            display._live.refresh()

    with display:
        asyncio.run(wait())
    text = out.getvalue()
    assert "generating 4 episodes (0 s)" in text and "1 of 4 done, 3 in flight" in text, text


def test_a_skipped_step_says_why_and_claims_no_throughput(caplog):
    # "step 1/1 [rft] | ... | 810382 tok/s" when RFT had nothing to train on: tokens over the time
    # it took to read a batch from the buffer.
    from rich.console import Console

    from actors.batches import skip_reason
    from protocol.step_record import SKIPPED

    display = ProgressDisplay(1, stage="rft", console=Console(file=io.StringIO(), force_terminal=False))
    reason = skip_reason("rft", 4, 0, 1)
    assert reason == "0 of 4 episodes passed RFT's filter (learner.rft), 1 needed (one per learner rank)"
    with caplog.at_level(logging.INFO, logger="cuda_agent.progress"):
        display.update(1, {**episode_metrics([SimpleNamespace(reward=-1.0, milestone=0)] * 4), SKIPPED: reason})
    [line] = caplog.messages
    assert line.startswith(f"step 1/1 [rft] | skipped: {reason} | reward -1 |") and "tok/s" not in line, line


def test_the_training_summary_gives_each_stage_its_episode_weighted_rates_tokens_wall_time_and_the_plots(tmp_path):
    from rich.console import Console

    from launch.report import print_training_summary

    with MetricsSink(tmp_path, tensorboard=False) as sink:
        # rft: 2 episodes at reward 1 (correct), then 6 at -1: the stage's mean weighs by episodes
        sink.log(1, {**episode_metrics([SimpleNamespace(reward=1.0, milestone=1)] * 2), "learner": {"tokens": 100}}, "rft")
        sink.log(2, {**episode_metrics([SimpleNamespace(reward=-1.0, milestone=0)] * 6), "learner": {"tokens": 50}}, "rft")
        sink.log(3, episode_metrics([SimpleNamespace(reward=0.5, milestone=3)]), "agentic_ppo")
    write_plots(tmp_path)
    (tmp_path / "recipe.json").write_text(json.dumps({"policy": "/p/policy", "critic": None, "stage_s": {"rft": 90.0}}))
    console = Console(file=io.StringIO(), width=200)
    print_training_summary(tmp_path, console)
    text = console.file.getvalue()
    rft = next(line for line in text.splitlines() if line.strip().startswith("rft ")).split()
    assert rft == ["rft", "2", "8", "-0.50", "25%", "0%", "0%", "150", "1.5"]
    agentic = next(line for line in text.splitlines() if line.strip().startswith("agentic_ppo")).split()
    assert agentic == ["agentic_ppo", "1", "1", "+0.50", "100%", "100%", "100%", "-", "-"]
    assert "rft reward by step: +1.00 -1.00" in text, "a stage of several steps shows its reward curve"
    assert "agentic_ppo reward by step" not in text, "one step is no curve"
    for expected in (f"plot: {tmp_path / PLOTS['reward']}", f"plot: {tmp_path / PLOTS['milestones']}", "policy: /p/policy"):
        assert expected in text
    console = Console(file=io.StringIO(), width=200)
    print_training_summary(tmp_path, console, env_kind="verifier")  # the learning check pays only "correct"
    text = console.file.getvalue()
    assert ">eager" not in text and ">compile" not in text
    assert next(line for line in text.splitlines() if line.strip().startswith("rft ")).split() == [
        "rft", "2", "8", "-0.50", "25%", "150", "1.5"]
