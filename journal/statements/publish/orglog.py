"""An organisation's log of its runs (``trainledger log``, docs/publishing.md): one append-only tlog-tiles folder
per team (journal/proofs/tiles.py) whose entries are its runs' signed checkpoint notes, so that witnesses outside
the trainer can cosign the team's history and nobody can show two of it.

An entry is a journal's latest seal as a signed checkpoint note (``trainledger tree-head``'s output), byte for
byte: origin ``trainledger/<run id>``, tree size, root, the chain head and the run key's signature. Anyone holding
the run's public key checks an entry by itself; the log's inclusion proof binds it to the team's checkpoint. A run
folder of rank journals adds one entry per rank. The same note is never added twice.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import UsageError
from trainledger.journal.audit.rundir import run_journals
from trainledger.journal.keys import PublicKey
from trainledger.journal.proofs.checkpoint import tree_head
from trainledger.journal.proofs.tiles import TileLog

__all__ = ["run_journals", "run_notes", "add_runs", "Added", "publish", "Published",
           "MIN_INTERVAL_S", "prove", "check_published", "check_checkpoint_published", "held", "Publication",
           "proof_path"]

#: the least time between two checkpoints sent to witnesses: the public witness network admits long-tail logs
#: that add about one checkpoint a minute
MIN_INTERVAL_S = 60.0


def run_notes(paths: Sequence[str | os.PathLike], keys: Sequence[PublicKey], *,
              require_closed: bool = True) -> list[tuple[Path, str]]:
    """(journal, its signed checkpoint note) for every journal the paths name, each verified under ``keys`` first
    (closed, unless ``require_closed=False``: a running job's signed prefix)."""
    return [(j, tree_head(j, keys, require_closed=require_closed)) for p in paths for j in run_journals(p)]


@dataclasses.dataclass(frozen=True)
class Added:
    """What ``log add`` did: each journal with its entry's index (``new`` False where the log held it already), and
    the log's checkpoint note after (unchanged when nothing was new)."""

    entries: list[tuple[Path, int, bool]]
    note: str
    size: int


def add_runs(logdir: str | os.PathLike, paths: Sequence[str | os.PathLike], keys: Sequence[PublicKey],
             signer: Any, *, require_closed: bool = True) -> Added:
    """Verify every journal the paths name and append the checkpoint notes the log does not hold yet, in one new
    checkpoint signed by ``signer`` (the log's key). Nothing is appended unless every journal verified."""
    notes = run_notes(paths, keys, require_closed=require_closed)
    before, note, where = TileLog(logdir).add([n.encode() for _, n in notes], signer, dedupe=True)
    size = before.checkpoint.size
    return Added([(j, i, i >= size) for (j, _), i in zip(notes, where)], note,
                 size + len({i for i in where if i >= size}))


@dataclasses.dataclass(frozen=True)
class Published:
    """What ``log publish`` did: the checkpoint's size, each witness's answer
    (:class:`~.witness_http.Submitted`), and the note now served (the checkpoint with every cosignature kept)."""

    size: int
    answers: list[Any]
    note: str


def publish(logdir: str | os.PathLike, witnesses: Sequence[tuple[str, Sequence[Any]]], log_public: bytes, *,
            min_interval_s: float = MIN_INTERVAL_S, now: float | None = None) -> Published:
    """Send the log's current checkpoint to each witness (``(url, its pinned keys)``; with no key pinned its lines
    are kept unchecked, for a policy to check later) with a consistency proof from the size it last cosigned (kept
    in ``LOGDIR/.witnesses.json``), and serve the checkpoint with the cosignatures that came back. Refused within
    ``min_interval_s`` of the last publish of another checkpoint (the rate witnesses admit); the same checkpoint
    may be sent again (to more witnesses, or after one failed)."""
    import json
    import time

    from trainledger.journal.note import check_cosignatures
    from trainledger.journal.paths import read_regular, write_atomically
    from trainledger.journal.statements.publish.witness_http import submit

    log = TileLog(logdir)
    view = log.read(log_public, entries=False)
    state_path = Path(logdir) / ".witnesses.json"
    try:
        state = json.loads(read_regular(state_path, 1 << 20, what="publish state"))
    except FileNotFoundError:
        state = {}
    except ValueError:
        state = None
    sizes = state.get("sizes", {}) if isinstance(state, dict) else None
    if (not isinstance(sizes, dict) or not all(type(v) is int and v >= 0 for v in sizes.values())
            or not isinstance(state.get("time", 0.0), (int, float)) or type(state.get("size", 0)) is not int):
        raise UsageError(f"{state_path}: not a publish state file (remove it to start over)")
    t = time.time() if now is None else now
    last_size, last_t = state.get("size"), state.get("time", 0.0)
    if last_size != view.checkpoint.size and t - last_t < min_interval_s:
        raise UsageError(f"{logdir}: a checkpoint was published {t - last_t:.0f} s ago; witnesses admit about one a "
                         f"minute: publish again in {min_interval_s - (t - last_t):.0f} s")
    text = view.note[:view.note.rfind("\n\n") + 1]
    own = view.note[view.note.rfind("\n\n") + 2:]
    log_line = own.split("\n")[0] + "\n"  # the log's own signature; the cosignatures after it are replaced below
    kept = own[len(log_line):]  # cosignatures an earlier publish of this checkpoint brought
    note = text + "\n" + log_line
    answers = []
    for url, keys in witnesses:
        a = submit(url, note, view.leaves, sizes.get(url, 0))
        if a.lines and keys:
            try:
                good = check_cosignatures(note + a.lines, list(keys))
            except Exception as e:  # noqa: BLE001 - a cosignature that does not verify is that witness's failure
                a = dataclasses.replace(a, lines="", error=f"its cosignature does not verify: {e}")
            else:
                if not good:
                    a = dataclasses.replace(a, lines="", error="none of its cosignatures is by a key pinned for it")
        if a.size is not None and a.error is None:
            sizes[url] = a.size
        answers.append(a)
        kept += a.lines
    full = note + "".join(dict.fromkeys(kept.splitlines(keepends=True)))
    log.cosigned(full)
    write_atomically(state_path, json.dumps({"size": view.checkpoint.size, "time": t, "sizes": sizes}).encode())
    return Published(view.checkpoint.size, answers, full)


def proof_path(journal: Path) -> Path:
    """Where a journal's proof of logging lies by default: beside it, ``<name>.tlog-proof``."""
    return journal.with_suffix(".tlog-proof")


def prove(logdir: str | os.PathLike, paths: Sequence[str | os.PathLike], keys: Sequence[PublicKey],
          log_public: bytes, *, require_closed: bool = True) -> list[tuple[Path, str]]:
    """A C2SP tlog-proof for each journal the paths name: its checkpoint note (the entry, carried as the proof's
    extra data), its index and inclusion proof under the newest checkpoint that holds it and carries cosignatures
    (the served one, else the last one published; an unwitnessed one only when no cosigned checkpoint holds it)."""
    from trainledger.journal.merkle import inclusion_proof
    from trainledger.journal.proofs.tiles import folder_fetch, read_log
    from trainledger.journal.proofs.tlogproof import format_proof

    log = TileLog(logdir)
    view = log.read(log_public, entries=True)
    assert view.entries is not None
    index = {e: i for i, e in enumerate(view.entries)}
    cosigned = log.last_cosigned()
    older = None
    if cosigned is not None and cosigned.count("\u2014 ") > 1 and view.note.count("\u2014 ") <= 1:
        older = read_log(folder_fetch(logdir), log.verifier(log_public), entries=False, note=cosigned)
    out = []
    for j, note in run_notes(paths, keys, require_closed=require_closed):
        i = index.get(note.encode())
        if i is None:
            raise UsageError(f"{j}: its checkpoint is not in the log {logdir} ('trainledger log add' it first; a "
                             "run that went on since it was added has another checkpoint now)")
        use = older if older is not None and i < older.checkpoint.size else view
        out.append((j, format_proof(i, inclusion_proof(use.leaves, i), use.note, note.encode())))
    return out


@dataclasses.dataclass(frozen=True)
class Publication:
    """Whether a journal is published under a policy: ``ok`` (its checkpoint in the log under a checkpoint the
    quorum cosigned), and what was found (one line: the entry, the log's size, the quorum, or why not)."""

    journal: Any
    ok: bool
    detail: str
    index: int | None = None
    log_size: int | None = None


def check_published(journal: Path, keys: Sequence[PublicKey], policy: Any, proof: Path | None = None) -> Publication:
    """Hold a journal to its proof of logging (``proof``, default :func:`proof_path`) under ``policy``: the entry
    (the proof's extra data) a checkpoint of this run signed by a pinned key, the journal extending it, the entry
    included under the proof's checkpoint, and that checkpoint signed by a listed log and cosigned by the quorum."""
    from trainledger.journal.verify import verify

    def extends(entry_cp: Any) -> None:
        verify(journal, keys=list(keys), allow_unsealed=True, expect_checkpoint=entry_cp)

    return held(proof or proof_path(journal), keys, policy, extends, journal)


def check_checkpoint_published(proof: Path, keys: Sequence[PublicKey], policy: Any, origin: str, size: int,
                               head: str, subject: Any) -> Publication:
    """A signed checkpoint of a run (``origin``, tree ``size``, chain ``head`` "SEQ:HASH": a proof bundle's, a
    release's) held to a proof of logging under ``policy``: the proof's entry must be that very checkpoint."""
    from trainledger.journal.note import NoteError
    from trainledger.journal.proofs.checkpoint import head_extension

    def same(entry_cp: Any) -> None:
        seq, h = head_extension(entry_cp)
        if entry_cp.origin != origin or entry_cp.size != size or f"{seq}:{h}" != head:
            raise NoteError(f"the proof's entry is the checkpoint of {entry_cp.origin} at size {entry_cp.size}, not "
                            f"the one this proves against ({origin} at size {size}): prove against the published "
                            "size (--tree-size), or publish this one")

    return held(proof, keys, policy, same, subject)


def held(path: Path, keys: Sequence[PublicKey], policy: Any, match: Any, subject: Any) -> Publication:
    """The proof of logging at ``path`` under ``policy``: its entry opened under ``keys`` and handed to ``match``
    (which raises when it is not the checkpoint wanted), included at its index, under a checkpoint the quorum
    cosigned."""
    from trainledger.journal.errors import IntegrityError
    from trainledger.journal.keys import read_small_file
    from trainledger.journal.merkle import ProofError
    from trainledger.journal.note import NoteError
    from trainledger.journal.proofs.checkpoint import open_checkpoint
    from trainledger.journal.proofs.tlogproof import MAX_PROOF, check, parse_proof

    if not path.is_file():
        return Publication(subject, False, f"no proof of logging at {path} ('trainledger log prove' writes it)")
    try:
        tp = parse_proof(read_small_file(path, "tlog-proof", limit=MAX_PROOF).decode("utf-8", "replace"))
        if tp.extra is None:
            return Publication(subject, False, f"{path}: the proof does not carry the entry (its extra line)")
        entry_cp, _ = open_checkpoint(tp.extra.decode("utf-8", "replace"), None, keys)
        match(entry_cp)
        cp, quorum = check(policy, tp, tp.extra)
    except (NoteError, ProofError, IntegrityError) as e:
        return Publication(subject, False, f"{path}: {e}")
    if not quorum.met:
        return Publication(subject, False, f"entry {tp.index} of {cp.origin} (size {cp.size}), but {quorum.detail}",
                           tp.index, cp.size)
    return Publication(subject, True, f"entry {tp.index} of {cp.origin} under its checkpoint of size {cp.size}; "
                                      f"{quorum.detail}", tp.index, cp.size)
