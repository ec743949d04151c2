"""What the tests that launch real torchrun jobs share: a free port for the rendezvous, and an event's kind."""

from __future__ import annotations

import socket
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kind(ev: Any) -> str:
    """The kind of an event read back from a journal (its tag)."""
    return type(ev).__struct_config__.tag
