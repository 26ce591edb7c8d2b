"""An indexed binary heap of typed entries: the simulator's finish heaps (a replica's decoding
requests by the step of their last token, sim/replica.py) and its run-boundary heap (the replicas
by the time of their next boundary, sim/simulation.py).

WHY not ``heapq``: it orders tuples, so every push allocated one with boxed numbers, compared them
generically, and left a stale tuple behind whenever an entry's key moved (a preempted request, a run
cut short), to be skipped when it reached the top; those tuples were a tenth of the compiled run
(docs/simulator.md, Speed). Here the entries are the objects themselves (subclasses of
:class:`HeapEntry`), ordered by typed attributes that mypyc compares natively, and each knows its
place, so a key that moves is moved in place and an entry that leaves goes at once. The order is the
tuples' order: by key, then by sequence number (the caller's: the order keys were set in).
"""

from __future__ import annotations


class HeapEntry:
    """What an :class:`IndexedHeap` orders: its key, the sequence number that breaks ties, and its
    place in the heap."""

    __slots__ = ("key", "seq", "pos")

    def __init__(self) -> None:
        #: what the heap orders by (a step number, a time) ...
        self.key = 0.0
        #: ... then by this
        self.seq = 0
        #: the entry's place in the heap (-1: not in it)
        self.pos = -1


class IndexedHeap:
    """Entries, the smallest ``(key, seq)`` first."""

    __slots__ = ("heap",)

    def __init__(self) -> None:
        #: the entries in heap order (``heap[0]`` comes first)
        self.heap: list[HeapEntry] = []

    def place(self, entry: HeapEntry, key: float, seq: int) -> None:
        """``entry`` now comes at ``(key, seq)``: added, or moved where it is already in."""
        entry.key = key
        entry.seq = seq
        k = entry.pos
        if k < 0:
            k = len(self.heap)
            self.heap.append(entry)
        self._down(self._up(k, entry), entry)

    def pop(self) -> HeapEntry:
        """Remove and return the first entry (the heap is not empty)."""
        heap = self.heap
        entry = heap[0]
        entry.pos = -1
        last = heap.pop()
        if heap:
            self._down(0, last)
        return entry

    def remove(self, entry: HeapEntry) -> None:
        """Take ``entry`` out (nothing when it is not in)."""
        k = entry.pos
        if k < 0:
            return
        entry.pos = -1
        last = self.heap.pop()
        if last is not entry:
            self._down(self._up(k, last), last)

    def _up(self, k: int, entry: HeapEntry) -> int:
        """Move ``entry``, entering at place ``k``, towards the root; returns its place."""
        heap = self.heap
        while k > 0:
            p = (k - 1) >> 1
            other = heap[p]
            if not _before(entry, other):
                break
            heap[k] = other
            other.pos = k
            k = p
        heap[k] = entry
        entry.pos = k
        return k

    def _down(self, k: int, entry: HeapEntry) -> None:
        """Move ``entry``, entering at place ``k``, towards the leaves."""
        heap = self.heap
        n = len(heap)
        while True:
            c = 2 * k + 1
            if c >= n:
                break
            child = heap[c]
            if c + 1 < n and _before(heap[c + 1], child):
                c += 1
                child = heap[c]
            if not _before(child, entry):
                break
            heap[k] = child
            child.pos = k
            k = c
        heap[k] = entry
        entry.pos = k


def _before(a: HeapEntry, b: HeapEntry) -> bool:
    return a.key < b.key or (a.key == b.key and a.seq < b.seq)
