"""The registry: the format's own kinds beyond the core's, and where every other built-in kind comes from.

The journal's own kinds (``run_opened``, ``seal``, ``step_observed``, ``run_resumed``, ``tail_repaired``,
``run_closed``, ``key_certified``, ``seal_signed``) live beside the :class:`Event` base in ``events.py``. Here: the
kinds the journal's upper layers read themselves (a run folder's ``rank_joined``, ``ranks_anchored`` and
``anchor_recorded``; a release's ``model_exported``), and :data:`KIND_MODULES`, the modules that define the rest:
the training domain's (``trainledger.training.kinds``) and the ladder's (``trainledger.ladder.kinds``). The codec
imports this module when it is loaded, and this module imports those, so what ``verify`` checks never depends on
what a caller happened to import; they import the core, never the other way. :data:`BUILTIN_KINDS` lists them all.
A user's own kinds are a subclass of ``Event`` away and register when defined.

The training and ladder kinds were declared here before 0.2.0: their old names still import from this module, with
a :class:`DeprecationWarning` naming the new home.
"""

from __future__ import annotations

import importlib
import re
import warnings
from typing import Any

from trainledger.journal.chain import is_hash_hex
from trainledger.journal.events import Event, KeyCertified, RunClosed, RunOpened, RunResumed, Seal, SealSigned, \
    StepObserved, TailRepaired

# BUILTIN_KINDS is built on first use (module __getattr__)
__all__ = ["BUILTIN_KINDS", "KIND_MODULES", "ModelExported", "RankJoined", "RanksAnchored",  # noqa: F822
           "AnchorRecorded", "TimestampRecorded", "DocumentIssued", "check_files", "check_ranks"]

#: The modules that define the built-in kinds beyond this one's, imported with the codec (by name: the core
#: stands below them and never imports them otherwise). Each defines ``KINDS``, its event classes.
KIND_MODULES = ("trainledger.training.kinds", "trainledger.ladder.kinds")

def check_files(files: Any, what: str) -> None:
    """Every entry of a recorded file list: {file: str, bytes: int, sha256: str} (a restore reads each)."""
    for f in files:
        if not (isinstance(f.get("file"), str) and isinstance(f.get("sha256"), str)
                and isinstance(f.get("bytes"), int)):
            raise ValueError(f"each {what} file needs a file name, bytes and a sha256")


class ModelExported(Event, tag="model_exported", frozen=True, kw_only=True):
    """Format 1.6: the weights a run wrote to ship (a ``save_pretrained`` folder, a safetensors file's folder), as
    OpenSSF model signing digests them (``trainledger.journal.statements.release.manifest``): every file, {file, bytes,
    sha256} in model signing's order, and ``digest`` the SHA-256 over those digests: the subject digest of the
    folder's model-signing signature. ``step`` the step the weights are of, ``checkpoint`` the ``checkpoint_saved`` path
    they came from (None: not a recorded checkpoint); ``base`` the digest of the released model it was fine-tuned
    from, and ``base_release`` that release's run id (None: trained from scratch); ``lineage`` the base's own
    ancestors, nearest first ({digest, run_id}), as the base's provenance names them."""

    path: str  # the folder as the run named it
    digest: str
    files: list[dict[str, Any]]
    step: int | None = None
    checkpoint: str | None = None
    base: str | None = None
    base_release: str | None = None
    lineage: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:  # on decode too: replay rehashes the digests, so each must be one
        check_files(self.files, "exported")
        for d in (self.digest, *(f["sha256"] for f in self.files)):
            if not (len(d) == 64 and all(c in "0123456789abcdef" for c in d)):
                raise ValueError("digest and every file's sha256 must be 64 lowercase hex digits (a SHA-256)")


_HEAD = re.compile(r"[0-9]{1,19}:[0-9a-f]{64}\Z")


def _check_head(head: str) -> None:
    if not _HEAD.match(head):
        raise ValueError(f"{head[:80]!r} is not SEQ:HASH")


def _check_key_id(key_id: str) -> None:
    if not (len(key_id) == 16 and not key_id.strip("0123456789abcdef")):
        raise ValueError(f"{key_id[:40]!r} is not a key id (16 lowercase hex digits)")


def check_ranks(d: dict[str, Any], what: str) -> None:
    for k in d:
        if not (k.isdigit() and len(k) <= 7):
            raise ValueError(f"{what}: {k[:20]!r} is not a rank")


class RankJoined(Event, tag="rank_joined", frozen=True, kw_only=True):
    """A rank of a distributed run started (or, after a torchrun restart, started again) writing this journal."""

    run: str  # the run identity every rank shares (TORCHELASTIC_RUN_ID, or rank 0's)
    rank: int
    world_size: int
    local_rank: int
    node: str
    restart_count: int = 0
    versions: dict[str, str] = {}


class RanksAnchored(Event, tag="ranks_anchored", frozen=True, kw_only=True):
    """Rank 0's record, at a point every rank reached together, of every rank's latest sealed head: a rank
    journal later truncated, rolled back or swapped no longer contains its anchor."""

    heads: dict[str, str]  # rank (decimal) -> "SEQ:HASH"
    step: int | None = None
    #: 1.5: rank (decimal) -> the id of the key that rank signs with, from the same collective (the roster
    #: rank 0 records: journal.audit.roster); an unsigned rank is left out
    keys: dict[str, str] = {}
    #: 1.7, rank keys certified by a run key (journal.certify): that key's Ed25519 signature (base64) over the
    #: anchor statement (journal.certify.anchor_statement) of these heads and keys, so that the anchored history of
    #: every rank is signed by the run key too, whatever became of the ranks' own keys
    cosig: str | None = None

    def __post_init__(self) -> None:  # on decode too: verify RUN_DIR reads these fields
        check_ranks(self.heads, "heads")
        for h in self.heads.values():
            _check_head(h)
        check_ranks(self.keys, "keys")
        for k in self.keys.values():
            _check_key_id(k)


class AnchorRecorded(Event, tag="anchor_recorded", frozen=True, kw_only=True):
    """Another rank's record of rank 0's latest sealed head at the same point (rank 0 is anchored too)."""

    rank: int
    head: str  # "SEQ:HASH"
    step: int | None = None
    key: str | None = None  # 1.5: the id of the key that rank signs with, as the ranks exchanged it

    def __post_init__(self) -> None:
        _check_head(self.head)
        if self.key is not None:
            _check_key_id(self.key)


class TimestampRecorded(Event, tag="timestamp_recorded", frozen=True, kw_only=True):
    """Format 1.10: an RFC 3161 time-stamping authority's token over an earlier seal's checkpoint note
    (journal/proofs/timestamp.py, docs/publishing.md), recorded when it arrived: ``seal_seq`` the seal's line,
    ``note_sha256`` the note's SHA-256 (hex) the token's imprint must be, ``tsa`` the authority asked, ``token`` the
    DER token (base64), ``time`` the time it states (ISO 8601, UTC) as the writer read it; or, where none came,
    ``error`` why (the run went on without it). ``verify --tsa-cert`` checks each token offline."""

    seal_seq: int
    note_sha256: str
    tsa: str
    token: str | None = None
    time: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if not is_hash_hex(self.note_sha256):
            raise ValueError("note_sha256 is not 64 lowercase hex digits")
        if (self.token is None) == (self.error is None):
            raise ValueError("a timestamp_recorded holds a token or an error, one of them")


class DocumentIssued(Event, tag="document_issued", frozen=True, kw_only=True):
    """Format 1.10: a document about a model that ``trainledger bom`` wrote from the runs' signed events
    (journal/statements/bom, docs/bom.md), issued under the run's key: ``format`` (``cyclonedx``, ``spdx``,
    ``hf-card``, ``intoto-eval``), ``sha256`` the document's bytes' SHA-256 (hex), ``name`` its file name, and
    ``heads`` each journal it rests on as ``run_id`` -> its signed head (``SEQ:HASH``). Recorded in the model's
    run's documents journal (``<journal>.documents.jsonl``), so that a document cannot be swapped for another
    unnoticed: ``verify-bom`` holds the document to it."""

    format: str
    sha256: str
    name: str
    heads: dict[str, str]

    def __post_init__(self) -> None:
        if not is_hash_hex(self.sha256):
            raise ValueError("sha256 is not 64 lowercase hex digits")


_CORE_KINDS: tuple[type[Event], ...] = (RunOpened, Seal, StepObserved, RunResumed, TailRepaired, RunClosed,
                                        KeyCertified, SealSigned, ModelExported, RankJoined, RanksAnchored,
                                        AnchorRecorded, TimestampRecorded, DocumentIssued)
#: The names that moved out of this module in 0.2.0, and their new homes
_MOVED = {**{n: "trainledger.training.kinds" for n in ['CHECKPOINT_CONTRACT', 'LOSS_SCALES', 'SPIKE_RULES', 'RunConfigured', 'AnomalyDetected', 'SpikeSuspected', 'AnomalyEnded', 'MAX_WINDOW', 'DetectorParams', 'CheckpointSaved', 'folder_digest', 'ResumeRejectedEvent', 'WeightsRestored', 'CheckpointFailed', 'CheckpointDeleted', 'RewindDecided', 'DataWindowSkipped', 'RunStopped', 'PreflightGate', 'PreflightCompleted', 'EvaluationRecorded', 'CheckpointSelected', 'ResourceRecorded', 'ShardsSaved', 'DeviceSampled', 'DeviceChanged', 'DEVICE_ANOMALIES', 'device_anomaly', 'TelemetryUnavailable', 'StragglerScores', 'StragglerDetected', 'MetricsLogged', 'ComputeTotaled', 'ComputeThresholdCrossed']},
          **{n: "trainledger.ladder.kinds" for n in ['RungStarted', 'GateVerdict', 'DecisionRecorded', 'ScalingFitted']}}

for _name in KIND_MODULES:  # the kinds register as they are defined
    importlib.import_module(_name)


def _builtin_kinds() -> dict[str, type[Event]]:
    classes = list(_CORE_KINDS)
    for name in KIND_MODULES:
        classes += importlib.import_module(name).KINDS
    return {str(c.__struct_config__.tag): c for c in classes}


def __getattr__(name: str) -> Any:
    if name == "BUILTIN_KINDS":  # built on first use: a module in KIND_MODULES may still be importing this one
        value = globals()["BUILTIN_KINDS"] = _builtin_kinds()
        return value
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"trainledger.journal.kinds.{name} moved to {home}.{name} in 0.2.0; import it from there",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(home), name)
