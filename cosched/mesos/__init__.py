"""cosched's Mesos backend, protocol layer: a v1 HTTP scheduler client (no pymesos; see docs/mesos.md).

Light on purpose (standard library only), so the daemon can import it without pulling anything heavy.
"""

from cosched.mesos.errors import CallError, MesosError, NotSubscribed, RecordIOError
from cosched.mesos.handler import EventHandler
from cosched.mesos.scheduler import SchedulerClient, SchedulerConfig

__all__ = [
    "CallError",
    "EventHandler",
    "MesosError",
    "NotSubscribed",
    "RecordIOError",
    "SchedulerClient",
    "SchedulerConfig",
]
