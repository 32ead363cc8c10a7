"""The waiting jobs of a queue policy whose priority grows with waiting time, as arrays.

Such a policy (`AgingPolicy`: WFP3, UNICEF) orders the queue anew at every pass, as
priorities change with time alone. Scoring thousands of waiting jobs one Python call
at a time made a pass cost more than everything else in a replay; here each job's
submit time and weight are kept in arrays, in the queue's arrival order, so a pass
scores them in a few vector operations and sorts only as far as it reads (`Ordered`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

import numpy as np

from cosched.model import Job

if TYPE_CHECKING:
    from cosched.policies.base import AgingPolicy


class Waiting:
    """Submit times and weights of the waiting jobs, index for index with the queue list."""

    __slots__ = ("_size", "policy", "submit", "weight")

    def __init__(self, policy: AgingPolicy) -> None:
        self.policy = policy
        self.submit = np.empty(64)
        self.weight = np.empty(64)
        self._size = 0

    def append(self, job: Job) -> None:
        size = self._size
        if size == len(self.submit):
            self.submit = np.resize(self.submit, 2 * size)
            self.weight = np.resize(self.weight, 2 * size)
        self.submit[size] = job.submit
        self.weight[size] = self.policy.weight(job)
        self._size = size + 1

    def delete(self, index: int) -> None:
        size = self._size - 1
        self.submit[index:size] = self.submit[index + 1 : size + 1]
        self.weight[index:size] = self.weight[index + 1 : size + 1]
        self._size = size

    def order(self, queue: list[Job], now: float, whole: bool) -> Sequence[Job]:
        """The queue in priority order at `now`: score = growth(waited) * weight, lowest first
        (ties in queue order); sorted only as far as it is read unless `whole`."""
        size = self._size
        scores = self.policy.growth(now - self.submit[:size]) * self.weight[:size]
        if whole:
            return list(map(queue.__getitem__, np.argsort(scores, kind="stable").tolist()))
        return Ordered(queue, scores)


class Ordered(Sequence[Job]):
    """A queue in order of score (ties in queue order), sorted only as far as it is read.

    A pass without backfilling reads its first job or first few; backfilling reads
    them all. The first `k` come from a partition, the whole from one sort.
    """

    __slots__ = ("_first", "_picked", "_queue", "_scores")

    def __init__(self, queue: list[Job], scores: np.ndarray) -> None:
        self._queue = queue
        self._scores = scores
        self._first: list[Job] = []
        """The first jobs in order, as far as they were read."""
        self._picked: list[int] = []
        """Their positions in the queue."""

    def positions(self, count: int) -> list[int]:
        """Where the first `count` jobs in order stand in the queue (to remove them without a search)."""
        self._read(count)
        return self._picked[:count]

    def __len__(self) -> int:
        return len(self._queue)

    @overload
    def __getitem__(self, index: int) -> Job: ...
    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...
    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            plain = index.step is None and (index.start or 0) >= 0 and index.stop is not None and index.stop >= 0
            return self._read(index.stop if plain else len(self._queue))[index]
        if index < 0:
            index += len(self._queue)
        if not 0 <= index < len(self._queue):
            raise IndexError(index)
        first = self._first
        return first[index] if index < len(first) else self._read(max(index + 1, 2 * len(first)))[index]

    def __iter__(self) -> Iterator[Job]:
        read = 0
        while read < len(self._queue):
            first = self._read(max(2 * read, 1))
            yield from first[read:]
            read = len(first)

    def _read(self, count: int) -> list[Job]:
        """The first `count` jobs in order (or more, when scores tie at the count)."""
        first, scores = self._first, self._scores
        size = len(scores)
        if min(count, size) <= len(first):
            return first
        if count == 1:
            picked = [int(np.argmin(scores))]  # the first of the lowest: queue order breaks ties
        elif 4 * count >= size:
            picked = np.argsort(scores, kind="stable").tolist()
        else:
            last = np.partition(scores, count - 1)[count - 1]
            chosen = np.flatnonzero(scores <= last)  # every job tied with the count-th comes in
            picked = chosen[np.argsort(scores[chosen], kind="stable")].tolist()
        self._picked = picked
        self._first = first = list(map(self._queue.__getitem__, picked))
        return first
