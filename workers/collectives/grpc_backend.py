"""The CPU-mediated baseline: ranks send serialized tensors to a gRPC reduction server.

Rank 0 runs `ReductionServer`; every rank (rank 0 too, over its own loopback) sends its buffer
as raw float32 bytes in one unary call and gets its share of the result back. The server waits
until all ranks of a round (a per-client sequence number, equal across ranks because every rank
calls the same collectives in the same order) have arrived, reduces or gathers with numpy, and
answers each. No protobuf: a generic handler with bytes in and bytes out, the round's
description in the call's metadata. GPU tensors are copied to the host and back, in the time.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import torch

SERVICE = "trainmaster.Collectives"
METHOD = "Run"
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def combine(op: str, parts: Mapping[int, bytes], world_size: int, root: int = 0) -> list[bytes]:
    """What each rank gets back once every rank's `parts[rank]` arrived (float32 sums)."""
    ranks = range(world_size)
    if op == "all_gather":
        gathered = b"".join(parts[r] for r in ranks)
        return [gathered] * world_size
    if op == "broadcast":
        return [b"" if r == root else parts[root] for r in ranks]
    if op not in ("all_reduce", "reduce_scatter"):
        raise ValueError(f"unknown collective {op!r}")
    total = np.frombuffer(parts[0], dtype=np.float32).copy()
    for r in ranks[1:]:
        total += np.frombuffer(parts[r], dtype=np.float32)
    if op == "all_reduce":
        reduced = total.tobytes()
        return [reduced] * world_size
    chunk = len(total) // world_size
    return [total[r * chunk : (r + 1) * chunk].tobytes() for r in ranks]


@dataclass
class _Round:
    parts: dict[int, bytes] = field(default_factory=dict)
    results: list[bytes] | None = None
    served: int = 0


class ReductionServer:
    """Collects one buffer per rank per round, combines them, answers every rank."""

    def __init__(self, world_size: int, *, host: str = "0.0.0.0", port: int = 0, timeout_s: float = 600.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._rounds: dict[int, _Round] = {}
        self._cond = threading.Condition()
        # One thread per rank: each handler blocks until its round is complete.
        self._server = grpc.server(ThreadPoolExecutor(max_workers=world_size + 2), options=UNLIMITED)
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(self._run)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port(f"{host}:{port}")

    def start(self) -> ReductionServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1).wait()

    def _run(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        meta = {item.key: item.value for item in context.invocation_metadata()}
        seq, rank, root, op = int(meta["tm-seq"]), int(meta["tm-rank"]), int(meta["tm-root"]), str(meta["tm-op"])
        with self._cond:
            current = self._rounds.setdefault(seq, _Round())
            current.parts[rank] = request
            if len(current.parts) == self.world_size:
                current.results = combine(op, current.parts, self.world_size, root)
                current.parts.clear()
                self._cond.notify_all()
            elif not self._cond.wait_for(lambda: current.results is not None, timeout=self.timeout_s):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{op} round {seq}: not every rank arrived")
            assert current.results is not None
            answer = current.results[rank]
            current.served += 1
            if current.served == self.world_size:
                del self._rounds[seq]
        return answer


def _payload(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().cpu().numpy().tobytes()


def _write(target: torch.Tensor, data: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only buffer: we only read from it
        source = torch.frombuffer(data, dtype=torch.float32)
    target.copy_(source)


class GrpcCommunicator:
    """A rank's side of the baseline; implements `torch_backend.Communicator`."""

    name = "grpc"

    def __init__(self, address: str, rank: int, device: torch.device, *, timeout_s: float = 600.0):
        self.rank = rank
        self.device = device
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=UNLIMITED)
        self._call: Any = self._channel.unary_unary(f"/{SERVICE}/{METHOD}")
        self._seq = 0

    def close(self) -> None:
        self._channel.close()

    def _exchange(self, op: str, payload: bytes, root: int = 0) -> bytes:
        self._seq += 1
        metadata = (("tm-seq", str(self._seq)), ("tm-rank", str(self.rank)), ("tm-op", op), ("tm-root", str(root)))
        return bytes(self._call(payload, metadata=metadata, timeout=self.timeout_s))

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        _write(recv, self._exchange("all_reduce", _payload(send)))

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        _write(recv, self._exchange("all_gather", _payload(send)))

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        _write(recv, self._exchange("reduce_scatter", _payload(send)))

    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> None:
        if self.rank == root:
            self._exchange("broadcast", _payload(send), root)
            if recv is not send:
                recv.copy_(send)
        else:
            _write(recv, self._exchange("broadcast", b"", root))

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
