"""Offers as the offer book sees them: id, agent, the cpus and memory they hold, and the pieces
those come in (each with its role and reservations, which a launch must name: `cosched.mesos.carve`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosched.mesos.errors import MesosError


@dataclass(frozen=True)
class Offer:
    id: str
    agent_id: str
    hostname: str
    cpus: float
    mem: float
    """MiB."""
    received_at: float
    """When the offer arrived (the caller's clock, seconds): the hold timeout counts from here."""
    pieces: tuple[dict[str, Any], ...] = ()
    """Its scalar cpus and mem Resources as offered: unreserved, or reserved for our role."""
    attributes: tuple[tuple[str, str], ...] = ()
    """The agent's text and scalar attributes (`--attributes="rack:r1;switch:s3"`), as text."""


def parse_offer(offer: dict[str, Any], received_at: float) -> Offer:
    """An Offer message (JSON) -> Offer, summing its scalar `cpus` and `mem` over all roles offered to us."""
    try:
        totals = {"cpus": 0.0, "mem": 0.0}
        pieces = []
        for resource in offer.get("resources", []):
            if resource.get("name") in totals and resource.get("type") == "SCALAR":
                totals[resource["name"]] += float(resource["scalar"]["value"])
                pieces.append(resource)
        return Offer(
            offer["id"]["value"],
            offer["agent_id"]["value"],
            offer.get("hostname", ""),
            **totals,
            received_at=received_at,
            pieces=tuple(pieces),
            attributes=tuple(_attribute(a) for a in offer.get("attributes", []) if a.get("type") in ("TEXT", "SCALAR")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MesosError(f"malformed offer {str(offer)[:120]}: {type(exc).__name__}: {exc}") from None


def _attribute(attribute: dict[str, Any]) -> tuple[str, str]:
    if attribute["type"] == "TEXT":
        return str(attribute["name"]), str(attribute["text"]["value"])
    return str(attribute["name"]), f"{float(attribute['scalar']['value']):g}"
