"""Witnesses: a :class:`Witness` keeps, per origin, the last checkpoint it cosigned and cosigns a new one only
given a valid consistency proof from it, refusing a rollback or a fork and saying which."""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.paths import open_new, read_regular
from trainledger.journal.errors import (
    IntegrityError,
    JournalIOError,
    UnsafePath,
    UntrustedKey,
    UsageError,
)
from trainledger.journal.keys import PublicKey
from trainledger.journal.merkle import ProofError, verify_consistency
from trainledger.journal.note import (
    Verifier,
    cosign,
    parse_verifier_key,
)
from trainledger.journal.proofs.bundle import _b64_hashes, parse_bundle
from trainledger.journal.proofs.checkpoint import open_checkpoint

__all__ = ["Witness", "WitnessRefused", "parse_witness_keys", "parse_log_keys"]


class WitnessRefused(IntegrityError):
    """A witness will not cosign: a rollback, a fork, or a checkpoint it cannot check (the message says which)."""

    reason = "witness-refused"


# ------------------------------------------------------------------ witness


#: The largest witness state file read: far more origins than one witness follows (about 150 bytes each)
STATE_LIMIT = 16 << 20


class Witness:
    """A witness's state (``state``: a JSON file, per origin the size and root it last cosigned) and its key.

    :meth:`add` cosigns a checkpoint only when it verifies under the log's pinned key and, if a checkpoint of the
    origin was cosigned before, a consistency proof from that size reaches it. It refuses a rollback (a smaller
    size), a fork (same size, another root; or a proof that does not hold) and says which. The state is updated
    under a lock and replaced atomically."""

    def __init__(self, state: str | os.PathLike, name: str, private: Any):
        from trainledger.journal.note import _valid_name

        _valid_name(name)
        self.state = Path(state)
        self.name = name
        self._priv = private  # an Ed25519PrivateKey, or a Signer (a key file, a token, a KMS key)

    def _load(self) -> dict[str, Any]:
        """The state: the witness's memory of what it cosigned, so only a regular file of this user's own that no
        one else can write, not a link, at most STATE_LIMIT bytes (anything else is refused: UnsafePath)."""
        try:
            data = read_regular(self.state, STATE_LIMIT, what="witness state", owned=True)
        except FileNotFoundError:
            return {}
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError
            for v in d.values():
                if not (isinstance(v, dict) and type(v.get("size")) is int and v["size"] >= 1
                        and len(base64.b64decode(v.get("root", ""), validate=True)) == 32):
                    raise ValueError
            return d
        except (ValueError, TypeError, binascii.Error, RecursionError):
            raise JournalIOError(f"{self.state}: not a witness state file (origin -> size and root)") from None

    def add(self, bundle: bytes, log_keys: Sequence[PublicKey], *, now: int | None = None) -> tuple[str, str]:
        """Cosign the checkpoint of a consistency bundle (``trainledger consistency``; a first checkpoint of an
        origin may come in any bundle). Returns (the cosignature line, the note with it appended)."""
        b = parse_bundle(bundle)
        pinned = [k for k in log_keys if k.key_id == b.key_id]
        if not pinned:
            raise UntrustedKey(f"the checkpoint is signed by key {b.key_id[:16]}, which this witness does not pin",
                               seq=None)
        cp, _ = open_checkpoint(b.checkpoint, b.run_id, pinned)
        lock_path = self.state.with_name(self.state.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0), 0o600)
        except OSError as e:
            raise UnsafePath(f"{lock_path}: cannot open the witness's lock file: {e.strerror} (a link is refused)") \
                from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = self._load()
            prev = st.get(cp.origin)
            if prev is not None:
                old_size, old_root = int(prev["size"]), base64.b64decode(prev["root"])
                if cp.size < old_size:
                    raise WitnessRefused(f"rollback: {cp.origin} was cosigned at size {old_size}; this checkpoint "
                                         f"is of size {cp.size}", seq=None)
                if cp.size == old_size and cp.root != old_root:
                    raise WitnessRefused(f"fork: {cp.origin} at size {cp.size} was cosigned with another root",
                                         seq=None)
                if cp.size > old_size:
                    c = b.consistency
                    if c is None or c.from_size != old_size:
                        raise WitnessRefused(f"no consistency proof from size {old_size}, the last this witness "
                                             f"cosigned for {cp.origin} (trainledger consistency --from "
                                             f"{old_size})", seq=None)
                    try:
                        verify_consistency(old_size, cp.size, old_root, cp.root, _b64_hashes(c.proof, "consistency"))
                    except ProofError as e:
                        raise WitnessRefused(f"fork: the checkpoint is not an extension of the one cosigned at "
                                             f"size {old_size} ({e})", seq=None) from None
            text = b.checkpoint[:b.checkpoint.rfind("\n\n") + 1]
            line = cosign(text, self.name, self._priv, int(time.time()) if now is None else now)
            st[cp.origin] = {"size": cp.size, "root": base64.b64encode(cp.root).decode()}
            tmp = self.state.with_name(f"{self.state.name}.{os.getpid()}.tmp")
            with open_new(tmp, 0o600) as f:
                f.write(json.dumps(st, indent=1, sort_keys=True).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state)
        finally:
            os.close(fd)
        return line, b.checkpoint + line


def parse_witness_keys(items: Sequence[str]) -> list[Verifier]:
    """``--witness-key`` values: a verifier key (``name+hash+base64``), or a file holding one per line."""
    return _vkeys(items, (0x04, 0x06), "a witness (cosigner) key")


def parse_log_keys(items: Sequence[str]) -> list[Verifier]:
    """``--log`` values of a witness: a log's verifier key (type 0x01, named by its origin), or a file of them."""
    return _vkeys(items, (0x01,), "a log's (Ed25519 note) key")


def _vkeys(items: Sequence[str], types: tuple[int, ...], what: str) -> list[Verifier]:
    out = []
    for item in items:
        texts = [item]
        if "+" not in item or os.path.exists(item):
            from trainledger.journal.keys import read_small_file

            texts = [x.strip() for x in read_small_file(Path(item), "witness key").decode("utf-8", "replace")
                     .splitlines() if x.strip() and not x.lstrip().startswith("#")]
        for t in texts:
            v = parse_verifier_key(t)
            if v.sig_type not in types:
                raise UsageError(f"{t[:60]!r}: not {what}")
            out.append(v)
    return out
