"""Event kinds of the journal core.

Every event is a frozen, tagged msgspec Struct whose tag (the ``kind`` member
of the line) is a past-tense snake_case name. Later packages add kinds by
subclassing :class:`Event` with a new ``tag``; the codec picks them up without
any change here. Rules for a kind (checked by the codec when it first meets
the class):

- the names ``kind``, ``seq``, ``ts`` and ``h`` are reserved: the writer adds
  them to every line;
- fields are keyword-only; a field added later gets a default and goes last
  (msgspec's schema evolution); a breaking change is a new kind.

Float fields may hold NaN and +/-inf: the codec stores them as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` and reads them back as floats,
bit-exact for the infinities and as a NaN for NaN.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "Event",
    "RunOpened",
    "Seal",
    "StepObserved",
    "RunResumed",
    "TailRepaired",
    "RunClosed",
    "KeyCertified",
    "SealSigned",
    "FORMAT_VERSION",
]

#: Major.minor version of the line format this package writes. A reader refuses
#: a newer major version; a newer minor version only adds event kinds.
FORMAT_VERSION = "1.10"


class Event(
    msgspec.Struct,
    tag_field="kind",
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    gc=False,
):
    """Base class of every journal event. Subclass with ``tag="past_tense_name"``.

    Fields equal to their default are left out of the line (``omit_defaults``):
    lines stay short, and a ``null`` in an encoded event can only be a
    non-finite float, which the codec then spells out. Events hold plain data
    and cannot form reference cycles, so they are not tracked by the garbage
    collector (``gc=False``): a training loop allocates one per step.
    """


class RunOpened(Event, tag="run_opened", frozen=True, kw_only=True):
    """Always seq 0: which run this is, who signs it, and what wrote it."""

    format_version: str
    run_id: str
    key_id: str | None
    public_key: str | None
    host: str
    pid: int
    software: dict[str, str]
    meta: dict[str, Any] = {}
    #: The experiment manifest's identity ("sha256:..."), when the run has one (training/experiment/manifest.py),
    #: and its human-friendly label (not part of the identity).
    manifest_id: str | None = None
    manifest_label: str | None = None


class Seal(Event, tag="seal", frozen=True, kw_only=True):
    """An Ed25519 signature over the chain head just before this line.

    ``sig`` is base64 of the signature over the seal message (docs/FORMAT.md);
    it and ``key_id`` are null in an unsigned journal.
    """

    sealed_seq: int
    sealed_hash: str
    key_id: str | None
    sig: str | None
    #: Format 1.3: the RFC 6962 Merkle tree over every line before this one (``tree_size`` = this seal's seq)
    #: and its root (hex). The signature is then over the C2SP checkpoint text that names them
    #: (:func:`trainledger.journal.chain.seal_checkpoint`), so that every seal is a checkpoint a witness can cosign.
    tree_size: int | None = None
    tree_root: str | None = None


class StepObserved(Event, tag="step_observed", frozen=True, kw_only=True):
    """One optimizer step as the training loop saw it."""

    step: int
    loss: float
    grad_norm: float | None = None
    lr: float | None = None
    step_time_s: float | None = None
    examples: int | None = None
    tokens: int | None = None
    supervised_tokens: int | None = None
    #: Format 1.2. Seconds the step waited for its batch, and this rank's own time in the step (its work before
    #: it waits on other ranks; straggler detection compares these, as a synchronous all-reduce evens out
    #: step_time_s across ranks).
    data_time_s: float | None = None
    compute_time_s: float | None = None
    #: Format 1.4. One number that stands for the step's batch (``training.health.fingerprint.batch_fingerprint``):
    #: a step run again after a resume on other data gets another, which replay flags (``data_divergence``).
    batch_fingerprint: float | None = None


class RunResumed(Event, tag="run_resumed", frozen=True, kw_only=True):
    """A run continues in this journal after an interruption (written by the resume logic)."""

    reason: str
    from_step: int | None = None
    checkpoint: str | None = None
    detail: dict[str, Any] = {}


class TailRepaired(Event, tag="tail_repaired", frozen=True, kw_only=True):
    """Reopening found bytes after the signed prefix and moved them aside, never deleting them.

    Those bytes are a torn last line (a crash mid-write) and, in a signed journal, any complete events that no
    seal covered (``unsealed_events`` of them): nothing signs such events, so a writer never seals over them.
    """

    offset: int
    length: int
    sha256: str
    sidecar: str
    unsealed_events: int = 0


class RunClosed(Event, tag="run_closed", frozen=True, kw_only=True):
    """The last event of a run; only its closing seal may follow."""

    status: str
    reason: str | None = None


class KeyCertified(Event, tag="key_certified", frozen=True, kw_only=True):
    """Format 1.7: the key that signs this journal's seals from the next seal on, certified by another key.

    Written by the journal itself (``Journal.create`` / ``open_append`` with ``certificate=``) right after
    ``run_opened``, and again after each restart of a rank (a new key each round). ``sig`` is the certifying key's
    (``issuer``'s) Ed25519 signature over the round's roster statement (:mod:`trainledger.journal.certify`), which
    names every rank's key through an RFC 6962 tree (``keys_root``); ``proof`` shows this rank's leaf
    (``"RANK KEY"``) in it. A verifier that pins the issuer accepts the seals of the keys certified this way and no
    others, each only after its own certificate and not past ``not_after_ns``.
    """

    run: str
    round: int
    world_size: int
    rank: int
    key: str
    keys_root: str
    proof: list[str]
    issued_ns: int
    not_after_ns: int
    issuer: str
    sig: str


class SealSigned(Event, tag="seal_signed", frozen=True, kw_only=True):
    """Format 1.7: the signature of an earlier seal, signed off the appending path (a key in a token or a service).

    A writer whose key is slow to sign (``Journal.create(sign_in_background=True)``, the default for a ``pkcs11:``
    or KMS key) writes each seal without its signature (``sig`` null: a *pending* seal) and goes on appending; its
    signing thread signs the pending seal's checkpoint and the writer then records this line, naming that seal
    (``seal_seq``, and its head and tree again) with the signature, how long it waited (``waited_ms``, from the
    pending seal to the signature) and how many attempts it took (``attempts``; ``error``: the last failure, if
    any): a signed catch-up that says how late the signature came. The signed prefix then ends at the pending seal's
    line; what came after it waits for the next seal.
    """

    seal_seq: int
    sealed_seq: int
    sealed_hash: str
    tree_size: int
    tree_root: str
    key_id: str
    sig: str
    waited_ms: int = 0
    attempts: int = 1
    error: str | None = None
