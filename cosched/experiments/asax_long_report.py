"""Tables, goals, plots and logs of `cosched experiment asax-long`."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cosched.experiments.asax import Run
from cosched.experiments.asax_long import (
    LongExperiment,
    class_moves,
    learned_loss,
    lendings,
    mean,
    oracle_loss,
    regret,
)
from cosched.policies.asax import ASAx
from cosched.reporting.report import format_table
from experts.loss import degradation_loss
from experts.records import DecisionRecord, from_decision, write_log

LABELS = {"slurm": "space sharing+EASY", "static": "Static 50%", "asax": "ASAx (learning)", "uniform": "uniform mixing"}


def label(strategy: str) -> str:
    if strategy.startswith("asax/"):
        return f"ASAx, learner per {strategy.split('/', 1)[1]}"
    return LABELS.get(strategy, strategy)


def _spread(values: Sequence[float], digits: int = 2) -> str:
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{mean(values):.{digits}f} ± {spread:.{digits}f}"


def strategies(experiment: LongExperiment) -> list[str]:
    seen: dict[str, None] = {}
    for run in experiment.runs.runs:
        seen.setdefault(run.strategy)
    return list(seen)


def outcomes(experiment: LongExperiment) -> str:
    """Each strategy in a run of its own over the same arrivals (mean ± std over seeds)."""
    rows = []
    for strategy in strategies(experiment):
        runs = experiment.select(strategy)
        lent = [len(lendings(r)) for r in runs]
        oracle = [oracle_loss(r) for r in runs]
        overall = [r.overall() for r in runs]
        asax = isinstance(runs[0].policy, ASAx)  # Static's lendings are not scored
        rows.append(
            {
                "strategy": label(strategy),
                "lendings": round(mean(lent)) if asax else "-",
                "learned loss": f"{mean([learned_loss(r) for r in runs]):.1f}" if asax else "-",
                "true loss": _spread(oracle, 1) if asax else "-",
                "true loss per lending": f"{sum(oracle) / sum(lent):.3f}" if sum(lent) else "-",
                "wait h": _spread([o["wait_h"] for o in overall]),
                "response h": _spread([o["response_h"] for o in overall]),
                "degradation %": "-"
                if strategy == "slurm"
                else f"{100 * experiment.runs.degradation(experiment.size, strategy):.1f}",
                "failed workflows": int(sum(o["failed"] for o in overall)),
            }
        )
    return format_table(
        rows,
        title="Each strategy on its own over the same arrivals (mean ± std over seeds; losses summed over a run; "
        "true loss: each lender's slowdown against its true runtime alone, 1 at 50%)",
    )


def theorem(experiment: LongExperiment, strategy: str = "asax") -> str:
    """Theorem 1's sums on the learning run's own cases, beside each fixed mixture's."""
    runs = experiment.select(strategy)
    regrets = [g for g in (regret(r) for r in runs) if g is not None]
    if not regrets:
        return ""
    names = list(regrets[0].experts)
    rows = [
        {"on ASAx's cases": "ASAx (weights as they were)", "risk": _spread([g.asax for g in regrets])},
        {"on ASAx's cases": "uniform mixing", "risk": _spread([g.uniform for g in regrets])},
        *(
            {"on ASAx's cases": f"expert {name} alone", "risk": _spread([g.experts[name] for g in regrets])}
            for name in names
        ),
        {"on ASAx's cases": "best expert per learner", "risk": _spread([g.best_per_learner for g in regrets])},
    ]
    summary = {
        "cases": round(mean([g.cases for g in regrets])),
        "weight updates": round(mean([g.updates for g in regrets])),
        "E_T (ASAx - best per learner)": _spread([g.excess for g in regrets]),
        "Theorem 1 bound": _spread([g.bound for g in regrets]),
        "E_T <= bound": "yes" if all(g.excess <= g.bound for g in regrets) else "NO",
    }
    return (
        format_table(rows, title="Theorem 1 on ASAx's own cases: sum of p(a) x loss over the lendings it learned from")
        + "\n"
        + format_table([summary])
    )


def learners(experiment: LongExperiment) -> str:
    """The first seed's learning run, per learner: how much it lent and lost, and how its mixture moved."""
    runs = experiment.select("asax")
    if not runs or not isinstance(runs[0].policy, ASAx):
        return ""
    names = runs[0].policy.experts.names
    rows = [
        {
            "learner": move.learner,
            "decisions": move.decisions,
            "lendings": move.lendings,
            "mean loss": f"{move.mean_loss:.3f}",
            "updates": move.updates,
            "lent, uniform": f"{100 * move.lent_uniform:.1f}%",
            "lent, final": f"{100 * move.lent_final:.1f}%",
            "final weights": " ".join(f"{name} {a:.2f}" for name, a in zip(names, move.alpha, strict=True)),
        }
        for move in class_moves(runs[0])
    ]
    return format_table(
        rows,
        title=f"Per learner (seed {runs[0].seed}): mean lent fraction of its mixture in the states it decided in, "
        "with uniform weights and with its final weights",
    )


def learner_comparison(experiment: LongExperiment) -> str:
    """Learning runs keyed differently: how much each saved against uniform mixing on its own cases."""
    keyed = [s for s in strategies(experiment) if s == "asax" or s.startswith("asax/")]
    if len(keyed) < 2:
        return ""
    rows = []
    for strategy in keyed:
        runs = experiment.select(strategy)
        regrets = [g for g in (regret(r) for r in runs) if g is not None]
        thirds = [saving_by_thirds(r) for r in runs]
        policy = runs[0].policy
        assert isinstance(policy, ASAx)
        rows.append(
            {
                "learner per": policy.learner,
                "learners": round(mean([len(r.policy.book.classes()) for r in runs])),  # type: ignore[attr-defined]
                "weight updates": round(mean([g.updates for g in regrets])),
                "ASAx / uniform": _spread([g.asax / g.uniform for g in regrets], 3),
                "by thirds of the run": " ".join(f"{mean([t[k] for t in thirds]):.3f}" for k in range(3)),
                "true loss per lending": f"{mean([oracle_loss(r) / max(1, len(lendings(r))) for r in runs]):.3f}",
                "wait h": _spread([r.overall()["wait_h"] for r in runs]),
                "degradation %": f"{100 * experiment.runs.degradation(experiment.size, strategy):.1f}",
            }
        )
    return format_table(
        rows,
        title="Which learners learn fastest: ASAx's risk over uniform mixing's on the same cases "
        "(lower: the weights moved further from the experts that advised the losses)",
    )


def saving_by_thirds(run: Run) -> list[float]:
    """ASAx's risk over uniform mixing's in each third of its scored lendings, in time order
    (the mixture of each decision's own weights: those it was sampled from)."""
    cases = sorted((d for d in lendings(run) if d.loss), key=lambda d: d.time)
    out = []
    for part in np.array_split(np.arange(len(cases)), 3):
        mixed = uniform = 0.0
        for i in part:
            d = cases[int(i)]
            taken = np.array(d.distributions)[:, d.action]
            mixed += float(np.dot(d.weights, taken)) * (d.loss or 0.0)
            uniform += float(taken.mean()) * (d.loss or 0.0)
        out.append(mixed / uniform if uniform else 1.0)
    return out


def goals(experiment: LongExperiment) -> list[tuple[str, str, bool]]:
    """The issue's acceptance for the long horizon, with the default (live) loss."""
    runs = experiment.select("asax")
    regrets = [g for g in (regret(r) for r in runs) if g is not None]
    uniform_runs = experiment.select("uniform")
    out = [
        (
            "ASAx's risk below uniform mixing's (same cases)",
            f"{mean([g.asax for g in regrets]):.2f} vs {mean([g.uniform for g in regrets]):.2f}",
            all(g.asax < g.uniform for g in regrets),
        ),
        (
            "E_T within Theorem 1's bound",
            f"{mean([g.excess for g in regrets]):.2f} <= {mean([g.bound for g in regrets]):.2f}",
            all(g.excess <= g.bound for g in regrets),
        ),
        (
            "hundreds of weight updates per run",
            f"{min(g.updates for g in regrets)} to {max(g.updates for g in regrets)}",
            min(g.updates for g in regrets) >= 200,
        ),
    ]
    if uniform_runs:
        ours = mean([oracle_loss(r) for r in runs])
        theirs = mean([oracle_loss(r) for r in uniform_runs])
        out.append(("ASAx's true loss below uniform mixing's (own runs)", f"{ours:.1f} vs {theirs:.1f}", ours < theirs))
    moves = [move for r in runs for move in class_moves(r) if move.lendings]
    overall = mean([move.mean_loss for move in moves])
    hurt = [move for move in moves if move.mean_loss > overall and move.updates > 0]
    away = [move for move in hurt if move.lent_final < move.lent_uniform]
    out.append(
        (
            "(learner, seed) pairs that hurt (mean loss above the mean) moved away from lending",
            f"{len(away)} of {len(hurt)}",
            bool(hurt) and len(away) == len(hurt),
        )
    )
    return out


def format_goals(results: list[tuple[str, str, bool]]) -> str:
    rows = [{"goal": g, "measured": m, "met": "yes" if ok else "NO"} for g, m, ok in results]
    return format_table(rows, title="Goals (long horizon, live loss)")


def compare_experts(default: LongExperiment, other: LongExperiment, other_name: str) -> str:
    """ASAx learning with the default experts and with another set, on the same seeds and arrivals."""
    rows = []
    for name, experiment in (("default", default), (other_name, other)):
        runs = experiment.select("asax")
        regrets = [g for g in (regret(r) for r in runs) if g is not None]
        lent = [len(lendings(r)) for r in runs]
        oracle = [oracle_loss(r) for r in runs]
        rows.append(
            {
                "experts": name,
                "lendings": round(mean(lent)),
                "true loss": _spread(oracle, 1),
                "true loss per lending": f"{sum(oracle) / max(1, sum(lent)):.3f}",
                "ASAx / uniform": _spread([g.asax / g.uniform for g in regrets], 3),
                "wait h": _spread([r.overall()["wait_h"] for r in runs]),
                "response h": _spread([r.overall()["response_h"] for r in runs]),
                "degradation %": f"{100 * experiment.runs.degradation(experiment.size, 'asax'):.1f}",
                "failed workflows": int(sum(r.overall()["failed"] for r in runs)),
            }
        )
    return format_table(rows, title="ASAx with each expert set, same seeds and arrivals")


def training_records(experiment: LongExperiment) -> list[DecisionRecord]:
    """What `cosched experts fit` learns from: every scored decision of the learning runs."""
    return [
        record
        for run in experiment.select("asax")
        if isinstance(run.policy, ASAx)
        for d in run.policy.decisions
        if (record := from_decision(d.as_dict())) is not None
    ]


def write_outputs(experiment: LongExperiment, out: Path) -> list[Path]:
    """decisions.jsonl (for explain), training.jsonl (for experts fit), summary.json and plots."""
    out.mkdir(parents=True, exist_ok=True)
    decisions = out / "decisions.jsonl"
    with decisions.open("w") as f:
        for run in experiment.select("asax"):
            if isinstance(run.policy, ASAx):
                for d in run.policy.decisions:
                    f.write(json.dumps({"seed": run.seed, **d.as_dict()}, default=str) + "\n")
    training = out / "training.jsonl"
    write_log(training, training_records(experiment))
    summary = out / "summary.json"
    body = {}
    for run in experiment.runs.runs:
        g = regret(run)
        body[f"{run.strategy}/seed{run.seed}"] = {
            "overall": run.overall(),
            "lendings": len(lendings(run)),
            "true_loss": oracle_loss(run),
            "learned_loss": learned_loss(run),
            "regret": None if g is None else {"asax": g.asax, "uniform": g.uniform, "bound": g.bound, "E": g.excess},
        }
    summary.write_text(json.dumps(body, indent=2) + "\n")
    return [decisions, training, summary, *_plots(experiment, out)]


def _plots(experiment: LongExperiment, out: Path) -> list[Path]:
    from matplotlib.figure import Figure

    runs = experiment.select("asax")
    if not runs or not isinstance(runs[0].policy, ASAx):
        return []
    run, policy = runs[0], runs[0].policy
    assert isinstance(policy, ASAx)
    names = policy.experts.names
    learners = sorted({learner for _, learner, _ in policy.weight_history})
    cols = min(4, max(1, len(learners)))
    rows = max(1, -(-len(learners) // cols))
    fig = Figure(figsize=(4 * cols, 2.6 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, learner in enumerate(learners):
        ax = axes[k // cols][k % cols]
        points = [(0.0, [1.0 / len(names)] * len(names))]
        points += [(t / 3600, w) for t, c, w in policy.weight_history if c == learner]
        for i, name in enumerate(names):
            ax.step([t for t, _ in points], [w[i] for _, w in points], where="post", label=name)
        ax.set_title(f"{learner} ({len(points) - 1} updates)", fontsize=9)
        ax.set_ylim(0, 1)
        ax.set_xlabel("time (h)", fontsize=8)
    for k in range(len(learners), rows * cols):
        axes[k // cols][k % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    axes[0][0].set_ylabel("expert weight")
    fig.suptitle(f"ASAx expert weights per learner (seed {run.seed}, {experiment.size} cores, live loss)")
    weights = out / "expert_weights.png"
    fig.savefig(weights, dpi=90)

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for strategy in strategies(experiment):
        other = next((r for r in experiment.select(strategy) if r.seed == run.seed), None)
        if other is None or not lendings(other):
            continue
        ax.plot(*_true_loss_curve(other), label=label(strategy))
    ax.set_xlabel("time (h)")
    ax.set_ylabel("cumulative true loss of lenders")
    ax.set_title(f"Cumulative loss, each strategy on its own (seed {run.seed})")
    ax.legend(fontsize=8)
    curves = out / "cumulative_loss.png"
    fig.savefig(curves, dpi=90)
    return [weights, curves]


def _true_loss_curve(run: Run) -> tuple[list[float], list[float]]:
    jobs = {j.id: j for j in run.jobs}
    points = []
    for d in lendings(run):
        host = jobs[d.host]
        points.append((host.end / 3600, degradation_loss(host.end - host.start, host.runtime or host.walltime)))
    points.sort()
    return [t for t, _ in points], list(np.cumsum([loss for _, loss in points]))
