"""Prometheus metrics of one daemon, in its own registry (`/metrics`).

Gauges are refreshed at the end of each scheduling pass from the core's state,
so a scrape costs nothing and never takes the scheduling lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from cosched.daemon import submissions
from cosched.policies.fairshare import FairShare

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon
    from cosched.model import Job

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DaemonMetrics:
    """Queue, cores (allocated, used, lent), ASAx decisions and weights, pass latency."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_length = Gauge("cosched_queue_length", "Jobs waiting in the queue", registry=r)
        self.running = Gauge("cosched_running_jobs", "Jobs running (hosts and guests)", registry=r)
        self.pending = Gauge(
            "cosched_pending_jobs",
            "Jobs pending: in the queue, held, or waiting for their begin or dependencies (squeue -t PD)",
            registry=r,
        )
        self.cores_total = Gauge("cosched_cores_total", "Cores of the cluster", registry=r)
        self.cores_allocated = Gauge("cosched_cores_allocated", "Cores allocated to running jobs", registry=r)
        self.cores_used = Gauge("cosched_cores_used", "CPUs running jobs used at the last sample", registry=r)
        self.cores_lent = Gauge("cosched_cores_lent", "CPU quota lent by hosts to co-scheduled guests", registry=r)
        self.engine_up = Gauge("cosched_engine_up", "1 while the Docker engine answers", registry=r)
        self.nodes_drained = Gauge("cosched_nodes_drained", "Nodes an operator took out of service", registry=r)
        self.launches_waiting = Gauge(
            "cosched_launches_waiting",
            "Launches a pass stopped waiting for (a Mesos launch waiting for offers)",
            registry=r,
        )
        self.submitted = Counter("cosched_jobs_submitted", "Jobs queued (each released workflow stage too)", registry=r)
        self.launched = Counter("cosched_jobs_launched", "Containers started", registry=r)
        self.requeued = Counter(
            "cosched_jobs_requeued",
            "Runs ended to run again: requeued on request, or lost with their machine",
            registry=r,
        )
        self.waiting_dependency = Gauge(
            "cosched_jobs_waiting_dependency", "Pending jobs held until their dependencies are met", registry=r
        )
        self.decisions = Counter(
            "cosched_lending_decisions",
            "ASAx decisions, by the expert that gave the chosen action most weight",
            ["expert", "app_class"],
            registry=r,
        )
        self.weights = Gauge("cosched_expert_weight", "ASAx expert weights", ["app_class", "expert"], registry=r)
        self.pass_seconds = Histogram(
            "cosched_pass_seconds",
            "Scheduling pass latency, its engine calls included",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.quota_latency = Histogram(
            "cosched_quota_apply_seconds",
            "From a quota decision to the cgroup showing it",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.launch_seconds = Histogram(
            "cosched_launch_seconds",
            "From a launch decided to the job running (on Mesos: offers, ACCEPT, the executor's container)",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.offer_launch_seconds = Histogram(
            "cosched_offer_to_launch_seconds",
            "Mesos: from the offer a launch used arriving to its tasks running",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.user_cores = Gauge("cosched_user_cores", "Cores held by each user's running jobs", ["user"], registry=r)
        self.user_fairshare = Gauge(
            "cosched_user_fairshare", "Each user's fair-share factor (queue policy fairshare)", ["user"], registry=r
        )
        self.offers_held = Gauge("cosched_offers_held", "Mesos offers held for launches waiting", registry=r)
        self.offers_declined = Counter("cosched_offers_declined", "Mesos offers declined", registry=r)
        self.quota_mismatches = Counter(
            "cosched_quota_mismatches", "Cgroup quotas found different from decided", registry=r
        )
        self.engine_up.set(1)
        self.cpu_used: dict[int, float] = {}
        self._counted = 0
        self._series: dict[int, set[str]] = {}
        """The users each per-user gauge has a series of, by the gauge's id."""

    def observe_pass(self, daemon: Daemon, seconds: float) -> None:
        core = daemon.core
        self.pass_seconds.observe(seconds)
        self.queue_length.set(len(core.queue))
        running = core.running  # read, never changed here
        self.running.set(len(running))
        self.pending.set(len(core.jobs) - len(running))  # the core holds pending and running jobs only
        self.cores_total.set(daemon.cluster.cores)
        self.cores_allocated.set(sum(job.cores for job in running if job.host < 0))
        self.cores_lent.set(sum(job.quota for job in running if job.host >= 0))
        self.nodes_drained.set(len(daemon.drained))
        self.launches_waiting.set(len(daemon.launching))
        self.waiting_dependency.set(len(daemon.waiting))
        live = {job.id for job in running}
        self.cpu_used = {job_id: used for job_id, used in self.cpu_used.items() if job_id in live}
        self.cores_used.set(sum(self.cpu_used.values()))
        self._per_user(daemon, running)
        asax = daemon.asax
        if asax is None:
            return
        for decision in asax.since(self._counted):
            scores = [
                w * dist[decision.action] for w, dist in zip(decision.weights, decision.distributions, strict=True)
            ]
            best = max(range(len(scores)), key=scores.__getitem__)
            self.decisions.labels(decision.experts[best], decision.app_class).inc()
        self._counted = asax.decided
        names = asax.experts.names
        for app_class in asax.book.classes():
            for name, alpha in zip(names, asax.book.get(app_class).alpha, strict=True):
                self.weights.labels(app_class, name).set(float(alpha))

    def _per_user(self, daemon: Daemon, running: list[Job]) -> None:
        """Each user's running cores and fair-share factor; a user with neither leaves the series."""
        names = submissions.user_names(daemon)
        held: dict[str, float] = {}
        for job in running:
            user = names.get(job.user, "")
            held[user] = held.get(user, 0) + job.cores
        self._set_series(self.user_cores, held)
        policy = daemon.core.queue_policy
        if isinstance(policy, FairShare):
            self._set_series(self.user_fairshare, {names.get(n, ""): f for n, f in policy.factors.items()})

    def _set_series(self, gauge: Gauge, values: dict[str, float]) -> None:
        """One series per user, set; the series of users now gone removed (not all cleared first:
        a scrape meanwhile would see none)."""
        shown = self._series.setdefault(id(gauge), set())
        for gone in shown - values.keys():
            gauge.remove(gone)
        for label, value in values.items():
            gauge.labels(label).set(value)
        shown.clear()
        shown.update(values)

    def render(self) -> bytes:
        return generate_latest(self.registry)
