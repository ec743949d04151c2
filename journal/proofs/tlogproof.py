"""C2SP tlog-proof (https://c2sp.org/tlog-proof): an offline proof that an entry is in a transparency log, under a
checkpoint its witnesses cosigned, in one text file (``.tlog-proof``):

    c2sp.org/tlog-proof@v1
    extra <base64>          (optional: here, the entry itself, a run's signed checkpoint note)
    index <n>
    <base64 hash>           (the inclusion proof, leaf's sibling first, zero or more lines)

    <the log's checkpoint note, verbatim, with its cosignatures>

:func:`check` holds one to a tlog-policy: the checkpoint signed by a listed log, its cosignatures against the
quorum, the entry's leaf hash included at the index. The extra data is not authenticated by the proof: whoever
reads it checks it for what it claims (:func:`trainledger.journal.statements.publish.orglog.check_published` opens it
under the run's key and holds the journal to it).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses

from trainledger.journal.merkle import leaf_hash, verify_inclusion
from trainledger.journal.note import Checkpoint, NoteError, b64_hash, decimal
from trainledger.journal.proofs.policy import Policy, Quorum

__all__ = ["TlogProof", "format_proof", "parse_proof", "check", "HEADER", "MAX_PROOF"]

HEADER = "c2sp.org/tlog-proof@v1"
#: the largest proof file read (a checkpoint with a hundred ML-DSA cosignatures is about 330 KB)
MAX_PROOF = 1 << 20


@dataclasses.dataclass(frozen=True)
class TlogProof:
    extra: bytes | None
    index: int
    hashes: list[bytes]
    note: str


def format_proof(index: int, hashes: list[bytes], note: str, extra: bytes | None = None) -> str:
    lines = [HEADER] + ([f"extra {base64.b64encode(extra).decode()}"] if extra is not None else [])
    lines += [f"index {index}"] + [base64.b64encode(h).decode() for h in hashes]
    return "\n".join(lines) + "\n\n" + note


def parse_proof(text: str) -> TlogProof:
    """A proof's text, checked for form (:class:`NoteError` naming what is wrong)."""
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise NoteError("not a tlog-proof: no blank line before the checkpoint")
    lines = head.split("\n")
    if lines[0] != HEADER:
        raise NoteError(f"not a tlog-proof: the first line is not {HEADER}")
    i, extra = 1, None
    if len(lines) > 1 and lines[1].startswith("extra "):
        try:
            extra = base64.b64decode(lines[1][6:], validate=True)
        except (ValueError, binascii.Error):
            raise NoteError("the tlog-proof's extra line is not base64") from None
        i = 2
    if i >= len(lines) or not lines[i].startswith("index "):
        raise NoteError("the tlog-proof has no index line")
    index = decimal(lines[i][6:])
    if index is None:
        raise NoteError(f"the tlog-proof's index {lines[i][6:36]!r} is not a decimal number")
    hashes = [b64_hash(line) for line in lines[i + 1:]]
    if len(hashes) > 64:
        raise NoteError("more inclusion proof lines than a tree can need")
    if any(h is None for h in hashes):
        raise NoteError("a tlog-proof inclusion line is not a base64 32-byte hash")
    return TlogProof(extra, index, [h for h in hashes if h is not None], note)


def check(policy: Policy, proof: TlogProof, entry: bytes) -> tuple[Checkpoint, Quorum]:
    """``entry`` included at the proof's index under its checkpoint, which is held to ``policy``
    (:func:`~trainledger.journal.proofs.policy.check_checkpoint`): (the checkpoint, the quorum). Raises
    :class:`NoteError` or :class:`~trainledger.journal.merkle.ProofError` when it does not hold."""
    from trainledger.journal.proofs.policy import check_checkpoint

    cp, quorum = check_checkpoint(policy, proof.note)
    verify_inclusion(leaf_hash(entry), proof.index, cp.size, proof.hashes, cp.root)
    return cp, quorum
