"""Weight sync from the trainer to the generators: one collective broadcast, the version with the weights.

    sync = WeightSync(host, port, rank, world, transport)   # rank 0: the trainer's rank 0; 1..world-1: generators
    sync.send(version, weights)                             # rank 0
    version, weights = sync.recv(layout)                    # generators; layout: {name: (shape, dtype)}
    sync.close()

A group of its own (a TCPStore at host:port and a process group over it), apart from the trainer's
data-parallel group: the two share only the trainer's rank 0. Rank 0 starts the store. A group is opened
again (new port) when a member is replaced, e.g. a restarted generator.

Transports, one interface:
- "gloo": CPU tensors, any machines (the CPU runs and tests).
- "nccl": between distinct GPUs (a generator and a trainer on GPUs of their own, on one node or several).
- "cuda_ipc": trainer and generator sharing ONE GPU (NCCL refuses two ranks on one device): rank 0 keeps
  one flat GPU buffer per dtype and shares CUDA IPC handles through the store once; each send copies the
  weights into it, publishes the version, and waits until every generator has copied it out (GPU to GPU, no
  host round trip).

On the wire: a header (version, a hash of the names, shapes and dtypes, which both sides must agree on)
then one flat buffer per dtype, tensors in sorted name order. Only bits move: received weights equal the
sent ones bitwise.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import pickle
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import reduce_tensor

from ..trainer.distributed import apply_nccl_invariance_env

__all__ = ["TRANSPORTS", "WeightSync", "layout_of", "pick_transport"]

TRANSPORTS = ("gloo", "nccl", "cuda_ipc")
Layout = dict  # name -> (shape tuple, dtype)


def layout_of(weights: dict[str, torch.Tensor]) -> Layout:
    return {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}


def pick_transport(device: str, shares_gpu: bool) -> str:
    """gloo on the CPU; on GPUs, cuda_ipc when the generators share the trainer's GPU, else nccl."""
    if not str(device).startswith("cuda"):
        return "gloo"
    return "cuda_ipc" if shares_gpu else "nccl"


def _layout_hash(layout: Layout) -> int:
    text = ";".join(f"{k}:{tuple(s)}:{d}" for k, (s, d) in sorted(layout.items()))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")


def _by_dtype(layout: Layout) -> dict[torch.dtype, list[str]]:
    out: dict[torch.dtype, list[str]] = defaultdict(list)
    for k in sorted(layout):
        out[layout[k][1]].append(k)
    return dict(sorted(out.items(), key=lambda kv: str(kv[0])))


def _flat_numel(layout: Layout, names: list[str]) -> int:
    """Elements of the flat buffer that carries ``names``."""
    return sum(math.prod(layout[k][0]) for k in names)


def _check_layout(digest: int, layout: Layout) -> None:
    if digest != _layout_hash(layout):
        raise RuntimeError("weight sync: the trainer's weights (names, shapes, dtypes) differ from the generator's model")


def _unflatten(flat: dict[torch.dtype, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    out = {}
    for dtype, names in _by_dtype(layout).items():
        offset = 0
        for k in names:
            shape = layout[k][0]
            n = math.prod(shape)
            out[k] = flat[dtype][offset:offset + n].view(shape)
            offset += n
    return out


class WeightSync:
    def __init__(self, host: str, port: int, rank: int, world: int, transport: str = "gloo",
                 device: str | torch.device = "cpu", timeout_s: float = 600.0):
        if transport not in TRANSPORTS:
            raise ValueError(f"weight sync transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
        self.rank, self.world, self.transport = rank, world, transport
        self.device = torch.device(device)
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
        self._shared: dict[torch.dtype, torch.Tensor] | None = None  # cuda_ipc: the flat buffers
        self._sent = 0
        if transport == "gloo":
            self.pg = dist.ProcessGroupGloo(self.store, rank, world, timeout)
        elif transport == "nccl":
            apply_nccl_invariance_env()  # read when the communicator is created; a broadcast moves bits either way
            torch.cuda.set_device(self.device)
            opts = dist.ProcessGroupNCCL.Options()
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world, opts)
        else:
            self.pg = None

    # ------------------------------------------------------------------------------- collectives
    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()

    def send(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Rank 0: broadcast ``weights`` (full tensors) under ``version``."""
        layout = layout_of(weights)
        groups = _by_dtype(layout)
        if self.transport == "cuda_ipc":
            return self._send_ipc(version, weights, layout, groups)
        header = torch.tensor([version, _layout_hash(layout)], dtype=torch.int64, device=self._wire_device)
        self._broadcast(header)
        for dtype, names in groups.items():
            flat = torch.cat([weights[k].detach().reshape(-1).to(self._wire_device) for k in names])
            self._broadcast(flat)

    def recv(self, layout: Layout) -> tuple[int, dict[str, torch.Tensor]]:
        """Generators: (version, weights) of rank 0's next send, as new tensors on this rank's device."""
        if self.transport == "cuda_ipc":
            return self._recv_ipc(layout)
        header = torch.zeros(2, dtype=torch.int64, device=self._wire_device)
        self._broadcast(header)
        version, digest = (int(x) for x in header.tolist())
        _check_layout(digest, layout)
        flat = {}
        for dtype, names in _by_dtype(layout).items():
            flat[dtype] = torch.empty(_flat_numel(layout, names), dtype=dtype, device=self._wire_device)
            self._broadcast(flat[dtype])
        return version, _unflatten(flat, layout)

    @property
    def _wire_device(self) -> torch.device:
        return torch.device("cpu") if self.transport == "gloo" else self.device

    # ---------------------------------------------------------------------------------- cuda_ipc
    def _send_ipc(self, version, weights, layout, groups) -> None:
        if self._shared is None:
            self._shared = {d: torch.empty(_flat_numel(layout, names), dtype=d, device=self.device)
                            for d, names in groups.items()}
            handles = {d: reduce_tensor(t) for d, t in self._shared.items()}
            self.store.set("ipc/handles", pickle.dumps((_layout_hash(layout), handles)))
        elif self._sent:  # the generators must have copied the previous version out before it is overwritten
            self.store.wait([f"ipc/ack/{self._sent}/{r}" for r in range(1, self.world)])
        for d, names in groups.items():
            torch.cat([weights[k].detach().reshape(-1) for k in names], out=self._shared[d])
        torch.cuda.synchronize(self.device)
        self._sent += 1
        self.store.set(f"ipc/version/{self._sent}", str(version))

    def _recv_ipc(self, layout: Layout) -> tuple[int, dict[str, torch.Tensor]]:
        if self._shared is None:
            digest, handles = pickle.loads(self.store.get("ipc/handles"))
            _check_layout(digest, layout)
            self._shared = {d: fn(*args) for d, (fn, args) in handles.items()}
        self._sent += 1
        version = int(self.store.get(f"ipc/version/{self._sent}"))
        flat = copy_out(self._shared, self.device)
        self.store.set(f"ipc/ack/{self._sent}/{self.rank}", "1")
        return version, _unflatten(flat, layout)

    def close(self) -> None:
        self.pg = None
        self._shared = None
        self.store = None


def copy_out(shared: dict[torch.dtype, torch.Tensor], device) -> dict[torch.dtype, torch.Tensor]:
    """Copies of the shared buffers, complete on return. On a stream of its own, synchronized alone: the
    generator's engine may be capturing a decode graph in another thread of this process, and during a capture
    a device-wide synchronize (or work on the legacy default stream) fails with 'operation not permitted when
    stream is capturing'."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        flat = {d: t.clone() for d, t in shared.items()}
    stream.synchronize()
    return flat
