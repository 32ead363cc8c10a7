"""Text rendering of an expert set, for `cosched experts show` and for reviewing fitted trees."""

from __future__ import annotations

import math

from experts.tree import ExpertSet, Leaf, Node, expected_lent, lent_fractions

TOP = 3
"""Leaves list their TOP most likely actions; the rest is summarised by the mean lent fraction."""


def describe(expert_set: ExpertSet) -> str:
    """Every expert as an indented if/else tree whose leaves read "mean lent 12% | 0%:0.63 10%:0.23 ...".

    Operators should be able to check a fitted set against intuition (does low CPU% lend more?)
    without loading the JSON into anything.
    """
    m = expert_set.m
    fractions = lent_fractions(m)
    grid = ", ".join(_pct(f) for f in fractions[:3]) + (f", ..., {_pct(fractions[-1])}" if m > 3 else "")
    lines = [f"{len(expert_set)} experts, m={m} actions (lent fraction {grid})"]
    for number, expert in enumerate(expert_set, start=1):
        title = f"[{number}] {expert.name}"
        lines.append(f"{title}: {expert.description}" if expert.description else title)
        _render(expert.root, 1, lines)
    return "\n".join(lines) + "\n"


def _render(node: Node, depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    if isinstance(node, Leaf):
        lines.append(f"{pad}-> {_leaf_text(node)}")
        return
    if node.feature == "parallel" and 0.0 <= node.threshold < 1.0:  # a bool: say which stage type
        below, above = "if sequential stage (parallel = false):", "else (parallel stage):"
    else:
        threshold = f"{node.threshold:.4g}"
        below, above = f"if {node.feature} <= {threshold}:", f"else ({node.feature} > {threshold}):"
    lines.append(pad + below)
    _render(node.below, depth + 1, lines)
    lines.append(pad + above)
    _render(node.above, depth + 1, lines)


def _leaf_text(leaf: Leaf) -> str:
    fractions = lent_fractions(len(leaf.dist))
    order = sorted(range(len(leaf.dist)), key=lambda k: (-leaf.dist[k], k))[:TOP]
    top = " ".join(f"{_pct(fractions[k])}:{leaf.dist[k]:.2f}" for k in order)
    return f"mean lent {_pct(expected_lent(leaf.array))} | {top}"


def _pct(fraction: float) -> str:
    value = 100 * fraction
    return f"{value:.0f}%" if math.isclose(value, round(value), abs_tol=0.05) else f"{value:.1f}%"
