"""Which key signs which rank of a run folder: the roster.

With one key per node (or per rank), pinning every key is not enough: any key holder could write any rank's journal
and it would still be signed by a pinned key. A roster binds each rank to its key, and ``verify RUN_DIR`` (and
every command that checks a run folder whole) holds each rank journal to it. It comes from one of two places:

- **the operator** (``--roster FILE``, ``TrustPolicy(roster=...)``): the strongest binding, made when the keys were
  handed out. One entry a line, ``RANKS KEY``: RANKS is a rank (``3``), a range (``0-7``) or ``*`` (every rank no
  other line names); KEY is a key id (16 hex digits, the key then pinned as usual) or a public key line
  (``trainledger-ed25519 BASE64 [id]``, which also pins it). ``#`` starts a comment. A rank the roster does not name
  fails; so does a rank signed by another key than its own.
- **rank 0's signed record**: every anchor (``ranks_anchored.keys``, format 1.5) records the key id each rank signs
  with, from the same collective as the heads, and every other rank records rank 0's (``anchor_recorded.key``).
  Each rank is then held to the key rank 0 recorded, and rank 0 to the key the others recorded. This trusts rank 0's
  key holder for the other ranks' keys, and the other ranks together for rank 0's: a party holding every key but
  rank 0's (in a 2-rank run: rank 1's) can still rewrite rank 0. Pin the roster where that matters.

A folder signed by one key needs neither (whoever holds it can write every rank anyway). A folder signed by several
keys with a rank that neither binds (no anchor recorded the keys yet, or a journal from before format 1.5) fails, and
the message says to pin a roster.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from pathlib import Path

from trainledger.journal.errors import IntegrityError, KeyFileError
from trainledger.journal.keys import PUBKEY_PREFIX, PublicKey, parse_public_key, read_small_file

__all__ = ["Roster", "RosterMismatch", "load_roster", "split_run_id", "key_words", "ROSTER_LIMIT"]

ROSTER_LIMIT = 4 << 20  # bytes: 16,000 ranks a line each, with public keys, is about 1.2 MB
_RANKS = re.compile(r"(\d{1,7})(?:-(\d{1,7}))?\Z")
_KEY_ID = re.compile(r"[0-9a-f]{16}\Z")
_RUN_ID = re.compile(r"(.+)\.r([0-9]{5})")


def split_run_id(run_id: str | None) -> tuple[str, int] | None:
    """``(RUN, rank)`` of a rank journal's run id (``RUN.r00003``: training.distributed.ranks), else None."""
    m = _RUN_ID.fullmatch(run_id or "")
    return (m.group(1), int(m.group(2))) if m else None


class RosterMismatch(IntegrityError):
    """A rank journal is signed by another key than the one the roster (or rank 0's record) binds to its rank."""

    reason = "roster"


@dataclasses.dataclass(frozen=True)
class Roster:
    """Ranks to key ids: ``ranges`` sorted ``(first, last, key_id)``, ``default`` the ``*`` entry's key id;
    ``keys`` the public keys the roster spelled out (pinned with it); ``source`` where it came from."""

    ranges: tuple[tuple[int, int, str], ...]
    default: str | None = None
    keys: tuple[PublicKey, ...] = ()
    source: str = "<roster>"

    def key_for(self, rank: int) -> str | None:
        """The key id bound to ``rank``, or None when the roster does not name it."""
        i = bisect.bisect_right(self.ranges, (rank, float("inf"))) - 1
        if i >= 0 and self.ranges[i][0] <= rank <= self.ranges[i][1]:
            return self.ranges[i][2]
        return self.default

    def hold(self, rank: int, key_id: str | None, *, seq: int | None = 0) -> None:
        """Raise :class:`RosterMismatch` unless ``rank``'s journal, signed by ``key_id``, is signed by its key."""
        want = self.key_for(rank)
        if want is None:
            raise RosterMismatch(f"the roster {self.source} names no key for rank {rank}", seq=seq)
        if key_id != want:
            raise RosterMismatch(f"signed by {key_words(key_id)}, but the roster {self.source} binds key {want} to "
                                 f"rank {rank}", seq=seq)

    def describe(self) -> str:
        n = sum(b - a + 1 for a, b, _ in self.ranges)
        return f"{n:,} ranks{' and *' if self.default else ''} from {self.source}"

    @classmethod
    def parse(cls, text: str, source: str = "<roster>") -> Roster:
        """A roster from its text (the module docstring's format). Raises :class:`KeyFileError` naming the line."""
        ranges: list[tuple[int, int, str]] = []
        default: str | None = None
        keys: dict[str, PublicKey] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{source}:{n}"
            ranks, _, key = line.partition(" ")
            key = key.strip()
            if not key:
                raise KeyFileError(f"{where}: expected 'RANKS KEY' (a rank, a range FIRST-LAST or *, then a key id "
                                   "or a public key)")
            if key.startswith(PUBKEY_PREFIX):
                pk = parse_public_key(key, where)
                keys[pk.key_id] = pk
                key_id = pk.key_id
            elif _KEY_ID.match(key):
                key_id = key
            else:
                raise KeyFileError(f"{where}: {key[:40]!r} is not a key id (16 lowercase hex digits) or a public key "
                                   f"line ({PUBKEY_PREFIX} BASE64)")
            if ranks == "*":
                if default is not None:
                    raise KeyFileError(f"{where}: a second '*' line")
                default = key_id
                continue
            m = _RANKS.match(ranks)
            if not m:
                raise KeyFileError(f"{where}: {ranks[:20]!r} is not a rank, a range FIRST-LAST or *")
            first, last = int(m.group(1)), int(m.group(2) or m.group(1))
            if last < first:
                raise KeyFileError(f"{where}: the range {ranks} runs backwards")
            ranges.append((first, last, key_id))
        if not ranges and default is None:
            raise KeyFileError(f"{source}: the roster names no rank")
        ranges.sort()
        for (a0, a1, _), (b0, b1, _) in zip(ranges, ranges[1:]):
            if b0 <= a1:
                raise KeyFileError(f"{source}: ranks {b0}-{min(a1, b1)} are named twice")
        return cls(tuple(ranges), default, tuple(keys.values()), source)


def load_roster(path: str | Path) -> Roster:
    """The roster in file ``path``: a regular file of at most :data:`ROSTER_LIMIT` bytes, UTF-8 text."""
    p = Path(path)
    data = read_small_file(p, "roster", limit=ROSTER_LIMIT)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{p}: the roster is not UTF-8 text") from None
    return Roster.parse(text, str(p))


def key_words(key_id: str | None) -> str:
    """``key ID``, or ``no key (unsigned)``: how messages name the key a journal is signed by."""
    return "no key (unsigned)" if key_id is None else f"key {key_id}"
