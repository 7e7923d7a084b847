"""How the ranks' partial sums meet: the all-reduce, the communicators it runs on, a ring of threads to test it.

Plug points (Lab 09).  How a weight is split and how the partial sums meet are functions the caller can
replace: ``column_shard(weight, rank, world_size)`` and ``row_shard(weight, rank, world_size)`` return a
rank's slice of a ``[out, in]`` weight, and ``all_reduce(tensor, comm)`` returns the sum over the ranks,
built from :meth:`Communicator.ring_exchange` (send to the next rank, receive from the previous one, as
``MPI_Sendrecv`` does).  :func:`ring_all_reduce` is the course's: a reduce-scatter then an all-gather, each
rank sending 2(p-1)/p of the tensor.  Without a plug, the all-reduce is gloo's own ``dist.all_reduce``.
:class:`ThreadRing` runs an all-reduce on p threads in one process, to test it without starting processes.

"""
from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor, comm) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks, the same bits on every rank, by a ring (Patarasuk and Yuan, 2009).

    The flattened tensor is cut into p chunks.  Reduce-scatter: in p-1 exchanges each rank passes a partial sum of
    one chunk to the next rank and adds what the previous rank sent; after them rank r holds chunk (r+1) mod p
    summed over every rank.  All-gather: p-1 more exchanges pass the finished chunks around, copied, not added, so
    every rank ends with identical bits (ranks that summed in their own order could pick different tokens).  Each
    rank sends 2(p-1)/p of the tensor, whatever p is: the reason rings scale.
    """
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    flat = tensor.detach().reshape(-1).clone()
    chunks = flat.tensor_split(p)  # views into flat: filling a chunk fills the result
    for step in range(p - 1):  # reduce-scatter
        send, recv = (r - step) % p, (r - step - 1) % p
        incoming = comm.ring_exchange(chunks[send], torch.empty_like(chunks[recv]))
        chunks[recv].add_(incoming)
    for step in range(p - 1):  # all-gather
        send, recv = (r + 1 - step) % p, (r - step) % p
        comm.ring_exchange(chunks[send], chunks[recv])
    return flat.view_as(tensor)


class Communicator:
    """What an ``all_reduce`` plug may use: its ``rank``, the ``world_size``, and one ring exchange.

    ``ring_exchange(send, recv)`` sends ``send`` to rank (rank+1) mod p, receives what rank (rank-1) mod p sent into
    ``recv`` (same number of elements and dtype as that rank's ``send``), and returns ``recv``.  Every rank must call
    it the same number of times.  ``bytes_sent`` counts what this rank sent.
    """

    rank: int
    world_size: int
    bytes_sent: int = 0

    def ring_exchange(self, send: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _check(self, send, recv):
        for name, t in (("send", send), ("recv", recv)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"ring_exchange: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not recv.is_contiguous():
            raise ValueError("ring_exchange: recv must be contiguous (it is filled in place); "
                             "use torch.empty_like(...) or a slice of a flat tensor")


class GlooComm(Communicator):
    """The ring over torch.distributed point-to-point messages (this process's rank in the default group)."""

    def __init__(self, group=None):
        self.group, self.rank, self.world_size = group, dist.get_rank(group), dist.get_world_size(group)
        self.bytes_sent = 0

    def ring_exchange(self, send, recv):
        self._check(send, recv)
        send = send.detach().contiguous()
        # Post the send before the blocking receive: with both blocking, every rank would wait on its neighbour.
        pending = dist.isend(send, (self.rank + 1) % self.world_size, group=self.group)
        dist.recv(recv, (self.rank - 1) % self.world_size, group=self.group)
        pending.wait()
        self.bytes_sent += send.numel() * send.element_size()
        return recv


class ThreadRing:
    """p ranks as threads of one process, joined in a ring by queues: test an all-reduce without processes.

        results = ThreadRing(3).run(lambda comm, x: my_all_reduce(x, comm), [x0, x1, x2])

    A rank that raises stops the others; a rank left waiting ``timeout_s`` for its neighbour (an unequal number
    of exchanges) raises TimeoutError naming both.
    """

    def __init__(self, world_size: int, timeout_s: float = 10.0):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        self.world_size, self.timeout_s = world_size, timeout_s
        self.failed = threading.Event()
        self.comms = [_ThreadComm(self, r) for r in range(world_size)]

    def run(self, fn, inputs: list) -> list:
        """``fn(comm, inputs[r])`` on rank r's thread, for every rank at once; the return values, by rank."""
        if len(inputs) != self.world_size:
            raise ValueError(f"inputs must hold one entry per rank ({self.world_size}), got {len(inputs)}")
        results, errors = [None] * self.world_size, [None] * self.world_size

        def body(r):
            try:
                results[r] = fn(self.comms[r], inputs[r])
            except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors[r] = e
                self.failed.set()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s + 5)
        first = next(((r, e) for r, e in enumerate(errors) if e is not None and not isinstance(e, _Stopped)), None)
        if first is not None:
            raise first[1]
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"the ranks did not finish within {self.timeout_s + 5:.0f} s")
        return results


class _Stopped(Exception):
    """Another rank failed; this one stops waiting."""


class _ThreadComm(Communicator):
    def __init__(self, ring: ThreadRing, rank: int):
        self.ring, self.rank, self.world_size = ring, rank, ring.world_size
        self.inbox, self.bytes_sent, self.exchanges = queue.Queue(), 0, 0

    def ring_exchange(self, send, recv):
        self._check(send, recv)
        p = self.world_size
        self.ring.comms[(self.rank + 1) % p].inbox.put(send.detach().clone())
        self.bytes_sent += send.numel() * send.element_size()
        self.exchanges += 1
        deadline = time.monotonic() + self.ring.timeout_s
        while True:
            if self.ring.failed.is_set():
                raise _Stopped()
            try:
                got = self.inbox.get(timeout=0.05)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.ring.failed.set()
                    raise TimeoutError(
                        f"rank {self.rank} waited {self.ring.timeout_s:.0f} s in its exchange {self.exchanges} for rank "
                        f"{(self.rank - 1) % p}: every rank must call ring_exchange the same number of times") from None
        if got.numel() != recv.numel() or got.dtype != recv.dtype:
            self.ring.failed.set()
            raise ValueError(f"ring_exchange on rank {self.rank}: rank {(self.rank - 1) % p} sent {got.numel()} "
                             f"{got.dtype} values, but recv holds {recv.numel()} {recv.dtype} values")
        recv.copy_(got.reshape(recv.shape))
        return recv
