"""Tables, goals, plots and logs of `cosched experiment asax`, next to the paper's numbers."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cosched.experiments.asax import APPS, PAPER_TABLE2, PAPER_TABLE3, Experiment, Run
from cosched.numbers import is_finite_number
from cosched.policies.asax import ASAx, loss_outcome
from cosched.reporting.report import format_table
from experts.features import JobFeatures
from experts.loss import degradation_loss
from experts.records import DecisionRecord, write_log

LABELS = {"slurm": "space sharing+EASY", "static": "Static 50%", "asax": "ASAx"}


def _mean_spread(values: Sequence[float]) -> str:
    mean = statistics.fmean(values)
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {spread:.2f}"


def _over_seeds(runs: Sequence[Run], measure: Callable[[Run], float]) -> list[float]:
    return [measure(run) for run in runs]


def table2(experiment: Experiment) -> str:
    """Per cluster size, workflow and strategy: runtime, CPU% of granted CPU, Mem%; paper beside."""
    rows = []
    sizes = sorted({r.size for r in experiment.runs})
    strategies = [s for s in LABELS if any(r.strategy == s for r in experiment.runs)]
    for size in sizes:
        for app in APPS:
            for strategy in strategies:
                runs = experiment.select(size, strategy)
                stats = [run.per_app(app) for run in runs]
                paper = PAPER_TABLE2.get(size, {}).get(strategy, {}).get(app)
                rows.append(
                    {
                        "size": size,
                        "workflow": app,
                        "strategy": LABELS[strategy],
                        "runtime h": _mean_spread([s["runtime_h"] for s in stats]),
                        "paper h": f"{paper[0]:.2f} ±{paper[1]:.0f}%" if paper else "-",
                        "CPU %": _mean_spread([s["cpu_pct"] for s in stats]),
                        "paper CPU": paper[2] if paper else "-",
                        "Mem %": _mean_spread([s["mem_pct"] for s in stats]),
                        "paper Mem": paper[3] if paper else "-",
                    }
                )
    return format_table(rows, title="Table 2: workflows (mean ± std over seeds; runtime = sum of stage runtimes)")


def table3(experiment: Experiment) -> str:
    """Per strategy and size: workflow wait and response, CPU use; paper beside."""
    rows = []
    for strategy in LABELS:
        for size in sorted({r.size for r in experiment.runs}):
            runs = experiment.select(size, strategy)
            if not runs:
                continue
            overall = [run.overall() for run in runs]
            paper = PAPER_TABLE3[strategy].get(size)
            rows.append(
                {
                    "strategy": LABELS[strategy],
                    "size": size,
                    "wait h": _mean_spread([o["wait_h"] for o in overall]),
                    "paper wait": paper[0] if paper else "-",
                    "response h": _mean_spread([o["response_h"] for o in overall]),
                    "paper resp": paper[2] if paper else "-",
                    "CPU % of granted": _mean_spread([o["cpu_pct"] for o in overall]),
                    "cluster CPU %": _mean_spread([o["cluster_cpu_pct"] for o in overall]),
                    "paper cluster CPU": paper[1] if paper else "-",
                    "makespan h": _mean_spread([o["makespan_h"] for o in overall]),
                    "degradation %": "-"
                    if strategy == "slurm"
                    else f"{100 * experiment.degradation(size, strategy):.1f}",
                    "failed workflows": int(sum(o["failed"] for o in overall)),
                }
            )
    return format_table(rows, title="Table 3: per strategy (workflow wait and response; mean ± std over seeds)")


def _change(experiment: Experiment, size: int, strategy: str, key: str) -> float:
    ours = statistics.fmean(r.overall()[key] for r in experiment.select(size, strategy))
    base = statistics.fmean(r.overall()[key] for r in experiment.select(size, "slurm"))
    return ours / base - 1 if base else math.nan


def goals(experiment: Experiment) -> list[tuple[str, str, bool]]:
    """The issue's goals for ASAx against space sharing (and Static), each with its measure."""
    sizes = sorted({r.size for r in experiment.runs})
    out: list[tuple[str, str, bool]] = []
    for size in sizes:
        # The paper's "up to 51%" is cluster CPU utilization (its Table 3, section 4.5.2), not CPU of granted.
        cpu = _change(experiment, size, "asax", "cluster_cpu_pct")
        granted = _change(experiment, size, "asax", "cpu_pct")
        wait = _change(experiment, size, "asax", "wait_h")
        out.append(
            (
                f"{size} cores: cluster CPU utilization up >= 50%",
                f"{100 * cpu:+.0f}% (CPU of granted {100 * granted:+.0f}%)",
                cpu >= 0.5,
            )
        )
        out.append((f"{size} cores: mean wait down >= 50%", f"{100 * wait:+.0f}%", wait <= -0.5))
        degradation = experiment.degradation(size, "asax")
        out.append(
            (f"{size} cores: workflow runtime degradation <= 5%", f"{100 * degradation:+.1f}%", degradation <= 0.05)
        )
        resp_asax = _change(experiment, size, "asax", "response_h")
        resp_static = _change(experiment, size, "static", "response_h")
        deg_static = experiment.degradation(size, "static")
        out.append(
            (
                f"{size} cores: ASAx beats Static on response and degradation",
                f"response {100 * resp_asax:+.0f}% vs {100 * resp_static:+.0f}%, "
                f"degradation {100 * degradation:+.1f}% vs {100 * deg_static:+.1f}%",
                resp_asax < resp_static and degradation < deg_static,
            )
        )
    if 256 in sizes:
        resp = _change(experiment, 256, "asax", "response_h")
        out.append(("256 cores: mean response down >= 55%", f"{100 * resp:+.0f}%", resp <= -0.55))
    return out


def learning(experiment: Experiment) -> str:
    """How much ASAx had to learn from, per size (summed over seeds)."""
    rows = []
    for size in sorted({run.size for run in experiment.runs}):
        policies = [run.policy for run in experiment.select(size, "asax") if isinstance(run.policy, ASAx)]
        if not policies:
            continue
        lent = [d for p in policies for d in p.decisions if d.executed and d.fraction > 0]
        errors = [abs(loss - true) for loss, note, true in _true_losses(experiment, size) if note.startswith("its own")]
        rows.append(
            {
                "size": size,
                "loss": policies[0].loss,
                "decisions": sum(len(p.decisions) for p in policies),
                "lendings carried out": len(lent),
                "with a known loss": sum(d.loss is not None for d in lent),
                "scored by own pace": len(errors),
                "its error vs true loss": f"{statistics.fmean(errors):.3f}" if errors else "-",
                "weight updates": sum(len(p.weight_history) for p in policies),
            }
        )
    return (
        "ASAx learning (all seeds; a lending scored by its lender's own pace, its kind never having run alone, "
        "against the loss its true runtime alone gives: mean absolute error)\n" + format_table(rows)
    )


def _true_losses(experiment: Experiment, size: int) -> list[tuple[float, str, float]]:
    """Each scored lending of the ASAx runs: its loss, how it was found, and its lender's slowdown
    against its true runtime alone."""
    out = []
    for run in experiment.select(size, "asax"):
        jobs = {j.id: j for j in run.jobs}
        assert isinstance(run.policy, ASAx)
        for d in run.policy.decisions:
            if d.executed and d.fraction > 0 and d.loss is not None:
                host = jobs[d.host]
                out.append((d.loss, d.note, degradation_loss(host.end - host.start, host.runtime or host.walltime)))
    return out


def format_goals(results: list[tuple[str, str, bool]]) -> str:
    rows = [{"goal": g, "measured": m, "met": "yes" if ok else "NO"} for g, m, ok in results]
    return format_table(rows, title="Goals (ASAx against space sharing + EASY)")


def write_outputs(experiment: Experiment, out: Path) -> list[Path]:
    """Decision logs (for `cosched explain` and `cosched experts fit`), summary JSON and plots."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    decisions = out / "decisions.jsonl"
    records: list[DecisionRecord] = []
    with decisions.open("w") as f:
        for run in experiment.runs:
            if not isinstance(run.policy, ASAx):
                continue
            for d in run.policy.decisions:
                f.write(json.dumps({"size": run.size, "seed": run.seed, **d.as_dict()}, default=str) + "\n")
                if d.loss is not None:
                    records.append(DecisionRecord(JobFeatures(**d.features), d.action, d.loss, d.app_class))
    written.append(decisions)
    training = out / "training.jsonl"
    write_log(training, records)
    written.append(training)
    summary = out / "summary.json"
    summary.write_text(
        json.dumps(
            {
                f"{r.strategy}/{r.size}/seed{r.seed}": {"overall": r.overall(), "apps": {a: r.per_app(a) for a in APPS}}
                for r in experiment.runs
            },
            indent=2,
        )
        + "\n"
    )
    written.append(summary)
    written += _plots(experiment, out)
    return written


def _plots(experiment: Experiment, out: Path) -> list[Path]:
    from matplotlib.figure import Figure

    paths = []
    sizes = sorted({r.size for r in experiment.runs})
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    width = 0.8 / len(LABELS)
    for k, strategy in enumerate(LABELS):
        means = [
            statistics.fmean(r.overall()["makespan_h"] for r in experiment.select(s, strategy) or [])
            if experiment.select(s, strategy)
            else 0.0
            for s in sizes
        ]
        ax.bar([i + k * width for i in range(len(sizes))], means, width, label=LABELS[strategy])
    ax.set_xticks([i + width for i in range(len(sizes))], [f"{s} cores" for s in sizes])
    ax.set_ylabel("makespan (h)")
    ax.set_title("Workload makespan per strategy")
    ax.legend()
    path = out / "makespan.png"
    fig.savefig(path, dpi=100)
    paths.append(path)

    asax_runs = [r for r in experiment.runs if isinstance(r.policy, ASAx)]
    if asax_runs:
        run = max(asax_runs, key=lambda r: len(r.policy.weight_history))  # type: ignore[attr-defined]
        policy = run.policy
        assert isinstance(policy, ASAx)
        fig = Figure(figsize=(9, 5))
        ax = fig.add_subplot()
        classes = sorted({c for _, c, _ in policy.weight_history})
        for app_class in classes:
            points = [(t, w) for t, c, w in policy.weight_history if c == app_class]
            for i, name in enumerate(policy.experts.names):
                ax.plot(
                    [t / 3600 for t, _ in points], [w[i] for _, w in points], marker=".", label=f"{app_class}: {name}"
                )
        ax.set_xlabel("time (h)")
        ax.set_ylabel("expert weight")
        ax.set_title(f"ASAx expert weights per application class ({run.size} cores, seed {run.seed})")
        if classes:
            ax.legend(fontsize=6, ncol=2)
        path = out / "expert_weights.png"
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


def explain(decisions: Path, job_id: int) -> str:
    """Every logged decision in which `job_id` lent or borrowed, readably.

    ValueError("FILE:LINE: ...") for a line that is not a decision (`decision_problem`): every
    line is checked, not only the job's, so a damaged log is named whichever job is asked about.
    """
    lines = []
    with decisions.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            d = _read_decision(raw, f"{decisions}:{n}")
            if job_id not in (d["host"], d["guest"]):
                continue
            role = "lender" if d["host"] == job_id else "borrower"
            # A log holds several runs (sizes, seeds), each numbering its jobs from 1: say whose.
            run = ", ".join(f"{key} {d[key]}" for key in ("size", "seed") if key in d)
            lines.append(
                f"{f'[{run}] ' if run else ''}t={d['time']:.0f}s  job {job_id} as {role}: "
                f"host {d['host']} ({d['app_class']}) "
                f"-> guest {d['guest']}, lent {100 * d['fraction']:.0f}% (action {d['action']})"
            )
            feats = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in d["features"].items())
            lines.append(f"    state: {feats}")
            for name, dist, weight in zip(d["experts"], d["distributions"], d["weights"], strict=True):
                expected = sum(p * k / len(dist) for k, p in enumerate(dist))
                lines.append(
                    f"    expert {name:<9} weight {weight:.3f}  expected lent {100 * expected:4.1f}%  "
                    f"P(0%)={dist[0]:.2f}"
                )
            lines.append(f"    loss: {loss_outcome(d)}")
    return "\n".join(lines)


# What `explain` reads of a decision (`LendingDecision.as_dict`), each with the JSON types it may have.
_DECISION_FIELDS: dict[str, tuple[type, ...]] = {
    "time": (int, float),
    "host": (int,),
    "guest": (int,),
    "app_class": (str,),
    "fraction": (int, float),
    "action": (int,),
    "features": (dict,),
    "experts": (list,),
    "distributions": (list,),
    "weights": (list,),
}
_OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "loss": (int, float, type(None)),
    "host_runtime": (int, float, type(None)),
    "baseline": (int, float, type(None)),
    "note": (str, type(None)),
    "executed": (bool,),
}


def _read_decision(raw: bytes, where: str) -> dict[str, Any]:
    """One log line as a decision; ValueError naming `where` (FILE:LINE) when it is not one."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8 text (is this a decisions.jsonl?)") from None
    except json.JSONDecodeError:
        raise ValueError(f"{where}: not JSON") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to be a decision") from None
    problem = decision_problem(d)
    if problem:
        raise ValueError(f"{where}: not a lending decision: {problem}")
    return d


def decision_problem(d: Any) -> str | None:
    """What keeps `d` from being a decision `explain` can show, or None: fields present and of
    their type (a bool is no number here), numbers finite, and one distribution and weight per expert."""
    if not isinstance(d, dict):
        return f"a JSON {type(d).__name__}, not an object"
    for key, types in (*_DECISION_FIELDS.items(), *_OPTIONAL_FIELDS.items()):
        if key not in d:
            if key in _DECISION_FIELDS:
                return f"no {key!r}"
            continue
        value = d[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{key!r} is {value!r:.40}"
        if float in types and value is not None and not is_finite_number(value):  # it is printed as a float
            return f"{key!r} is {value!r:.40}"
    experts, dists, weights = d["experts"], d["distributions"], d["weights"]
    if not len(experts) == len(dists) == len(weights):
        return f"{len(experts)} experts, {len(dists)} distributions and {len(weights)} weights"
    if not all(isinstance(dist, list) and dist and all(is_finite_number(p) for p in dist) for dist in dists):
        return "a distribution is not a non-empty list of numbers"
    if not all(is_finite_number(w) for w in weights):
        return "a weight is not a number"
    return None
