"""A launch's resources cut from the offers that host it, reserved ones first. Pure.

Why: a TaskInfo that asks for a plain `cpus: 2` asks for unreserved CPUs. On an agent whose
CPUs are reserved for the framework's role (statically, `--resources="cpus(hpc):8"`, or by an
operator's RESERVE), the master refuses such a task as more than the offer holds, though the
offer holds 8 CPUs for us. So each scalar a TaskInfo and its executor ask for is taken from the
offered pieces, and each resource entry sent is a copy of the piece it came from (its role,
reservations and allocation info) with the amount taken. Reserved pieces go first: they are
ours alone, while what is unreserved could serve another role. The offer book has already
checked that the agent's offers hold the launches' sums (`OfferBook.decide`); this only says
which pieces pay for them.

Amounts are counted in thousandths, as Mesos stores scalars, so no float dust is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cosched.mesos.errors import MesosError
from cosched.mesos.offers import Offer

Json = dict[str, Any]

MILLI = 1000


def carve(offers: Sequence[Offer], infos: Iterable[Json]) -> list[Json]:
    """`infos` (TaskInfos for one ACCEPT of `offers`) with their scalar resources, and their
    executors', taken from the offers' pieces. MesosError when the pieces cannot pay for them."""
    pieces = sorted((piece for offer in offers for piece in offer.pieces), key=lambda piece: not reserved(piece))
    pool: list[list[Any]] = [[piece, _milli(piece["scalar"]["value"])] for piece in pieces]  # stable sort
    carved = []
    for info in infos:
        info = {**info, "resources": _take(pool, info.get("resources", []), info)}
        if "executor" in info:
            executor = info["executor"]
            info["executor"] = {**executor, "resources": _take(pool, executor.get("resources", []), info)}
        carved.append(info)
    return carved


def reserved(piece: Json) -> bool:
    """Whether a Resource is reserved (for our role: nothing reserved for another is offered to us),
    in the format with reservation refinement (`reservations`) or the one before it (`role`)."""
    return bool(piece.get("reservations")) or piece.get("role", "*") != "*"


def _take(pool: list[list[Any]], asked: Iterable[Json], info: Json) -> list[Json]:
    taken: list[Json] = []
    for resource in asked:
        name = resource.get("name")
        if resource.get("type") != "SCALAR" or name not in ("cpus", "mem"):
            taken.append(resource)
            continue
        need = _milli(resource["scalar"]["value"])
        for entry in pool:
            piece, left = entry
            if need == 0:
                break
            if piece["name"] != name or left == 0:
                continue
            amount = min(need, left)
            taken.append({**piece, "scalar": {"value": amount / MILLI}})
            entry[1] = left - amount
            need -= amount
        if need:
            task = info.get("task_id", {}).get("value", "?")
            raise MesosError(f"the offers held lack {need / MILLI:g} {name} for task {task}")
    return taken


def _milli(value: float) -> int:
    return round(float(value) * MILLI)
