"""What the tests that launch real torchrun jobs share: a free port for the rendezvous, a job launched on
127.0.0.1 outside any torchrun this process may be in, and an event's kind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kind(ev: Any) -> str:
    """The kind of an event read back from a journal (its tag)."""
    return type(ev).__struct_config__.tag


def torchrun(worker: Path, args: list[str], *, nproc: int, name: str, cwd: Path,
             timeout: int = 300, restarts: int = 0) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run`` of ``worker`` on ``nproc`` local ranks, a rendezvous of its own (id
    ``name``, a free port), one thread each, and none of the torchrun or trainledger run identity of the caller's
    environment: the completed process, its output captured."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("TRAINLEDGER_RUN", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--rdzv-id", name,
                           f"--max-restarts={restarts}", str(worker), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
