"""The C2SP witness protocol over HTTP, both sides (https://c2sp.org/tlog-witness), and a read-only server for a
log folder (tlog-tiles).

The witness (:class:`HttpWitness`, ``trainledger witness serve``): ``POST <prefix>/add-checkpoint`` with ``old
<size>``, up to 63 base64 consistency-proof lines, a blank line and the checkpoint note. It answers as the spec
says, in its order:

- 400 a body that does not parse, a proof when the old size is 0, or an old size above the checkpoint's;
- 404 an origin it follows no log for; 403 no signature verifies under that log's keys;
- 409 (``Content-Type: text/x.tlog.size``, the size it last cosigned and a newline) an old size that is not the
  one it last cosigned for the origin; 409 too for the same size with another root (a fork);
- 422 a consistency proof that does not hold;
- 200 its cosignature lines (Ed25519, and ML-DSA-44 with ``ml_dsa``), with the time of signing (never 0), after
  the new state is on disk (fsynced, renamed into place), the check and the update done under one lock so two
  requests cannot roll each other back.

The client (:func:`add_checkpoint`, :func:`submit`) sends a log's checkpoint and follows a 409 to the size the
witness says it has. Every server binds 127.0.0.1 unless told otherwise, reads at most :data:`MAX_BODY` bytes of
a request, and gives each connection :data:`TIMEOUT_S`.
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from trainledger.journal.errors import TrainledgerError
from trainledger.journal.merkle import ProofError, verify_consistency
from trainledger.journal.note import (NoteError, Verifier, b64_hash, cosign, cosigner_key, decimal, open_note,
                                      parse_checkpoint)

__all__ = ["HttpWitness", "add_checkpoint", "submit", "serve_witness", "serve_folder", "Submitted", "MAX_BODY",
           "TIMEOUT_S", "SIZE_TYPE", "mldsa_key"]

#: the largest request body a witness reads (63 proof lines and a checkpoint with its signatures)
MAX_BODY = 1 << 18
#: seconds a connection may take
TIMEOUT_S = 10
SIZE_TYPE = "text/x.tlog.size"
#: the info an ML-DSA-44 witness key's seed is derived under, from the witness's Ed25519 key file
MLDSA_LABEL = b"trainledger witness ML-DSA-44 key v1"


def mldsa_key(signer: Any) -> Any:
    """The witness's ML-DSA-44 key: its seed derived from the witness's Ed25519 key file (HKDF, its own label), so
    one key file keeps both."""
    from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA44PrivateKey

    return MLDSA44PrivateKey.from_seed_bytes(signer.derived_seed(MLDSA_LABEL))


class _Answer(TrainledgerError):
    """A witness's answer other than 200, raised inside a request and turned into the HTTP response."""

    exit_code = 1

    def __init__(self, status: int, body: str = "", ctype: str = "text/plain; charset=utf-8"):
        super().__init__(body)
        self.status, self.body, self.ctype = status, body, ctype


def _parse_request(body: bytes) -> tuple[int, list[bytes], str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Answer(400, "the request is not UTF-8\n") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise _Answer(400, "no blank line before the checkpoint\n")
    lines = head.split("\n")
    old = decimal(lines[0][4:]) if lines[0].startswith("old ") else None
    if old is None:
        raise _Answer(400, "the first line is not 'old <size>'\n")
    if len(lines) - 1 > 63:
        raise _Answer(400, "more than 63 consistency proof lines\n")
    proof = [b64_hash(line) for line in lines[1:]]
    if any(h is None for h in proof):
        raise _Answer(400, "a consistency proof line is not a base64 32-byte hash\n")
    return old, [h for h in proof if h is not None], note


class HttpWitness:
    """A witness: its name, its Ed25519 key (and, with ``ml_dsa``, the ML-DSA-44 key derived from it), the logs it
    follows (``logs``: their Ed25519 note keys, each named by its origin) and its state file (per origin the size and
    root it last cosigned; JSON, replaced atomically)."""

    def __init__(self, name: str, signer: Any, state: str | os.PathLike, logs: Sequence[Verifier], *,
                 ml_dsa: bool = False, clock: Callable[[], float] = time.time):
        from trainledger.journal.note import _valid_name

        _valid_name(name)
        self.name, self.signer, self.state, self.clock = name, signer, Path(state), clock
        self.mldsa = mldsa_key(signer) if ml_dsa else None
        self.logs: dict[str, list[Verifier]] = {}
        for v in logs:
            self.logs.setdefault(v.name, []).append(v)
        self._lock = threading.Lock()

    def vkeys(self) -> list[str]:
        """Its verifier keys, for a policy file's witness lines (Ed25519 first)."""
        out = [cosigner_key(self.name, self.signer.public.raw)]
        if self.mldsa is not None:
            out.append(cosigner_key(self.name, self.mldsa.public_key().public_bytes_raw()))
        return out

    def _load(self) -> dict[str, Any]:
        from trainledger.journal.paths import read_regular

        try:
            data = read_regular(self.state, 16 << 20, what="witness state", owned=True)
        except FileNotFoundError:
            return {}
        d = json.loads(data)
        if not isinstance(d, dict):
            raise ValueError(f"{self.state}: not a witness state file")
        return d

    def add_checkpoint(self, body: bytes) -> tuple[int, str, str]:
        """One ``add-checkpoint`` request: (status, content type, body)."""
        try:
            return 200, "text/plain; charset=utf-8", self._add(body)
        except _Answer as a:
            return a.status, a.ctype, a.body

    def _add(self, body: bytes) -> str:
        old, proof, note = _parse_request(body)
        cut = note.rfind("\n\n")
        try:
            cp = parse_checkpoint(note[:cut + 1] if cut >= 0 else note)
        except NoteError as e:
            raise _Answer(400, f"the checkpoint does not parse: {e}\n") from None
        keys = self.logs.get(cp.origin)
        if not keys:
            raise _Answer(404, f"unknown log origin {cp.origin[:100]}\n")
        try:
            open_note(note, keys)
        except NoteError:
            raise _Answer(403, "no signature by this log's key verifies\n") from None
        if old > cp.size:
            raise _Answer(400, f"old size {old} is above the checkpoint's size {cp.size}\n")
        if old == 0 and proof:
            raise _Answer(400, "a consistency proof from size 0 must be empty\n")
        text = note[:cut + 1]
        with self._lock:  # this process's threads; the file lock keeps other processes out
            fd = os.open(self.state.with_name(self.state.name + ".lock"),
                         os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = self._load()
                prev = st.get(cp.origin)
                have = int(prev["size"]) if prev else 0
                if old != have:
                    raise _Answer(409, f"{have}\n", SIZE_TYPE)
                if prev and cp.size == have and base64.b64decode(prev["root"]) != cp.root:
                    raise _Answer(409, f"{have}\n", SIZE_TYPE)
                if prev and cp.size > have:
                    try:
                        verify_consistency(have, cp.size, base64.b64decode(prev["root"]), cp.root, proof)
                    except ProofError as e:
                        raise _Answer(422, f"the consistency proof does not hold: {e}\n") from None
                now = max(1, int(self.clock()))
                lines = cosign(text, self.name, self.signer, now)
                if self.mldsa is not None:
                    lines += cosign(text, self.name, self.mldsa, now)
                st[cp.origin] = {"size": cp.size, "root": base64.b64encode(cp.root).decode(), "time": now}
                from trainledger.journal.paths import write_atomically

                write_atomically(self.state, json.dumps(st, indent=1, sort_keys=True).encode(), 0o600)
            finally:
                os.close(fd)
        return lines


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _handler(post: Callable[[str, bytes], tuple[int, str, bytes]] | None,
             get: Callable[[str], tuple[int, str, bytes, dict[str, str]]] | None) -> type:
    class Handler(BaseHTTPRequestHandler):
        timeout = TIMEOUT_S
        server_version = "trainledger"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _send(self, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            if post is None:
                return self._send(405, "text/plain; charset=utf-8", b"read-only\n")
            try:
                n = int(self.headers.get("Content-Length", ""))
            except ValueError:
                return self._send(411, "text/plain; charset=utf-8", b"Content-Length required\n")
            if not 0 <= n <= MAX_BODY:
                return self._send(413, "text/plain; charset=utf-8", f"at most {MAX_BODY} bytes\n".encode())
            body = self.rfile.read(n)
            status, ctype, out = post(self.path, body)
            self._send(status, ctype, out)

        def do_GET(self) -> None:  # noqa: N802
            if get is None:
                return self._send(404, "text/plain; charset=utf-8", b"not found\n")
            status, ctype, out, headers = get(self.path)
            self._send(status, ctype, out, headers)

        do_HEAD = do_GET

    return Handler


def serve_witness(witness: HttpWitness, port: int, *, host: str = "127.0.0.1", prefix: str = "") -> _Server:
    """A started server (a daemon thread) for ``witness`` at ``http://host:port<prefix>/add-checkpoint``; call
    ``shutdown()`` to stop it. Port 0 picks a free one (``server_address``)."""
    def post(path: str, body: bytes) -> tuple[int, str, bytes]:
        if path.split("?")[0] != f"{prefix}/add-checkpoint":
            return 404, "text/plain; charset=utf-8", b"not found\n"
        status, ctype, out = witness.add_checkpoint(body)
        return status, ctype, out.encode()

    server = _Server((host, port), _handler(post, None))
    threading.Thread(target=server.serve_forever, daemon=True, name="trainledger-witness").start()
    return server


def serve_folder(folder: str | os.PathLike, port: int, *, host: str = "127.0.0.1") -> _Server:
    """A started read-only server of a log folder: ``/checkpoint`` (text, not cached beyond a few seconds) and
    ``/tile/...`` (immutable, cached long); nothing else, nothing outside the folder, no listing."""
    from trainledger.journal.errors import UnsafePath
    from trainledger.journal.proofs.tiles import TileError, folder_fetch

    fetch = folder_fetch(folder)

    def get(path: str) -> tuple[int, str, bytes, dict[str, str]]:
        rel = path.split("?")[0].lstrip("/")
        if rel != "checkpoint" and not rel.startswith("tile/"):
            return 404, "text/plain; charset=utf-8", b"not found\n", {}
        try:
            data = fetch(rel)
        except (TileError, UnsafePath):
            return 404, "text/plain; charset=utf-8", b"not found\n", {}
        if rel == "checkpoint":
            return 200, "text/plain; charset=utf-8", data, {"Cache-Control": "no-cache, max-age=5"}
        return 200, "application/octet-stream", data, {"Cache-Control": "public, max-age=604800, immutable"}

    server = _Server((host, port), _handler(None, get))
    threading.Thread(target=server.serve_forever, daemon=True, name="trainledger-log").start()
    return server


# ------------------------------------------------------------------ the client


def add_checkpoint(url: str, old: int, proof: Sequence[bytes], note: str, *,
                   timeout: float = TIMEOUT_S) -> tuple[int, str, str]:
    """POST one add-checkpoint to the witness at ``url`` (its submission prefix); (status, content type, body)."""
    import urllib.error
    import urllib.request

    body = f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof) + "\n" + note
    req = urllib.request.Request(url.rstrip("/") + "/add-checkpoint", data=body.encode(), method="POST",
                                 headers={"Content-Type": "text/plain; charset=utf-8"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the witness URL the user named
            return r.status, r.headers.get("Content-Type", ""), r.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read(MAX_BODY).decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class Submitted:
    """One witness's answer to a publish: ``lines`` its cosignature lines (empty when refused), ``size`` the size
    it has now cosigned (or says it has), ``error`` why not, in one line."""

    url: str
    lines: str
    size: int | None
    error: str | None


def submit(url: str, note: str, leaves: Sequence[bytes], old: int, *, timeout: float = TIMEOUT_S) -> Submitted:
    """Send the checkpoint ``note`` (of the tree of ``leaves``) to a witness that last cosigned size ``old`` (0 when
    unknown): a 409 naming another size it holds is followed once, with the proof from that size."""
    from trainledger.journal.merkle import consistency_proof

    size = len(leaves)
    for _ in range(2):
        if old > size:
            return Submitted(url, "", old, f"the witness holds size {old}, above this log's {size}: the log was "
                                           "rolled back or forked since it last cosigned")
        proof = consistency_proof(leaves, old) if 0 < old < size else []
        try:
            status, ctype, body = add_checkpoint(url, old, proof, note, timeout=timeout)
        except OSError as e:
            return Submitted(url, "", None, f"cannot reach it: {getattr(e, 'reason', e)}")
        if status == 200:
            lines = "".join(x + "\n" for x in body.split("\n") if x.startswith("\u2014 "))
            return Submitted(url, lines, size, None if lines else "a 200 without cosignature lines")
        if status == 409 and ctype.split(";")[0].strip() == SIZE_TYPE and body.strip().isdigit():
            if int(body.strip()) == old:
                return Submitted(url, "", old, f"409: it holds size {old} with another root (a fork)")
            old = int(body.strip())
            continue
        return Submitted(url, "", None, f"{status}: {body.strip().splitlines()[0][:200] if body.strip() else ''}")
    return Submitted(url, "", old, "409 twice")
