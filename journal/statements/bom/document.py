"""Issue a document about a model (:func:`make`) and check one offline (:func:`check`).

:func:`make` verifies and replays every run named (a replay difference refuses: a document rests only on what replay
recomputes), reads the lines the documents draw on, collects the facts (``facts.collect``), builds the document
(``formats.build``) and a proof pack: for every journal a proof bundle of those lines (and of every line from its
compute total to its close, which shows the total is its last), the facts with their sources, and the links from
the document's fields to the facts. :func:`check`, given the document, its pack and the pinned keys alone, verifies
every bundle, collects the facts again from the proven lines, builds the document again and names the first field
where the one it was given differs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from trainledger.journal.errors import IntegrityError, SchemaError, TrainledgerError, UsageError
from trainledger.journal.keys import PublicKey
from trainledger.journal.statements.bom.facts import _tag, collect
from trainledger.journal.statements.bom.formats import FORMATS, build, split_card

__all__ = ["PACK_FORMAT", "NOT_PROVEN", "MAX_DOCUMENT_BYTES", "make", "check", "BomCheck", "BomRefused",
           "pack_path", "documents_journal"]

PACK_FORMAT = "trainledger-bom-proof/v1"
#: a document or pack bigger than this is refused before it is parsed
MAX_DOCUMENT_BYTES = 256 << 20
NOT_PROVEN = ("Every figure in the document is a line of a journal signed by the pinned keys, and replay recomputed "
              "the conclusions among them (gate verdicts, compute totals); that the trainer's observations (token "
              "counts, step times, power, an evaluation's metrics) were true is the trainer's word.")

#: the kinds a document draws on (and the lines that name a journal's run)
_KINDS = frozenset({"run_opened", "rank_joined", "run_configured", "config_logged", "gate_verdict",
                    "evaluation_recorded", "model_exported", "compute_totaled", "run_closed"})


class BomRefused(IntegrityError):
    """A document that its proof pack does not carry (exit 1): ``where`` names the field."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(message, seq=None)
        self.where = where


def pack_path(document: str | os.PathLike) -> Path:
    """Where a document's proof pack is kept: beside it, ``<name>.proof.json``."""
    p = Path(document)
    return p.with_name(p.name + ".proof.json")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make(paths: Sequence[str | os.PathLike], keys: Sequence[PublicKey], fmt: str, *, replay: Callable[..., Any],
         replay_run_dir: Callable[..., Any], version: str, issuer: Any = None, name: str = "",
         progress: Callable[[str], None] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The document ``fmt`` of a model's runs ``paths`` (run folders or journals, in lifecycle order: pre-training
    first, the run that made the model last) and its proof pack. With ``issuer`` (a Signer: the run's key, or a
    release team's), the document's digest is sealed as ``document_issued`` into the model's run's documents
    journal (:func:`documents_journal`), and the pack carries that line's proof. Raises :class:`UsageError` for no
    key, no run or an unknown format, :class:`IntegrityError` for a run that does not verify or that replay
    disagrees with."""
    from trainledger.journal.audit.rundir import is_run_dir, journals_of
    from trainledger.journal.kinds import DocumentIssued
    from trainledger.journal.proofs.bundle import bundle_head, closing_seqs, prove

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS): a document rests on "
                         "signatures by known keys")
    if not paths:
        raise UsageError("no run given: name the model's run folders or journals")
    runs: list[list[list[Any]]] = []
    files: list[list[Path]] = []
    for p in map(Path, paths):
        if progress is not None:
            progress(f"{p}: verifying and replaying")
        ranks = journals_of(p)
        kept: dict[int, list[Any]] = {r: [] for r in ranks}

        def observe(r: int, ev: Any, kept: dict[int, list[Any]] = kept) -> None:  # replay's own verified events
            if _tag(ev) in _KINDS:
                kept[r].append(ev)
        try:
            if is_run_dir(p):
                rec = replay_run_dir(p, keys=list(keys), observe=observe)
            else:
                rec = replay(ranks[0], keys=list(keys), observe=lambda ev, kept=kept: observe(0, ev, kept))
        except TrainledgerError as e:
            raise IntegrityError(f"{p}: does not verify: {e}", seq=None) from None
        if rec.differences:
            d = rec.differences[0]
            raise IntegrityError(f"{p}: replay differs at seq {d['seq']} ({d['kind']}): {d['detail']}: a document "
                                 "rests only on what replay recomputes", seq=None)
        journals = [kept[r] for r in sorted(ranks)]
        runs.append(journals)
        files.append([ranks[r] for r in sorted(ranks)])
    c = collect(runs)
    if fmt == "intoto-eval" and not any(g["metrics"] for g in c.gates) and not c.evaluations:
        raise UsageError("the runs record no gate verdict with a bar and no evaluation: an evaluation-result "
                         "statement would state nothing (choose another --format)")
    doc, links = build(c, fmt, version=version)
    bundles = []
    flat = [(f, events) for fs, js in zip(files, runs) for f, events in zip(fs, js)]
    for j, (f, events) in enumerate(flat):
        seqs = {seq for (jj, seq) in c.lines if jj == j}
        seqs |= {ev.seq for ev in events if _tag(ev) in ("run_opened", "rank_joined")}
        total = next((ev for ev in reversed(events) if _tag(ev) == "compute_totaled"), None)
        closed = next((ev for ev in reversed(events) if _tag(ev) == "run_closed"), None)
        if total is not None and total.seq in seqs:
            closing = closing_seqs(total.seq, closed.seq if closed is not None else None)
            if not closing:
                raise IntegrityError(f"{f}: its compute total (seq {total.seq}) is not followed by its run_closed: a "
                                     "document states a run's last total, which only a closed journal shows (close "
                                     "the run: Recorder.close())", seq=None)
            seqs |= set(closing)
        bundles.append(prove(f, sorted(seqs), keys=list(keys), keep_index=False).bundle)
    heads = {b["run_id"]: bundle_head(b) for b in bundles}  # prove() checked each against its signed root
    issued = None
    if issuer is not None:
        issued = _issue(files[-1][0], f"{c.run or files[-1][0].stem}.documents", issuer,
                        DocumentIssued(format=fmt, sha256=_sha(doc), name=name, heads=heads))
    pack = {"format": PACK_FORMAT, "document": {"format": fmt, "sha256": _sha(doc), "version": version},
            "runs": [{"run": info["run"], "path": str(p), "journals": info["journals"]}
                     for info, p in zip(c.runs, paths)],
            "bundles": bundles, "facts": [f.to_dict() for f in c.facts.values()], "links": links,
            "generated_ns": time.time_ns(), "issued": issued, "not_proven": NOT_PROVEN}
    return doc, pack


def documents_journal(journal: str | os.PathLike) -> Path:
    """The journal a run's documents are issued in: beside its (rank 0's) journal, ``<name>.documents.jsonl``."""
    from trainledger.journal.paths import DOCUMENTS_SUFFIX

    p = Path(journal)
    return p.with_name(p.stem + DOCUMENTS_SUFFIX)


def _issue(journal: Path, run_id: str, issuer: Any, ev: Any) -> dict[str, Any]:
    """Seal ``ev`` (a ``document_issued``) into ``journal``'s documents journal under ``issuer``, and its proof."""
    from trainledger.journal.paths import confined
    from trainledger.journal.proofs.bundle import prove
    from trainledger.journal.writer import Journal

    path = documents_journal(journal)
    if path.is_symlink():  # whoever can write the run folder could point it elsewhere: it must stay in the folder
        confined(path.parent, path.name, what="documents journal")
    if path.exists() or path.is_symlink():
        j = Journal.open_append(path, signer=issuer, background=False)
    else:
        j = Journal.create(path, signer=issuer, run_id=run_id, background=False)
    try:
        seq, _ = j.append(ev, durable=True)
    finally:
        j.suspend()
    return prove(path, [seq], keys=[issuer.public], keep_index=False).bundle


class _Doc(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    sha256: str
    version: str


class _Run(msgspec.Struct, forbid_unknown_fields=True):
    run: str | None
    path: str
    journals: list[int]


class _Pack(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    document: _Doc
    runs: list[_Run]
    bundles: list[msgspec.Raw]
    facts: list[dict[str, Any]]
    links: list[dict[str, str]]
    generated_ns: int
    not_proven: str
    issued: msgspec.Raw = msgspec.Raw(b"null")


@dataclasses.dataclass
class BomCheck:
    """What checking a document established: its format, the runs, the facts (each recomputed from proven lines)
    and the links; ``issued_as``: whether the document is byte for byte the one its pack was issued with."""

    format: str
    runs: list[str | None]
    facts: int
    links: int
    reproduced: int
    issued_as: bool
    seconds: float
    not_proven: str = NOT_PROVEN
    #: the key that issued the document (its ``document_issued`` proven under a pinned key), or None: not issued
    issued_by: str | None = None
    #: the key id an issuance names that no pinned key is (the issuance is then not checked, and not trusted)
    issued_unpinned: str | None = None


def _first_difference(fmt: str, got: bytes, want: bytes) -> str:
    """Where a document differs from the one rebuilt: a JSON pointer-like path, or ``body`` for a card's prose."""
    from trainledger.journal.text import first_difference

    def same(a: Any, b: Any) -> bool:
        return type(a) is type(b) and a == b

    try:
        if fmt == "hf-card":
            gm, gb = split_card(got.decode())
            wm, wb = split_card(want.decode())
            where = first_difference(gm, wm, same)
            return where if where is not None else ("body" if gb != wb else "the bytes (layout)")
        where = first_difference(json.loads(got), json.loads(want), same)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return f"the whole document (it does not parse: {type(e).__name__})"
    return where if where is not None else "the bytes (layout)"


def check(doc: bytes, pack_data: bytes, keys: Sequence[PublicKey]) -> BomCheck:
    """Check ``doc`` against its proof pack under the pinned ``keys``, with no journal: every bundle verifies,
    the facts are collected again from the proven lines, and the document built from them is the one given.
    Raises :class:`BomRefused` naming the first field that differs, :class:`IntegrityError` for a proof that does
    not hold, :class:`SchemaError` for a pack that is not one, :class:`UsageError` for no key."""
    from trainledger.journal.proofs.bundle import decode_document, proven_to_close, verify_bundle

    t0 = time.perf_counter()
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS)")
    if len(doc) > MAX_DOCUMENT_BYTES:
        raise UsageError(f"a document of {len(doc):,} bytes: more than {MAX_DOCUMENT_BYTES:,}")
    pack = decode_document(pack_data, _Pack, PACK_FORMAT, what="document's proof pack", short="proof pack",
                           limit=MAX_DOCUMENT_BYTES)
    fmt = pack.document.format
    if pack.not_proven != NOT_PROVEN:  # a reader of the pack itself would take its word for what it proves
        raise BomRefused("the pack's text of what it does not prove is not the one trainledger writes (changed "
                         "after it was written)", "not_proven")
    if fmt not in FORMATS:
        raise SchemaError(f"a document format {fmt[:40]!r} not among {', '.join(FORMATS)}", seq=None)
    proven: list[list[Any]] = []
    heads: dict[str, str] = {}
    for j, raw in enumerate(pack.bundles):
        try:
            res = verify_bundle(bytes(raw), keys)
        except UsageError:
            raise
        except TrainledgerError as e:
            raise IntegrityError(f"journal {j} of the pack: {e}", seq=None) from None
        events = sorted(res.events, key=lambda e: e.seq)
        for ev in events:
            if _tag(ev) == "compute_totaled" and not proven_to_close(events, ev.seq):
                raise BomRefused(f"journal {j} of the pack: its compute total (seq {ev.seq}) is not shown to be its "
                                 "last (the proof does not reach its run_closed)", f"journal {j}")
        proven.append([ev for ev in events if _tag(ev) in _KINDS])
        heads[res.run_id] = res.head
    order = [j for r in pack.runs for j in r.journals]
    if sorted(order) != list(range(len(proven))):
        raise SchemaError("the pack's runs do not name each of its journals once", seq=None)
    c = collect([[proven[j] for j in r.journals] for r in pack.runs])
    for r, info in zip(pack.runs, c.runs):
        if r.run != info["run"]:
            raise BomRefused(f"the pack names run {r.run}, its proven lines are run {info['run']}", "runs")
    rebuilt, links = build(c, fmt, version=pack.document.version)
    stated = {f["name"]: f for f in pack.facts if isinstance(f, dict) and isinstance(f.get("name"), str)}
    for name, fact in c.facts.items():
        if stated.get(name) != fact.to_dict():
            raise BomRefused(f"the pack's fact {name} is not what its proven lines give", f"facts.{name}")
    if pack.links != links:
        raise BomRefused("the pack's links are not where the document's figures stand", "links")
    if doc != rebuilt:
        where = _first_difference(fmt, doc, rebuilt)
        raise BomRefused(f"the document's {where} is not what the proven lines give: edited after it was issued, "
                         "or never issued from them", where)
    issued_by = issued_unpinned = None
    raw = bytes(pack.issued)
    if raw.strip() != b"null":
        from trainledger.journal.proofs.bundle import parse_bundle

        by = parse_bundle(raw).key_id
        if by not in {k.key_id for k in keys}:  # issued by someone this reader does not pin: said, not trusted
            raw = b"null"
            issued_unpinned = by[:16]  # the pack's word, unchecked: shown as far as a key id goes
    if raw.strip() != b"null":
        try:
            res = verify_bundle(raw, keys)
        except UsageError:
            raise
        except TrainledgerError as e:
            raise IntegrityError(f"the document's issuance: {e}", seq=None) from None
        got = [ev for ev in res.events if _tag(ev) == "document_issued"]
        if len(got) != 1:
            raise SchemaError("the issuance proves no single document_issued line", seq=None)
        ev = got[0]
        if ev.sha256 != _sha(doc) or ev.format != fmt:
            raise BomRefused(f"the document is not the one issued (document_issued at seq {ev.seq} of "
                             f"{res.run_id} names a {ev.format} of sha256 {ev.sha256[:16]}...)", "document")
        if ev.heads != heads:
            raise BomRefused("the document was issued over other journal heads than its proofs reach", "issued")
        issued_by = res.key_id
    return BomCheck(fmt, [info["run"] for info in c.runs], len(c.facts), len(links),
                    sum(f.basis == "reproduced" for f in c.facts.values()), _sha(doc) == pack.document.sha256,
                    time.perf_counter() - t0, issued_by=issued_by, issued_unpinned=issued_unpinned)
