"""Node numbers kept in ascending order, at a cost per change that does not grow with the machine.

The pool hands out the lowest-numbered usable nodes (first fit) and gets nodes
back in any order as jobs end. A plain sorted list re-sorts or shifts every free
node at each end, so a replay's time per job grew with the machine's size
(256,000 cores: 80 times slower per job than 256). Here the nodes live in
buckets of at most `_SPLIT` sorted numbers: an end touches only the buckets its
nodes fall in, and first fit reads the first buckets.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import chain

_SPLIT = 1024
"""A bucket that grows past this many nodes is cut in two (a machine of 256 nodes keeps one bucket)."""


class SortedNodes:
    """A set of node numbers, iterated in ascending order."""

    __slots__ = ("_buckets", "_len", "_maxes")

    def __init__(self, nodes: Iterable[int] = ()) -> None:
        self._buckets: list[list[int]] = []
        self._maxes: list[int] = []
        """The largest node of each bucket, to find a node's bucket by bisection."""
        self._len = 0
        self.add(list(nodes))

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._buckets)

    def __repr__(self) -> str:
        return f"SortedNodes({list(self)})"

    @property
    def buckets(self) -> int:
        """How many buckets hold the nodes (tests check it stays small)."""
        return len(self._buckets)

    def first(self, k: int) -> list[int]:
        """The k lowest nodes (fewer if there are fewer)."""
        out: list[int] = []
        for bucket in self._buckets:
            if len(out) + len(bucket) >= k:
                return out + bucket[: k - len(out)]
            out += bucket
        return out

    def add(self, nodes: list[int]) -> None:
        """Insert nodes not yet held (the caller checks that)."""
        if not nodes:
            return
        buckets, maxes = self._buckets, self._maxes
        self._len += len(nodes)
        if len(buckets) <= 1:  # a small machine, or the first offer
            if not buckets:
                buckets.append([])
                maxes.append(0)
            bucket = buckets[0]
            bucket += nodes
            bucket.sort()
            maxes[0] = bucket[-1]
            self._split(0)
            return
        # Cut the sorted nodes into the runs that fall in one bucket: a job's nodes usually fall in one or two.
        nodes = sorted(nodes)
        runs: list[tuple[int, list[int]]] = []
        last, j = len(buckets) - 1, 0
        while j < len(nodes):
            i = min(bisect_left(maxes, nodes[j]), last)
            k = len(nodes) if i == last else bisect_right(nodes, maxes[i], j)
            runs.append((i, nodes[j:k]))
            j = k
        for i, run in reversed(runs):  # from the back, so splits do not shift the indexes still to do
            bucket = buckets[i]
            bucket += run
            bucket.sort()  # two sorted runs: a merge in C
            maxes[i] = bucket[-1]
            self._split(i)

    def remove(self, nodes: list[int]) -> None:
        """Take out nodes held (the caller checks that); first fit's prefix is the fast case."""
        if not nodes:
            return
        buckets, maxes = self._buckets, self._maxes
        self._len -= len(nodes)
        first = buckets[0]
        if first[: len(nodes)] == nodes:
            del first[: len(nodes)]
            self._tidy(0)
            return
        groups: dict[int, set[int]] = {}
        for node in nodes:
            groups.setdefault(bisect_left(maxes, node), set()).add(node)
        for i in sorted(groups, reverse=True):
            gone = groups[i]
            buckets[i] = [n for n in buckets[i] if n not in gone]
            self._tidy(i)

    def _split(self, i: int) -> None:
        """Cut bucket i into halves of `_SPLIT` when it outgrew it (the first offer cuts the whole machine)."""
        bucket = self._buckets[i]
        if len(bucket) <= _SPLIT:
            return
        size = _SPLIT // 2
        parts = [bucket[k : k + size] for k in range(0, len(bucket), size)]
        self._buckets[i : i + 1] = parts
        self._maxes[i : i + 1] = [part[-1] for part in parts]

    def _tidy(self, i: int) -> None:
        """Drop bucket i if it is empty, else record its new largest node."""
        bucket = self._buckets[i]
        if bucket:
            self._maxes[i] = bucket[-1]
        else:
            del self._buckets[i]
            del self._maxes[i]
