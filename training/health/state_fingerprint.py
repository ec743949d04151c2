"""A fingerprint of a training state (parameters, buffers, optimizer state, optionally gradients), computed on the
device where the tensors live, so that data-parallel replicas can be held to each other step by step
(``state_fingerprinted``; the fold that compares them is ``training.distributed.sdc``).

    fp = state_fingerprint(model, optimizer)            # {"name": (s0, s1), ...}, one host transfer
    root = fingerprint_root(fp)                        # 64 hex digits over every tensor's pair, in order

Each tensor is read as the integers of its bits (a float32 as int32, a bfloat16 as int16, a float64 as two int32
halves, a bool or int8 as int8), widened to int64, and reduced to two sums: ``s0`` = the sum of the integers and
``s1`` = the sum of each integer times its position (1, 2, ...), both modulo 2^64. So:

- one flipped bit changes ``s0`` always: it moves one integer by 2^k, k < 32, and ``s0`` of a tensor of fewer than
  2^32 elements never wraps;
- two values swapped, or a tensor permuted, leave ``s0`` and change ``s1`` by (i - j)(x_j - x_i) for a swap: never 0
  for a swap of different values in a tensor of fewer than 2^32 elements read as int32 or narrower (the product is
  under 2^64). Not an XOR of elements, which a permutation leaves alone (torchtitan's SDC hash);
- it is a check against corruption, not a cryptographic digest: whoever can write the state can make two states
  agree. The signature on the journal is what an attacker cannot forge.

The work, on the tensors' own device: their integers copied into a float64 buffer (``CHUNK`` elements, 16 MiB per
device, all the memory a call adds), many small tensors to a buffer; one matrix product per buffer, the rows' sums
and column-weighted sums, exact in float64; a few small integer sums per buffer; and one transfer of two integers
per tensor to the host at the end. Replicas compare equal exactly when their bits are equal: the same code on the same
kind of device gives the same sums (integer sums are exact and their order does not matter modulo 2^64).

Which tensors: the model's named parameters and buffers (``param:NAME``, ``buffer:NAME``) and every tensor in the
optimizer's state (``optim:NAME:KEY``, the parameter named as the model names it; a scalar ``step`` counter too),
and with ``grads=True`` each parameter's gradient (``grad:NAME``). A sharded tensor (a DTensor: FSDP2, HSDP,
tensor parallelism) is fingerprinted by this rank's own shard (``to_local()``, nothing gathered), and
:func:`replica_group` says which ranks hold the same shards, so that only those are held to each other.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

__all__ = ["CHUNK", "replica_group", "sums_of", "unsigned_pairs", "named_pairs", "tensor_sums", "state_fingerprint", "fingerprint_root", "pair_hex"]

#: the buffer is ROWS x COLS: each tensor's integers laid in whole rows (the last one padded with zeros), many small
#: tensors to a buffer, a large one over as many buffers as it needs. One matrix product per buffer gives each row's
#: sum and its sum weighted by the column (1..COLS): every term and partial sum an integer under 2^53, so float64
#: computes them exactly in any order (BLAS's, on the CPU or a GPU)
COLS = 2048
ROWS = 1024
CHUNK = ROWS * COLS
_MASK = (1 << 64) - 1
_BUF: dict[Any, tuple[Any, Any]] = {}  # device -> (the buffer, the COLS x 2 weights: ones and 1..COLS)


def _scratch(device: Any) -> tuple[Any, Any]:
    import torch

    s = _BUF.get(device)
    if s is None:
        w = torch.stack([torch.ones(COLS, dtype=torch.float64), torch.arange(1, COLS + 1, dtype=torch.float64)], 1)
        s = (torch.empty(ROWS, COLS, dtype=torch.float64, device=device), w.to(device))
        _BUF[device] = s
    return s


def _as_ints(t: Any) -> Any:
    """The tensor's bits as a flat tensor of signed integers of the same width (int32 halves for 8-byte types)."""
    import torch

    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.int8)
    size = flat.element_size()
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
        size = flat.element_size()
    if size == 8:
        return flat.view(torch.int32)  # two halves an element: every bit still counted, positions doubled
    if size == 4:
        return flat.view(torch.int32)
    if size == 2:
        return flat.view(torch.int16)
    if size == 1:
        return flat.view(torch.int8)
    raise TypeError(f"state fingerprint: no integer view for {t.dtype}")


def sums_of(tensors: list[Any]) -> Any:
    """An (n, 2) int64 tensor on the tensors' device (all on one): each tensor's (s0, s1) of the module docstring,
    as signed int64s.

    The tensors' integers are laid in the buffer row by row, each starting a new row; per buffer, X @ [1, 1..COLS]
    gives each row's sum r and column-weighted sum w (exact in float64), and a row that is row k of its tensor adds
    r to its s0 and k * COLS * r + w to its s1 (int64, modulo 2^64): sum((position + 1) * x) over the tensor."""
    import torch

    xs = [_as_ints(t if t.is_contiguous() else t.contiguous()) for t in tensors]
    device = xs[0].device if xs else "cpu"
    out = torch.zeros(len(xs), 2, dtype=torch.int64, device=device)
    if not xs:
        return out
    buf, weights = _scratch(device)
    flat = buf.view(-1)
    seg: list[int] = []  # the buffer's rows so far: their tensor, and their row within it
    local: list[int] = []

    def flush() -> None:
        k = len(seg)
        rw = torch.mm(buf[:k], weights).to(torch.int64)  # (k, 2): r, w
        idx = torch.tensor(seg, dtype=torch.int64, device=device)
        row = torch.tensor(local, dtype=torch.int64, device=device)
        out[:, 0].index_add_(0, idx, rw[:, 0])
        out[:, 1].index_add_(0, idx, row * COLS * rw[:, 0] + rw[:, 1])
        seg.clear()
        local.clear()

    for t_idx, x in enumerate(xs):
        n = x.numel()
        done = 0
        while done < n:
            if len(seg) == ROWS:
                flush()
            at = len(seg) * COLS
            m = min(n - done, (ROWS - len(seg)) * COLS)  # what fits in the buffer's free rows
            k = -(-m // COLS)
            flat[at:at + m].copy_(x[done:done + m])
            if m < k * COLS:
                flat[at + m:at + k * COLS].zero_()
            first = done // COLS
            seg.extend([t_idx] * k)
            local.extend(range(first, first + k))
            done += m
    if seg:
        flush()
    return out


def tensor_sums(t: Any) -> Any:
    """A 2-element int64 tensor on ``t``'s device: (s0, s1) of the module docstring, each as a signed int64."""
    return sums_of([t])[0]


def _local(t: Any) -> Any:
    """A DTensor's own shard on this rank (nothing gathered); any other tensor as it is."""
    return t.to_local() if hasattr(t, "device_mesh") and hasattr(t, "to_local") else t


def replica_group(model: Any) -> list[int] | None:
    """The global ranks whose parameters must equal this rank's, bit for bit, where the model's state is sharded:
    for each DTensor parameter, the ranks of its device mesh at this rank's coordinates along every dimension that
    is not ``Replicate`` (FSDP2 on a 1-D mesh: this rank alone; HSDP on a (replicate, shard) mesh: the ranks holding
    the same shard), intersected over the parameters; a model wrapped in the older ``FullyShardedDataParallel``
    (flat shards): this rank alone. None where nothing is sharded: every rank is a replica (DDP)."""
    group: set[int] | None = None
    for p in model.parameters():
        mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
        if mesh is None or placements is None:
            continue
        coord = mesh.get_coordinate()
        if coord is None:  # this rank is not in the parameter's mesh
            continue
        at = tuple(slice(None) if pl.is_replicate() else c for pl, c in zip(placements, coord))
        mine = {int(r) for r in mesh.mesh[at].reshape(-1).tolist()}
        group = mine if group is None else group & mine
    if group is not None:
        return sorted(group)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # a torch without distributed
        return None
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        import torch.distributed as dist

        return [dist.get_rank()] if dist.is_initialized() else [0]
    return None


def _named_state(model: Any, optimizer: Any, grads: bool) -> Iterable[tuple[str, Any]]:
    import torch

    names: dict[int, str] = {}
    if model is not None:
        for name, p in model.named_parameters():
            names[id(p)] = name
            yield f"param:{name}", _local(p)
        for name, b in model.named_buffers():
            yield f"buffer:{name}", _local(b)
        if grads:
            for name, p in model.named_parameters():
                if p.grad is not None:
                    yield f"grad:{name}", _local(p.grad)
    if optimizer is not None:
        k = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p)
                pname = names.get(id(p), f"#{k}")
                k += 1
                if not state:
                    continue
                for key in sorted(state):
                    v = state[key]
                    if isinstance(v, torch.Tensor):
                        yield f"optim:{pname}:{key}", _local(v)


def unsigned_pairs(sums: Any) -> list[tuple[int, int]]:
    """:func:`sums_of`'s (n, 2) tensor on the host, each pair as unsigned integers (< 2^64): one transfer."""
    return [(a & _MASK, b & _MASK) for a, b in sums.cpu().tolist()]


def named_pairs(named: Iterable[tuple[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each named tensor's (s0, s1) pair (unsigned, < 2^64), in the order given; one transfer to the host per
    device."""
    names: list[str] = []
    tensors: list[Any] = []
    for name, t in named:
        names.append(name)
        tensors.append(t)
    by_device: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    values: list[tuple[int, int]] = [(0, 0)] * len(tensors)
    for idx in by_device.values():
        for i, pair in zip(idx, unsigned_pairs(sums_of([tensors[i] for i in idx]))):
            values[i] = pair
    return dict(zip(names, values))


def state_fingerprint(model: Any = None, optimizer: Any = None, *, grads: bool = False,
                      exclude: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
    """Every tensor of the state, by name, as its (s0, s1) pair (unsigned, < 2^64), in a fixed order: the model's
    parameters, its buffers, the gradients (``grads=True``), then the optimizer's state. Names in ``exclude`` are
    left out, and every name that starts with one ending in ``*`` (``buffer:*``: every buffer). One transfer to the
    host per device."""
    skip = {e for e in exclude if not e.endswith("*")}
    prefixes = tuple(e[:-1] for e in exclude if e.endswith("*"))
    return named_pairs((name, t) for name, t in _named_state(model, optimizer, grads)
                       if not (name in skip or (prefixes and name.startswith(prefixes))))


def pair_hex(pair: tuple[int, int]) -> str:
    """A tensor's pair as 32 hex digits (s0 then s1): what a journal records per tensor."""
    return f"{pair[0]:016x}{pair[1]:016x}"


def fingerprint_root(fp: dict[str, tuple[int, int]]) -> str:
    """SHA-256 over every tensor's name and pair, in order: equal exactly when every tensor's pair is equal."""
    h = hashlib.sha256()
    for name, pair in fp.items():
        h.update(name.encode() + b"\0" + bytes.fromhex(pair_hex(pair)) + b"\n")
    return h.hexdigest()
