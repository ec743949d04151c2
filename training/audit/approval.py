"""Signed approvals: a named authority's decision on one experiment, signed with that authority's own key.

Seed 001: technical completeness never implies approval, and engineering cannot waive a named authority's stop.
An approval is therefore a small JSON file that only the approver can produce: their decision (``approve`` or
``reject``) on one manifest identity, signed with their Ed25519 key. ``trainledger approve`` writes it,
``trainledger preflight --approval FILE`` checks it against the approvers a team pinned (a trusted-approvers
file, ``--approvers FILE`` or ``$TRAINLEDGER_TRUSTED_APPROVERS``: one ``NAME <public key line>`` per line), and
the authority gate records it whole (key id, public key, signature), so ``trainledger replay`` checks the
signature and the binding again from the journal alone.

The signed message is ``"trainledger/v1/approval\\0"`` followed by the canonical JSON (sorted keys, no spaces)
of ``{"authority", "decision", "manifest_id", "note"}``.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Any

import msgspec

from trainledger.journal.codec import encode_document
from trainledger.journal.errors import JournalError, KeyFileError, UsageError
from trainledger.journal.keys import PublicKey, Signer, read_small_file, key_id_of, parse_public_key

__all__ = ["SignedApproval", "ApprovalInvalid", "sign_approval", "load_approval", "check_approval",
           "load_trusted_approvers", "TRUSTED_APPROVERS_ENV", "APPROVAL_FORMAT"]

APPROVAL_FORMAT = "trainledger-approval/1"
APPROVAL_TAG = b"trainledger/v1/approval\x00"
TRUSTED_APPROVERS_ENV = "TRAINLEDGER_TRUSTED_APPROVERS"
DECISIONS = ("approve", "reject")


class ApprovalInvalid(JournalError):
    """An approval that does not hold: bad signature, unpinned approver, another manifest."""

    exit_code = 1


class SignedApproval(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: str
    authority: str
    manifest_id: str
    decision: str
    note: str = ""
    key_id: str
    public_key: str
    sig: str

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    def to_json(self) -> bytes:
        """The approval file's bytes."""
        return encode_document(self.to_dict()) + b"\n"


def approval_message(authority: str, manifest_id: str, decision: str, note: str) -> bytes:
    body = {"authority": authority, "decision": decision, "manifest_id": manifest_id, "note": note}
    return APPROVAL_TAG + encode_document(body)


def sign_approval(signer: Signer, *, authority: str, manifest_id: str, decision: str = "approve",
                  note: str = "") -> SignedApproval:
    """The approval ``authority`` gives (or refuses) ``manifest_id``, signed with their own key."""
    if decision not in DECISIONS:
        raise UsageError(f"decision must be one of {DECISIONS}, got {decision!r}")
    if not authority.strip():
        raise UsageError("an approval names its authority")
    sig = signer.sign(approval_message(authority, manifest_id, decision, note))
    return SignedApproval(format=APPROVAL_FORMAT, authority=authority, manifest_id=manifest_id, decision=decision,
                          note=note, key_id=signer.key_id, public_key=signer.public.b64,
                          sig=base64.b64encode(sig).decode())


def load_approval(path: str | os.PathLike) -> SignedApproval:
    """Read an approval file; :class:`UsageError` when it is not one (an unsigned JSON included)."""
    p = Path(path)
    try:
        data = read_small_file(p, "approval")
    except KeyFileError as e:
        raise UsageError(str(e)) from None
    try:
        return msgspec.json.decode(data, type=SignedApproval)
    except msgspec.DecodeError as e:
        raise UsageError(f"{p}: not a signed approval ({e}); write one with 'trainledger approve'") from None


def check_approval(a: SignedApproval, *, manifest_id: str, approvers: list[str],
                   trusted: dict[str, list[PublicKey]] | None) -> None:
    """Raise :class:`ApprovalInvalid` unless ``a`` is a well-formed, correctly signed decision on
    ``manifest_id`` by one of ``approvers``, whose key is pinned for that name in ``trusted``.

    ``trusted=None`` skips the pinning check (replay, which has the journal and not the team's file): the
    signature and the binding are still checked.
    """
    if a.format != APPROVAL_FORMAT:
        raise ApprovalInvalid(f"approval format {a.format!r}, expected {APPROVAL_FORMAT}")
    if a.decision not in DECISIONS:
        raise ApprovalInvalid(f"decision {a.decision!r} is neither approve nor reject")
    if a.authority not in approvers:
        raise ApprovalInvalid(f"{a.authority!r} is not an approver the manifest names ({', '.join(approvers)})")
    if a.manifest_id != manifest_id:
        raise ApprovalInvalid(f"the approval is for {a.manifest_id}, not this manifest ({manifest_id})")
    try:
        raw = base64.b64decode(a.public_key, validate=True)
        sig = base64.b64decode(a.sig, validate=True)
        key = PublicKey(raw, "the approval")
    except (binascii.Error, ValueError, KeyFileError) as e:
        raise ApprovalInvalid(f"the approval's key or signature is malformed: {e}") from None
    if key_id_of(raw) != a.key_id:
        raise ApprovalInvalid("the approval's key id does not match its public key")
    if not key.verify(sig, approval_message(a.authority, a.manifest_id, a.decision, a.note)):
        raise ApprovalInvalid(f"the approval's signature does not verify under key {a.key_id}")
    if trusted is not None:
        pinned = trusted.get(a.authority, [])
        if not any(k.raw == raw for k in pinned):
            raise ApprovalInvalid(f"key {a.key_id} is not pinned for {a.authority!r} in the trusted approvers"
                                  + ("" if pinned else " (no key is pinned for that name)"))


def load_trusted_approvers(path: str | os.PathLike | None = None, *,
                           env: dict[str, str] | None = None) -> dict[str, list[PublicKey]] | None:
    """``NAME <public key line>`` per line (``#`` comments), from ``path`` or ``$TRAINLEDGER_TRUSTED_APPROVERS``.

    ``None`` when neither is given: then no approval can pass (the gate stays blocked).
    """
    env = os.environ if env is None else env
    where = path if path is not None else env.get(TRUSTED_APPROVERS_ENV)
    if not where:
        return None
    p = Path(where)
    data = read_small_file(p, "trusted-approvers file")
    out: dict[str, list[PublicKey]] = {}
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, key = line.strip().partition(" ")
        if not key.strip():
            raise KeyFileError(f"{p}:{n}: expected 'NAME trainledger-ed25519 <base64>'")
        out.setdefault(name, []).append(parse_public_key(key, f"{p}:{n}"))
    return out
