"""The default expert set: one readable rule tree per metric, each combined with happiness.

Section 3.1.1 of the ASAx paper: "We combine states through DTs for each metric with the happiness
metric", and its Fig. 2 shows the CPU expert (3 CPU levels x 3 Hp levels = 9 leaf distributions).
The four experts below follow that pattern for CPU%, Mem%, stage type and progress. They disagree
on purpose: the weights learner (experts.weights) finds out per application class which one to
trust, so each tree only has to be a plausible opinion, not a tuned policy.

Hp bands shared by all trees (happiness is time left / time needed at the current pace):
  Hp <= 1.0        behind or just on pace: lending can only push the job past its walltime -> lend ~0.
  1.0 < Hp <= 1.1  "near 1" in the paper: no slack to spend -> lend little.
  Hp > 1.1         at least 10% slack -> lending is likely harmless ("increases the probability").

`experts/default_experts.json` is generated from this module (`python -m experts.default`); a test
keeps the two identical, so operators can start from the file and diff their edits against it.
"""

from __future__ import annotations

import math
from pathlib import Path

from cosched.errors import ConfigError
from experts.store import save_expert_set
from experts.tree import Expert, ExpertSet, Leaf, Node, Split

BEHIND, NO_SLACK = 1.0, 1.1
"""Hp thresholds: <= BEHIND lend nothing, <= NO_SLACK lend little, above: lend freely."""

JSON_PATH = Path(__file__).with_name("default_experts.json")

_UNITS = 10_000  # probabilities are multiples of 1e-4: short, exact-looking numbers in the JSON file


def peaked(m: int, lent: float, width: float = 0.1) -> tuple[float, ...]:
    """A distribution over the m-action grid concentrated around lending fraction `lent`.

    Weights fall off as exp(-|k/m - lent| / width): width 0.1 puts about 60% of the mass on the
    nearest action for m = 10. Every action keeps at least 1e-4, so no expert rules an action out
    forever (a zero would make that expert's risk blind to the action). Rounded to multiples of 1e-4
    with the rounding remainder on the peak, so the JSON file shows round numbers summing to 1.
    """
    weights = [math.exp(-abs(k / m - lent) / width) for k in range(m)]
    total = sum(weights)
    units = [max(1, round(_UNITS * w / total)) for w in weights]
    peak = max(range(m), key=lambda k: weights[k])
    units[peak] += _UNITS - sum(units)
    return tuple(u / _UNITS for u in units)


def _by_happiness(m: int, behind: float, no_slack: float, slack: float) -> Node:
    """The Hp part every tree ends in: three leaves peaked at the given lent fractions."""
    return Split(
        "happiness",
        BEHIND,
        Leaf(peaked(m, behind)),
        Split("happiness", NO_SLACK, Leaf(peaked(m, no_slack)), Leaf(peaked(m, slack))),
    )


def cpu_expert(m: int) -> Expert:
    """Fig. 2: high CPU% with Hp near 1 expects heavy degradation; low CPU% with Hp > 1.1 lends.

    Lending from a low-CPU job mostly hands out cycles it leaves idle, so the slack leaf lends up
    to about the idle share; a job above 75% CPU has few idle cycles to give at any Hp.
    """
    return Expert(
        "cpu",
        Split(
            "cpu",
            0.25,
            _by_happiness(m, behind=0.1, no_slack=0.3, slack=0.6),  # cpu <= 25%: mostly idle cores
            Split(
                "cpu",
                0.75,
                _by_happiness(m, behind=0.0, no_slack=0.1, slack=0.3),  # 25% < cpu <= 75%
                Leaf(peaked(m, 0.0, width=0.04)),
            ),  # cpu > 75%: busy, nothing idle to give whatever the slack
        ),
        "CPU% x Hp (paper Fig. 2): lend the cycles a job leaves idle, only when it has slack",
    )


def mem_expert(m: int) -> Expert:
    """Memory is never oversubscribed (only CPU quota is lent), but a job that fills its memory is
    usually memory-bound, and a co-runner on the same node competes for its caches and memory
    bandwidth: such jobs slow down even when their CPU% looks low. So high Mem% means lend little
    whatever Hp says; low Mem% leaves the decision to Hp.
    """
    return Expert(
        "mem",
        Split(
            "mem",
            0.5,
            _by_happiness(m, behind=0.0, no_slack=0.2, slack=0.5),  # mem <= 50%: not memory-bound
            Split(
                "mem",
                0.8,
                _by_happiness(m, behind=0.0, no_slack=0.1, slack=0.3),  # 50% < mem <= 80%
                _by_happiness(m, behind=0.0, no_slack=0.0, slack=0.1),
            ),  # mem > 80%: bandwidth-bound
        ),
        "Mem% x Hp: memory-bound jobs degrade under co-location, so high Mem% lends little",
    )


def stage_expert(m: int) -> Expert:
    """A sequential stage runs one core of a multi-core allocation: the other cores idle, and lending
    them barely touches the job, even when it is behind. A parallel stage uses every core, so it
    lends only when its CPU% shows idle cores and it has slack. CPU% also guards the sequential case:
    one core that is more than half the allocation means a small allocation with little to spare.
    """
    return Expert(
        "stage",
        Split(
            "parallel",
            0.5,
            Split(
                "cpu",
                0.5,  # sequential stage
                _by_happiness(m, behind=0.4, no_slack=0.6, slack=0.7),
                _by_happiness(m, behind=0.0, no_slack=0.1, slack=0.3),
            ),
            Split(
                "cpu",
                0.5,  # parallel stage
                _by_happiness(m, behind=0.0, no_slack=0.1, slack=0.4),
                _by_happiness(m, behind=0.0, no_slack=0.0, slack=0.1),
            ),
        ),
        "stage type x CPU% x Hp: sequential stages leave cores idle; parallel ones lend only when CPU% is low",
    )


def progress_expert(m: int) -> Expert:
    """Early in a run (< 25% of the walltime) Hp rests on few finished tasks and a mistake slows
    the whole remaining run, so lend cautiously. Late (> 75%) Hp has been measured over most of
    the run and a slowdown only stretches the small remaining part, which Hp > 1.1 says the slack
    covers, so lend more. Past the walltime (progress > 1) lend nothing: the job already overran.
    """
    return Expert(
        "progress",
        Split(
            "progress",
            0.25,
            _by_happiness(m, behind=0.0, no_slack=0.0, slack=0.1),  # early: Hp still noisy
            Split(
                "progress",
                0.75,
                _by_happiness(m, behind=0.0, no_slack=0.1, slack=0.3),  # middle
                Split(
                    "progress",
                    1.0,
                    _by_happiness(m, behind=0.0, no_slack=0.1, slack=0.6),  # late: Hp reliable
                    Leaf(peaked(m, 0.0, width=0.05)),
                ),
            ),  # overran its walltime
        ),
        "run progress x Hp: cautious early while Hp is noisy, generous late when slack is proven",
    )


def default_experts(m: int = 10) -> ExpertSet:
    """The four default experts (cpu, mem, stage, progress) over an m-action grid, in weight order.

    m is limited to 1..100: beyond that the 1e-4 probability grid of `peaked` is too coarse.
    """
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 100:
        raise ConfigError(f"default_experts: m must be an integer in 1..100, got {m!r}")
    return ExpertSet((cpu_expert(m), mem_expert(m), stage_expert(m), progress_expert(m)))


if __name__ == "__main__":
    save_expert_set(default_experts(), JSON_PATH)
    print(f"wrote {JSON_PATH}")
