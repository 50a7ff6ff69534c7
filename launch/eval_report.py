"""The evaluation report: numbers from a sweep's JSONL files, as markdown, one self-contained HTML
page (plots embedded as base64 PNG) and summary.json.

How each number is counted, and why (the report states these too):

- Rates are per episode, averaged over a group's episodes: with N samples per problem that is
  the expected rate of one sample, not best-of-N (which pass@k reports separately, with the
  unbiased estimator of Chen et al. 2021). With one sample per problem it is per problem.
- fast_p (KernelBench): the share of episodes whose solution is correct and more than p times
  faster than the baseline. fast_1 against torch.compile is the raw ratio; "> compile (env)" is
  the environment's milestone 3, which also clears reward.compile_margin and the timing noise.
- max-autotune figures come from re-timing every correct solution against torch.compile's
  max-autotune mode on a fresh env worker (eval.max_autotune); without that pass they are
  reported as not measured, never guessed.
- Geometric-mean speedups are given two ways: over correct episodes only, and over all
  episodes with a failure counted as 1.0x (a user who gets no working kernel keeps the baseline).
- The audit (eval.audit) re-evaluates every distinct solution counted faster with more input
  sets, adversarial inputs and a fresh env worker; a solution holds when it reaches the same
  milestone again.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from launch.sweep_records import AUDIT, AUTOTUNE, RESULTS, SWEEP, latest_records
from protocol.records import read_records
from tasks.loader import numbered
from tasks.rules import rules_named
from tasks.solution import read_solution

# The CUDA Agent paper's KernelBench results against torch.compile, and what they were measured on.
PAPER = {"pass": {"overall": 0.988}, "faster_compile": {"overall": 0.968, "level 1": 0.97, "level 2": 1.00, "level 3": 0.90},
         "geomean_compile": {"overall": 2.11}}
PAPER_CONDITIONS = ("KernelBench levels 1-3, CUDA kernels written by the paper's trained agent (up to 200 turns), "
                    "timed on an NVIDIA H100 against torch.compile on the same GPU")
P_GRID = [round(0.05 * i, 2) for i in range(61)]  # fast_p for p in [0, 3]
# A timing whose interquartile range is this share of its median or more (a busy machine) gives a
# speedup uncertain by about as much: the report marks it instead of printing it as a plain ratio.
NOISY = 0.2


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _correct(r: dict[str, Any]) -> bool:
    return r["milestone"] >= 1


def _noisy(r: dict[str, Any]) -> bool:
    return r.get("noise") is not None and r["noise"] >= NOISY


def problem_name(task_id: str, level: int) -> str:
    """A problem as KernelBench names it, its level included (a task set loaded from a level's
    own folder has ids without it: 01_gelu is level1/01_gelu)."""
    return task_id if "/" in task_id or not level else f"level{level}/{task_id}"


def fast_p(records: list[dict[str, Any]], key: str, p: float) -> float | None:
    if not records:
        return None
    return sum(_correct(r) and (r.get(key) or 0.0) > p for r in records) / len(records)


def group_of(level: int) -> str:
    return f"level {level}" if level else "other"


def summarize(records: list[dict[str, Any]], audits: list[dict[str, Any]], autotune: list[dict[str, Any]],
              pass_ks: list[int], max_autotune_on: bool) -> dict[str, Any]:
    tuned = {a["solution_hash"]: a for a in autotune}
    audit_of = {a["solution_hash"]: a for a in audits}
    for r in records:  # the max-autotune speedup of the episode's solution, where it was re-timed
        a = tuned.get(r.get("solution_hash"))
        r["speedup_max_autotune"] = a["speedup_compile"] if a and a["milestone"] >= 1 else None
        r["noise_max_autotune"] = a.get("noise") if a and a["milestone"] >= 1 else None  # its own timings' noise
    groups: dict[str, list[dict[str, Any]]] = {"overall": records}
    for r in sorted(records, key=lambda r: r["level"]):
        groups.setdefault(group_of(r["level"]), []).append(r)
    summary: dict[str, Any] = {"groups": {}, "paper": PAPER}
    for name, rs in groups.items():
        by_task: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            by_task.setdefault(r["task_id"], []).append(r)
        samples = min(len(v) for v in by_task.values())
        correct = [r for r in rs if _correct(r)]
        audits = [audit_of[h] for h in {r["solution_hash"] for r in rs if r.get("solution_hash") in audit_of}]
        audited = [a for a in audits if a["failure"] != "infra"]  # the environment failed, not the solution
        g = {
            "problems": len(by_task), "episodes": len(rs), "samples_per_problem": samples,
            "pass": len(correct) / len(rs),
            "pass_any_sample": sum(any(_correct(r) for r in v) for v in by_task.values()) / len(by_task),
            "fast1_eager": fast_p(rs, "speedup_eager", 1.0),
            "fast1_compile": fast_p(rs, "speedup_compile", 1.0),
            "faster_compile_env": sum(r["milestone"] >= 3 for r in rs) / len(rs),
            "fast1_max_autotune": fast_p(rs, "speedup_max_autotune", 1.0) if max_autotune_on and autotune else None,
            "fast_p": {key: [fast_p(rs, key, p) for p in P_GRID]
                       for key in ("speedup_eager", "speedup_compile", "speedup_max_autotune")
                       if key != "speedup_max_autotune" or (max_autotune_on and autotune)},
            "geomean_compile_correct": geomean([r["speedup_compile"] for r in correct if r.get("speedup_compile")]),
            "geomean_compile_all": geomean([(r.get("speedup_compile") or 1.0) if _correct(r) else 1.0 for r in rs]),
            "geomean_eager_correct": geomean([r["speedup_eager"] for r in correct if r.get("speedup_eager")]),
            "geomean_eager_all": geomean([(r.get("speedup_eager") or 1.0) if _correct(r) else 1.0 for r in rs]),
            "pass_at_k": {k: sum(pass_at_k(len(v), sum(map(_correct, v)), k) for v in by_task.values()) / len(by_task)
                          for k in pass_ks if k <= samples},
            "turns_mean": sum(r["turns"] for r in rs) / len(rs),
            "turns_max": max(r["turns"] for r in rs),
            "generated_tokens_mean": sum(r["generated_tokens"] for r in rs) / len(rs),
            "generated_tokens_total": sum(r["generated_tokens"] for r in rs),
            "scored_solutions": all(r["stop_reason"] == "solution" for r in rs),  # --solutions: no policy, no turns
            "timed": sum(r.get("noise") is not None for r in correct),
            "noisy": sum(_noisy(r) for r in correct),
            "failures": dict(Counter(r["failure"] or "none" for r in rs if not _correct(r))),
            "stop_reasons": dict(Counter(r["stop_reason"] for r in rs)),
            "guard_violations": dict(Counter(v["guard"] for r in rs for v in r.get("violations", []))),
            "audited": len(audited), "audit_held": sum(a["held"] for a in audited),
            "audit_failures": dict(Counter(a["failure"] or "slower" for a in audited if not a["held"])),
            "audit_infra": len(audits) - len(audited),
        }
        summary["groups"][name] = g
    summary["problems"] = problem_rows(records, audit_of)
    return summary


def problem_rows(records: list[dict[str, Any]], audit_of: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per problem: its samples and its best solution (highest milestone, then speedup vs compile)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_task.setdefault(r["task_id"], []).append(r)
    rows = []
    for task_id in sorted(by_task, key=lambda t: (by_task[t][0]["level"], *numbered(t))):
        rs = by_task[task_id]
        best = max(rs, key=lambda r: (r["milestone"], r.get("speedup_compile") or 0.0))
        audit = audit_of.get(best.get("solution_hash"))
        rows.append({"task_id": task_id, "problem": problem_name(task_id, rs[0]["level"]), "level": rs[0]["level"],
                     "samples": len(rs), "passed": sum(map(_correct, rs)), "noise": best.get("noise"),
                     "best_milestone": best["milestone"], "failure": best["failure"], "message": best["message"],
                     "speedup_eager": best.get("speedup_eager"), "speedup_compile": best.get("speedup_compile"),
                     "interval_eager": best.get("interval_eager"), "interval_compile": best.get("interval_compile"),
                     "speedup_max_autotune": best.get("speedup_max_autotune"),
                     "noise_max_autotune": best.get("noise_max_autotune"), "turns": best["turns"],
                     "audit": None if audit is None else ("held" if audit["held"] else "not run (infra)" if audit["failure"] == "infra"
                                                          else f"failed ({audit['failure'] or 'slower'})"),
                     "solution": best.get("solution")})
    return rows


# --------------------------------------------------------------------------- rendering

MILESTONES = ["fail", "correct", "> eager", "> compile"]
COUNTING = [
    "Rates are per episode, averaged over each group's episodes (the expected rate of one sample; "
    "best-of-N is what pass@k shows).",
    "fast_p: correct and more than p times faster than the baseline (KernelBench's metric); fast_1 is the raw ratio > 1. "
    "'> compile (env)' is the environment's milestone 3: faster than torch.compile by more than env.reward.compile_margin "
    "and the timings' noise.",
    "Geomean speedups: 'correct only' is over correct episodes; 'failures as 1x' is over all episodes, a failed one "
    "counted as 1.0x (the user keeps the baseline).",
    "max-autotune: every correct solution is timed again against torch.compile mode max-autotune on a fresh env worker; "
    "one whose re-timing failed counts as not faster.",
    "Speedups are of this environment's own baselines, timed by the same trusted harness and protocol as the candidate.",
    "A per-problem speedup's [low-high] is its bootstrap interval over the timed rounds (the ratio of medians) at "
    "env.reward.confidence, widened by how far the machine's speed moved within either timing's rounds (the medians "
    "of their first, middle and last thirds); a speed milestone needs its low end to clear the margin, so a ratio above 1x whose "
    "interval reaches below it is not counted faster by the environment.",
    f"A speedup marked 'noisy' comes from timings whose interquartile range is {NOISY:.0%} of their median or more "
    "(the per-problem 'noise' column: the largest of the candidate's and the baselines' IQR over median, usually a "
    "machine busy with other work); it may be off by about that much: time it again on an idle machine.",
]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _x(x: float | None, noisy: bool = False, interval: list[float] | None = None) -> str:
    """A speedup, with its bootstrap interval where the sweep measured one."""
    if x is None:
        return "n/a"
    within = f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else ""
    return f"{x:.2f}x{within}" + (" (noisy)" if noisy else "")


def _scored_solutions(summary: dict[str, Any]) -> bool:
    """A --solutions sweep: no policy ran, so turns, tokens and the turn budget mean nothing."""
    return all(g.get("scored_solutions") for g in summary["groups"].values())


def shown_groups(summary: dict[str, Any]) -> list[str]:
    """The groups a table or plot shows: with one level, "overall" is the same numbers again."""
    names = list(summary["groups"])
    return names[1:] if len(names) == 2 else names


def headline_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    groups = summary["groups"]
    names = shown_groups(summary)
    scored = _scored_solutions(summary)
    several = max(groups[n]["samples_per_problem"] for n in names) > 1  # with one sample, "any sample" and pass@1 are the pass rate
    rows = [["problems / solutions" if scored else "problems / episodes"]
            + [f"{groups[n]['problems']} / {groups[n]['episodes']}" for n in names],
            ["pass rate"] + [_pct(groups[n]["pass"]) for n in names]]
    if several:
        rows.append(["pass (any sample)"] + [_pct(groups[n]["pass_any_sample"]) for n in names])
    rows += [
        ["fast_1 vs eager"] + [_pct(groups[n]["fast1_eager"]) for n in names],
        ["fast_1 vs torch.compile (default)"] + [_pct(groups[n]["fast1_compile"]) for n in names],
        ["> compile (env milestone 3)"] + [_pct(groups[n]["faster_compile_env"]) for n in names],
        ["fast_1 vs torch.compile (max-autotune)"] + [_pct(groups[n]["fast1_max_autotune"]) if groups[n]["fast1_max_autotune"] is not None
                                                      else "not measured" for n in names],
        ["geomean vs compile, correct only"] + [_x(groups[n]["geomean_compile_correct"]) for n in names],
        ["geomean vs compile, failures as 1x"] + [_x(groups[n]["geomean_compile_all"]) for n in names],
        ["geomean vs eager, correct only"] + [_x(groups[n]["geomean_eager_correct"]) for n in names],
        ["geomean vs eager, failures as 1x"] + [_x(groups[n]["geomean_eager_all"]) for n in names],
    ]
    if any(groups[n].get("timed") for n in names):
        rows.append([f"correct with noisy timings (IQR >= {NOISY:.0%} of median)"]
                    + [f"{groups[n].get('noisy', 0)} of {groups[n].get('timed', 0)}" for n in names])
    if several:
        ks = sorted({k for n in names for k in groups[n]["pass_at_k"]})
        rows += [[f"pass@{k}"] + [_pct(groups[n]["pass_at_k"].get(k)) for n in names] for k in ks]
    if not scored:
        rows += [
            ["turns: mean / max"] + [f"{groups[n]['turns_mean']:.1f} / {groups[n]['turns_max']}" for n in names],
            ["generated tokens: mean / total"] + [f"{groups[n]['generated_tokens_mean']:.0f} / {groups[n]['generated_tokens_total']}"
                                                  for n in names],
        ]
    rows.append(["audit: held / audited"] + [f"{groups[n]['audit_held']} / {groups[n]['audited']}" for n in names])
    return ["", *names], rows


def comparable_with_paper(identity: dict[str, Any]) -> bool:
    """The paper's numbers are of CUDA kernels on a GPU: a CPU (cpp) sweep measures something else."""
    return identity["backend"] == "cuda"


def rules_line(identity: dict[str, Any]) -> str:
    """The rule set a sweep was judged under, and what it means (a sweep from before rule sets: strict)."""
    rules = rules_named(identity.get("rules", "strict"))
    confidence = identity.get("confidence")
    timing = {"in_turn": "; baselines timed in turn with each candidate",
              "cached": "; baselines timed once per task, apart from the candidates"}.get(identity.get("baseline_timing"), "")
    return (f"rules {rules.name}: {rules.summary}"
            + (f"; speed milestones at {confidence:.0%} confidence" if confidence else "") + timing)


def sweep_conditions(summary: dict[str, Any], identity: dict[str, Any]) -> str:
    """What this sweep's numbers were measured on, in the terms the paper's are given."""
    o = summary["groups"]["overall"]
    levels = sorted({p["level"] for p in summary["problems"] if p["level"]})
    where = ", ".join(identity.get("machines") or []) or "a machine the sweep did not record"
    kernels = "CUDA kernels" if identity["backend"] == "cuda" else "C++ kernels (backend cpp)"
    who = ("from existing solutions (no policy)" if _scored_solutions(summary)
           else f"written by {identity['policy']} (up to {identity['max_turns']} turns)")
    return (f"{o['problems']} problem(s)" + (f" of level {', '.join(map(str, levels))}" if levels else "")
            + f", {kernels} {who}, timed on {where} against eager PyTorch and torch.compile (mode "
            f"{identity['compile_mode']}) on the same device, under the {identity.get('rules', 'strict')} rules")


def paper_note(identity: dict[str, Any]) -> str:
    if comparable_with_paper(identity) and identity.get("rules", "strict") == "paper":
        return ("Comparable where the problems and the GPU match: the paper's rates are over all of KernelBench's "
                "levels 1-3 on an H100; ours over the problems above, on the device named, under the paper's rules.")
    if comparable_with_paper(identity):
        return ("Stricter than the paper's game: the paper checked outputs within 1e-2 and let kernels call cuBLAS and "
                "cuDNN; this sweep checked within 1e-4 with no library computing (the strict rules), so fewer "
                "kernels count as correct than the paper's rules would count. Evaluate with env.rules=paper to compare like with like.")
    return ("Not comparable: the paper's kernels ran on an H100 GPU against GPU baselines; these ran on a CPU "
            "against CPU baselines, where a speedup measures something else. The paper's numbers are listed for "
            "reference only.")


def paper_rows(summary: dict[str, Any]) -> list[list[str]]:
    groups, rows = summary["groups"], []
    for label, key, ours_key, fmt in (("pass rate", "pass", "pass", _pct),
                                      ("faster than torch.compile", "faster_compile", "fast1_compile", _pct),
                                      ("geomean speedup vs torch.compile", "geomean_compile", "geomean_compile_all", _x)):
        for group, value in PAPER[key].items():
            ours = groups.get(group, {}).get(ours_key)
            rows.append([f"{label} ({group})", fmt(value), fmt(ours) if group in groups else "not in this sweep"])
    return rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def problem_table(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    scored = _scored_solutions(summary)
    header = ["problem", "passed", "best", "vs eager", "vs compile", "vs max-autotune", "noise",
              *([] if scored else ["turns"]), "audit", "best solution"]
    rows = []
    for p in summary["problems"]:
        noisy = p.get("noise") is not None and p["noise"] >= NOISY and p["best_milestone"] >= 1
        rows.append([p.get("problem", p["task_id"]), f"{p['passed']}/{p['samples']}",
                     MILESTONES[p["best_milestone"]] + (f" ({p['failure']})" if p["failure"] else ""),
                     _x(p["speedup_eager"], noisy, p.get("interval_eager")),
                     _x(p["speedup_compile"], noisy, p.get("interval_compile")),
                     _x(p["speedup_max_autotune"], (p.get("noise_max_autotune") or 0.0) >= NOISY),
                     "-" if p.get("noise") is None else f"{100 * p['noise']:.0f}%",
                     *([] if scored else [str(p["turns"])]), p["audit"] or "-", p["solution"] or "-"])
    return header, rows


def detail_lines(summary: dict[str, Any], max_autotune_on: bool) -> list[str]:
    o = summary["groups"]["overall"]
    scored = _scored_solutions(summary)
    lines = [f"Failure kinds (failed {'solutions' if scored else 'episodes'}): {_counts(o['failures'])}"]
    if not scored:
        lines.append(f"Why episodes ended: {_counts(o['stop_reasons'])}")
    lines += [f"Guard violations: {_counts(o['guard_violations'])}",
              f"Environment (infra) failures: {o['failures'].get('infra', 0)}, counted as failures above; "
              "rerun the same command to retry them",
              f"Audit (solutions at eval.audit_min_milestone or above): {o['audit_held']} of {o['audited']} held"
              + (f"; failed: {_counts(o['audit_failures'])}" if o["audit_failures"] else "")
              + (f"; {o['audit_infra']} could not be audited (infra): rerun to retry" if o["audit_infra"] else "")]
    if o.get("noisy"):
        lines.append(f"Noisy timings: {o['noisy']} of the {o['timed']} correct solutions have an interquartile range "
                     f"of {NOISY:.0%} of their median or more: their speedups are marked 'noisy'")
    if o["fast1_max_autotune"] is None:
        lines.append("torch.compile max-autotune: not measured in this sweep ("
                     + ("no correct solution to re-time" if max_autotune_on else "eval.max_autotune=false") + ").")
    return lines


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])) or "none"


def plots(summary: dict[str, Any], comparable: bool = False) -> dict[str, str]:
    """name -> base64 PNG, of the plots that have something to show for this sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    def encode(fig: Any) -> str:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        plt.close(fig)
        return base64.b64encode(buf.getvalue()).decode()

    groups = summary["groups"]
    names = shown_groups(summary)
    scored = _scored_solutions(summary)
    out = {}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    metrics = [(key, label) for key, label in (("pass", "pass"), ("fast1_eager", "fast_1 eager"),
                                               ("fast1_compile", "fast_1 compile"),
                                               ("fast1_max_autotune", "fast_1 max-autotune"))
               if any(groups[n][key] is not None for n in names)]  # a rate not measured is no bar at 0
    width = 0.8 / len(metrics)
    for i, (key, label) in enumerate(metrics):
        bars = ax.bar([j + i * width for j in range(len(names))], [100 * (groups[n][key] or 0.0) for n in names], width,
                      label=label)
        ax.bar_label(bars, fmt="%.0f%%", fontsize=7)  # a rate of 0 is a number, not a missing bar
    compile_bar = [k for k, _ in metrics].index("fast1_compile")
    for j, n in enumerate(names):
        if comparable and n in PAPER["faster_compile"]:
            x = j + compile_bar * width
            ax.plot([x - width / 2, x + width / 2], [100 * PAPER["faster_compile"][n]] * 2, "k--")
    ax.set_xticks([j + (len(metrics) - 1) * width / 2 for j in range(len(names))], names)
    ax.set_ylabel(f"% of {'problems' if scored else 'episodes'}")
    ax.set_ylim(0, 115)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("pass and fast_1 per level" + (" (dashed: the paper's faster-than-compile, on an H100)" if comparable else ""))
    out["rates"] = encode(fig)

    fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.2), squeeze=False)
    for ax, n in zip(axes[0], names):
        for key, series in groups[n]["fast_p"].items():
            ax.plot(P_GRID, [100 * (v or 0.0) for v in series], label=key.replace("speedup_", "vs ").replace("_", "-"))
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"fast_p, {n}")
        ax.set_xlabel("p: speedup over the baseline")
        ax.set_ylim(0, 105)
    axes[0][0].set_ylabel("fast_p: % correct and > p times faster", fontsize=8)
    axes[0][0].legend(fontsize=7)
    out["fast_p"] = encode(fig)

    o = groups["overall"]
    panels = (["failures"] if o["failures"] else []) + ([] if scored else ["turns"])  # nothing to draw: no plot
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3), squeeze=False)
        for ax, panel in zip(axes[0], panels):
            if panel == "failures":
                kinds = sorted(o["failures"].items(), key=lambda kv: kv[1])
                bars = ax.barh([k for k, _ in kinds], [v for _, v in kinds], height=0.5)
                ax.bar_label(bars, fontsize=8)
                ax.set_xlim(0, max(v for _, v in kinds) * 1.15)
                ax.set_ylim(-0.75, len(kinds) - 0.25)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_xlabel("solutions" if scored else "episodes")
                ax.set_title("failure kinds")
            else:
                ax.hist([p["turns"] for p in summary["problems"]], bins=20)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_xlabel("turns")
                ax.set_ylabel("problems")
                ax.set_title("turns of each problem's best episode")
        out["failures_turns"] = encode(fig)
    return out


def _title(identity: dict[str, Any]) -> str:
    kind, _, where = identity["policy"].partition(":")
    return f"Evaluation: solutions in {where}" if kind == "solutions" else f"Evaluation: {identity['policy']}"


def _setting(summary: dict[str, Any], identity: dict[str, Any]) -> str:
    run = "scored existing solutions (no policy)" if _scored_solutions(summary) else f"up to {identity['max_turns']} turns"
    machines = ", ".join(identity.get("machines") or [])
    return (f"backend {identity['backend']}, {run}, baseline torch.compile mode {identity['compile_mode']}"
            + (f"; timed on {machines}" if machines else "") + f"; {rules_line(identity)}")


def render_markdown(summary: dict[str, Any], identity: dict[str, Any], max_autotune_on: bool) -> str:
    header, rows = headline_rows(summary)
    parts = [f"# {_title(identity)}", "", _setting(summary, identity), "", "## Results", "", _md_table(header, rows), "",
             "## How failures and rates are counted", "", *[f"- {line}" for line in COUNTING], "",
             "## Beside the paper (CUDA Agent, KernelBench)", "",
             f"- The paper: {PAPER_CONDITIONS}.", f"- This sweep: {sweep_conditions(summary, identity)}.", "",
             paper_note(identity), "",
             _md_table(["metric", "paper", "this sweep"], paper_rows(summary)), "",
             "## Failures, guards, audit", "", *[f"- {line}" for line in detail_lines(summary, max_autotune_on)], "",
             "## Per problem", ""]
    parts.append(_md_table(*problem_table(summary)))
    return "\n".join(parts) + "\n"


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(summary: dict[str, Any], identity: dict[str, Any], max_autotune_on: bool, out: Path) -> str:
    header, rows = headline_rows(summary)
    images = plots(summary, comparable_with_paper(identity))

    def image(name: str, alt: str) -> str:
        return f"<img alt='{alt}' src='data:image/png;base64,{images[name]}'>" if name in images else ""

    solutions = []
    for p in summary["problems"]:
        if not p["solution"] or not (out / p["solution"]).is_dir():
            continue
        files = "".join(f"<p><b>{html.escape(name)}</b></p><pre>{html.escape(text)}</pre>"
                        for name, text in read_solution(out / p["solution"]).items())
        solutions.append(f"<details><summary>{html.escape(p.get('problem', p['task_id']))}: "
                         f"{MILESTONES[p['best_milestone']]}</summary>{files}</details>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}pre{background:#f6f6f6;padding:6px;overflow:auto;font-size:12px}"
             ".note{background:#fff6e0;padding:6px}")
    title = html.escape(_title(identity))
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{title}</title><style>{style}</style></head><body>",
        f"<h1>{title}</h1>",
        f"<p>{html.escape(_setting(summary, identity))}</p>",
        "<h2>Results</h2>", _html_table(header, rows),
        image("rates", "pass and fast_1 per level"), image("fast_p", "fast_p curves"),
        "<h2>How failures and rates are counted</h2><ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in COUNTING) + "</ul>",
        "<h2>Beside the paper (CUDA Agent, KernelBench)</h2>",
        f"<ul><li>The paper: {html.escape(PAPER_CONDITIONS)}.</li>"
        f"<li>This sweep: {html.escape(sweep_conditions(summary, identity))}.</li></ul>",
        f"<p class='note'>{html.escape(paper_note(identity))}</p>",
        _html_table(["metric", "paper", "this sweep"], paper_rows(summary)),
        "<h2>Failures, guards, audit</h2><ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in detail_lines(summary, max_autotune_on)) + "</ul>",
        image("failures_turns", "failure kinds and turns"),
        "<h2>Per problem</h2>", _html_table(*problem_table(summary)),
        "<h2>Best solutions</h2>", *solutions,
        "</body></html>",
    ])


def write_report(out: Path, cfg: Any, tasks: list[Any], identity: dict[str, Any]) -> dict[str, Path]:
    """report.md, report.html and summary.json from the sweep's files, for the problems of ``tasks``."""
    ids = {t.id for t in tasks}
    records = [r for r in latest_records(read_records(out / RESULTS)) if r["task_id"] in ids]
    if not records:
        return {}
    max_autotune_on = bool(cfg.eval.max_autotune)
    audits, autotune = (latest_records(read_records(out / f), "solution_hash") for f in (AUDIT, AUTOTUNE))
    summary = summarize(records, audits, autotune, list(cfg.eval.pass_k), max_autotune_on)
    sweep_file = out / SWEEP
    identity = {**identity, "machines": json.loads(sweep_file.read_text()).get("machines", []) if sweep_file.exists() else []}
    summary["identity"] = identity
    paths = {"markdown": out / "report.md", "html": out / "report.html", "summary": out / "summary.json"}
    paths["markdown"].write_text(render_markdown(summary, identity, max_autotune_on))
    paths["html"].write_text(render_html(summary, identity, max_autotune_on, out))
    paths["summary"].write_text(json.dumps(summary, indent=2))
    return paths
