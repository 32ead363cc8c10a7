"""How fast can any replay with cosched's event boundary be? The floor, measured.

Replays a trace with no scheduling decision at all: every job starts at its
submission, and the loop only builds the events the core would receive
(`JobSubmitted`, `JobEnded`, `Offer`) and pops the end heap. Whatever the core
does costs on top of this, so it bounds the replay's jobs/s from above.

    python benchmarks/event_floor.py [TRACE]      # default: SDSC-SP2 from ../shared/traces
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from pathlib import Path

from cosched.core.events import Event, JobEnded, JobSubmitted, Offer
from cosched.model import Job
from cosched.traces.swf import read_swf

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "traces" / "SDSC-SP2-1998-4.2-cln.swf.gz"


def events_only(jobs: list[Job]) -> float:
    """Seconds to build every event of a replay and pop every end, deciding nothing."""
    started = time.perf_counter()
    ends: list[tuple[float, int, Job]] = []
    i, n, seq, inf = 0, len(jobs), 0, math.inf
    while True:
        next_submit = jobs[i].submit if i < n else inf
        next_end = ends[0][0] if ends else inf
        now = min(next_submit, next_end)
        if now == inf:
            break
        events: list[Event] = []
        while ends and ends[0][0] <= now:
            job = heapq.heappop(ends)[2]
            events.append(JobEnded(job.id))
            events.append(Offer(job.slots))
        while i < n and jobs[i].submit <= now:
            job = jobs[i]
            events.append(JobSubmitted(job))
            seq += 1
            heapq.heappush(ends, (now + (job.runtime or 0.0), seq, job))
            i += 1
    return time.perf_counter() - started


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not path.exists():
        print(f"skipped: {path} absent")
        return
    trace = read_swf(path)
    best = min(events_only(trace.jobs()) for _ in range(3))
    print(
        f"{trace.name}: {len(trace)} jobs, events and end heap only: {best:.3f} s "
        f"= {len(trace) / best:,.0f} jobs/s at most; 100,000 jobs/s needs {len(trace) / 1e5:.3f} s in all"
    )


if __name__ == "__main__":
    main()
