"""C2SP tlog-policy files: which logs and witnesses a verifier trusts, and the quorum of cosignatures a checkpoint
needs (https://c2sp.org/tlog-policy), for offline verification of a proof of logging.

    log <vkey> [<url>]
    witness <name> <vkey> [<url>]
    group <name> all|any|<k> <name>...
    quorum <name>|none

Lines are split on spaces and tabs; ``#`` starts a comment line; a group or the quorum names only what earlier
lines defined (so no cycle can be written), each member at most once; exactly one quorum line. Log keys are
Ed25519 note keys (type 0x01) whose name is the log's origin; witness keys are cosigner keys, Ed25519 (0x04) or
ML-DSA-44 (0x06, which tlog-cosignature recommends for new deployments). Two keys wrapping the same public key are
duplicates and refused. Names are opaque octets. :func:`evaluate` says whether the witnesses whose cosignatures
verified meet the quorum, and how (each group's count against its threshold).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainledger.journal.errors import TrainledgerError
from trainledger.journal.note import (SIG_COSIGNATURE, SIG_ED25519, SIG_MLDSA44_COSIGNATURE, Checkpoint, NoteError,
                                      Verifier, check_cosignatures, decimal, open_note, parse_checkpoint,
                                      parse_verifier_key)

__all__ = ["Policy", "PolicyError", "parse_policy", "read_policy", "evaluate", "check_checkpoint", "Quorum",
           "MAX_ENTRIES", "MAX_BYTES"]

#: The most logs, witnesses or groups one policy may define (the spec asks for at least 32 of each)
MAX_ENTRIES = 1024
#: The largest policy file read
MAX_BYTES = 1 << 20


class PolicyError(TrainledgerError, ValueError):
    """A policy file that does not parse, or names what it does not define (the message says which line)."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class Policy:
    #: the logs accepted (their vkeys' names are their origins), and each one's URL where given
    logs: tuple[Verifier, ...]
    log_urls: dict[str, str]
    #: witness name -> its cosigner key; and URL where given
    witnesses: dict[str, Verifier]
    witness_urls: dict[str, str]
    #: group name -> (threshold, members)
    groups: dict[str, tuple[int, tuple[str, ...]]]
    #: the name the quorum line gives (a witness, a group, or ``none``)
    quorum: str


@dataclasses.dataclass(frozen=True)
class Quorum:
    """What a checkpoint met: ``met``; ``witnesses`` whose cosignatures verified (with their timestamps); and
    ``detail``, one line saying how (``X-and-Y: 2 of 2 (X-witnesses: 2 of 3 [X1, X2]; Y-witnesses: ...)``)."""

    met: bool
    witnesses: dict[str, int]
    detail: str


def _fields(line: bytes) -> list[bytes]:
    return line.replace(b"\t", b" ").split()


def parse_policy(data: bytes, where: str = "policy") -> Policy:
    """A policy file's bytes, checked line by line (:class:`PolicyError` names the line)."""
    if len(data) > MAX_BYTES:
        raise PolicyError(f"{where}: larger than {MAX_BYTES} bytes")
    bad = next((b for b in data if b < 0x20 and b not in (0x09, 0x0A) or b == 0x7F), None)
    if bad is not None:
        raise PolicyError(f"{where}: a control character 0x{bad:02x} (only tab and newline are allowed)")
    logs: list[Verifier] = []
    log_urls: dict[str, str] = {}
    witnesses: dict[str, Verifier] = {}
    witness_urls: dict[str, str] = {}
    groups: dict[str, tuple[int, tuple[str, ...]]] = {}
    quorum: str | None = None
    keys: set[bytes] = set()

    for n, raw in enumerate(data.split(b"\n"), 1):
        f = _fields(raw)
        if not f or f[0].startswith(b"#"):
            continue
        at = f"{where}:{n}"
        word, args = f[0], [x.decode("utf-8", "surrogateescape") for x in f[1:]]

        def key(text: str, types: tuple[int, ...], what: str) -> Verifier:
            try:
                v = parse_verifier_key(text)
            except NoteError as e:
                raise PolicyError(f"{at}: {what} key: {e}") from None
            if v.sig_type not in types:
                raise PolicyError(f"{at}: a {what} key must be of type {' or '.join(f'0x{t:02x}' for t in types)}, "
                                  f"this one is 0x{v.sig_type:02x}")
            if v.public in keys:
                raise PolicyError(f"{at}: a duplicate key (the same public key is already in the policy)")
            keys.add(v.public)
            return v

        if word == b"log":
            if len(args) not in (1, 2):
                raise PolicyError(f"{at}: log <vkey> [<url>]")
            v = key(args[0], (SIG_ED25519,), "log")
            logs.append(v)
            if len(args) == 2:
                log_urls[v.name] = args[1]
        elif word == b"witness":
            if len(args) not in (2, 3):
                raise PolicyError(f"{at}: witness <name> <vkey> [<url>]")
            name = args[0]
            if name == "none" or name in witnesses or name in groups:
                raise PolicyError(f"{at}: the name {name!r} is {'reserved' if name == 'none' else 'defined twice'}")
            witnesses[name] = key(args[1], (SIG_COSIGNATURE, SIG_MLDSA44_COSIGNATURE), "witness")
            if len(args) == 3:
                witness_urls[name] = args[2]
        elif word == b"group":
            if len(args) < 3:
                raise PolicyError(f"{at}: group <name> all|any|<k> <name>...")
            name, k_s, members = args[0], args[1], tuple(args[2:])
            if name == "none" or name in witnesses or name in groups:
                raise PolicyError(f"{at}: the name {name!r} is {'reserved' if name == 'none' else 'defined twice'}")
            for m in members:
                if m not in witnesses and m not in groups:
                    raise PolicyError(f"{at}: group {name!r} names {m!r}, which no earlier line defines")
            if len(set(members)) != len(members):
                raise PolicyError(f"{at}: group {name!r} lists a member twice")
            if k_s == "all":
                k = len(members)
            elif k_s == "any":
                k = 1
            elif (n := decimal(k_s)) is not None:
                k = n
                if not 1 <= k <= len(members):
                    raise PolicyError(f"{at}: group {name!r} needs 1 <= k <= {len(members)}, got {k}")
            else:
                raise PolicyError(f"{at}: group {name!r}: the threshold must be all, any or a decimal number")
            groups[name] = (k, members)
        elif word == b"quorum":
            if len(args) != 1:
                raise PolicyError(f"{at}: quorum <name>")
            if quorum is not None:
                raise PolicyError(f"{at}: a second quorum line (a policy has exactly one)")
            if args[0] != "none" and args[0] not in witnesses and args[0] not in groups:
                raise PolicyError(f"{at}: the quorum names {args[0]!r}, which no earlier line defines")
            quorum = args[0]
        else:
            raise PolicyError(f"{at}: unknown line {word[:20].decode('utf-8', 'replace')!r} (log, witness, group, "
                              "quorum)")
        if max(len(logs), len(witnesses), len(groups)) > MAX_ENTRIES:
            raise PolicyError(f"{at}: more than {MAX_ENTRIES} logs, witnesses or groups")
    if quorum is None:
        raise PolicyError(f"{where}: no quorum line (quorum <name>, or quorum none)")
    return Policy(tuple(logs), log_urls, witnesses, witness_urls, groups, quorum)


def read_policy(path: str | Path) -> Policy:
    """A policy file from disk (a regular file, at most :data:`MAX_BYTES`)."""
    from trainledger.journal.keys import read_small_file

    data = read_small_file(Path(path), "policy file", limit=MAX_BYTES)
    return parse_policy(data, str(path))


def evaluate(policy: Policy, cosigned: dict[str, int]) -> Quorum:
    """Whether the witnesses in ``cosigned`` (name -> timestamp: those whose cosignatures verified) meet the
    policy's quorum, and how."""
    memo: dict[str, tuple[bool, str]] = {}

    def met(name: str) -> tuple[bool, str]:
        if name in memo:
            return memo[name]
        if name in policy.witnesses:
            out = (name in cosigned, f"{name} {'cosigned' if name in cosigned else 'missing'}")
        else:
            k, members = policy.groups[name]
            parts = [met(m) for m in members]
            count = sum(ok for ok, _ in parts)
            out = (count >= k, f"{name}: {count} of {len(members)}, {k} needed ({', '.join(d for _, d in parts)})")
        memo[name] = out
        return out

    if policy.quorum == "none":
        return Quorum(True, dict(cosigned), "quorum none: no cosignature needed")
    ok, detail = met(policy.quorum)
    return Quorum(ok, dict(cosigned), ("quorum met: " if ok else "quorum NOT met: ") + detail)


def check_checkpoint(policy: Policy, note: str) -> tuple[Checkpoint, Quorum]:
    """A signed checkpoint note under the policy: signed by one of its logs (the key whose name is the origin),
    each pinned witness's cosignature verified (a pinned witness's that does not verify rejects the note: a
    forgery is never counted as absent), and the quorum evaluated. Returns (the checkpoint, the quorum);
    :class:`~trainledger.journal.note.NoteError` for a note no log of the policy signed."""
    text, signed = open_note(note, list(policy.logs))
    cp = parse_checkpoint(text)
    if not any(v.name == cp.origin for v in signed):
        raise NoteError(f"the checkpoint's origin {cp.origin!r} is not the name of a log the policy lists")
    by_key = {id(v): name for name, v in policy.witnesses.items()}
    got = {by_key[id(v)]: ts for v, ts in check_cosignatures(note, list(policy.witnesses.values()))}
    return cp, evaluate(policy, got)
