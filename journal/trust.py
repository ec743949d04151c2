"""What a reader is willing to call verified: one value, :class:`TrustPolicy`, that every reading function takes.

A journal is verified against a policy: the public keys pinned for it, whether the key embedded in the journal
may stand in for a pinned one (integrity only), whether an unsigned journal or unsigned events after the last
seal are acceptable, a head or a signed checkpoint published earlier that the journal must contain, and whether
the run must be closed. ``verify``, ``replay``, ``query``, ``report``, run folders and the proof commands take
the policy as ``trust=`` (or its fields as keywords, for one-off calls), and pass the one value on; the CLI
builds it once from the shared trust options (:func:`trainledger.cli.options.trust_policy`).

    from trainledger.journal import TrustPolicy, trusted_keys, verify
    policy = TrustPolicy(keys=trusted_keys(["keys/trainledger.pub"]), require_closed=True)
    verify("runs/mine/journal.jsonl", trust=policy)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from trainledger.journal.roster import Roster
from trainledger.journal.errors import UsageError
from trainledger.journal.keys import PublicKey

__all__ = ["TrustPolicy", "parse_head"]


def parse_head(text: str) -> tuple[int, str]:
    """Parse ``SEQ:HASH`` (64 lowercase hex digits); raise :class:`UsageError` otherwise."""
    seq_s, sep, h = text.partition(":")
    if not sep or not seq_s.isdigit() or len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise UsageError(f"--expect-head {text!r}: expected SEQ:HASH with a 64-digit lowercase hex hash")
    return int(seq_s), h


@dataclasses.dataclass(frozen=True)
class TrustPolicy:
    """The trust a reading command extends to a journal. Fail closed: the default trusts nothing, so a signed
    journal needs ``keys`` (or ``trust_embedded``) and an unsigned one ``allow_unsigned``.

    ``keys``: the pinned public keys; the journal's key must be one of them. ``trust_embedded``: check against
    the key in ``run_opened`` instead (reported as "authenticity not established"). ``allow_unsigned``: accept a
    journal with no signatures. ``allow_unsealed``: accept a signed journal whose last events no seal covers;
    only its signed prefix is then verified and used. ``expect_head``: ``(seq, hash)`` or ``"SEQ:HASH"`` that the
    journal must contain. ``expect_checkpoint``: an opened signed checkpoint the journal must extend.
    ``require_closed``: the run must have been closed and sealed. ``roster``: which key signs which rank of a run
    folder (:class:`trainledger.journal.roster.Roster`, ``load_roster(FILE)``); the public keys it spells out
    are pinned with it.

    Raises :class:`UsageError` for a value of the wrong type (at construction, not later).
    """

    keys: tuple[PublicKey, ...] = ()
    trust_embedded: bool = False
    allow_unsigned: bool = False
    allow_unsealed: bool = False
    expect_head: tuple[int, str] | None = None
    expect_checkpoint: Any = None
    require_closed: bool = False
    roster: Roster | None = None

    def __post_init__(self) -> None:
        keys = self.keys
        if isinstance(keys, PublicKey):
            keys = (keys,)
        if not isinstance(keys, Iterable) or isinstance(keys, (str, bytes)):
            raise UsageError(f"trust: keys must be public keys, got {type(keys).__name__}")
        keys = tuple(keys)
        for k in keys:
            if not isinstance(k, PublicKey):
                raise UsageError(f"trust: keys must be public keys (trusted_keys, load_public_key), got "
                                 f"{type(k).__name__}")
        if self.roster is not None:
            if not isinstance(self.roster, Roster):
                raise UsageError(f"trust: roster must be a Roster (load_roster), got {type(self.roster).__name__}")
            have = {k.key_id for k in keys}
            keys += tuple(k for k in self.roster.keys if k.key_id not in have)
        object.__setattr__(self, "keys", keys)
        for name in ("trust_embedded", "allow_unsigned", "allow_unsealed", "require_closed"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"trust: {name} must be True or False, got {getattr(self, name)!r}")
        head = self.expect_head
        if isinstance(head, str):
            object.__setattr__(self, "expect_head", parse_head(head))
        elif head is not None:
            if (not isinstance(head, tuple) or len(head) != 2 or not isinstance(head[0], int)
                    or not isinstance(head[1], str)):
                raise UsageError(f"trust: expect_head must be (seq, hash) or 'SEQ:HASH', got {head!r}")

    @classmethod
    def of(cls, trust: TrustPolicy | None = None, **options: Any) -> TrustPolicy:
        """``trust`` with ``options`` (its fields) overriding it; the default policy when neither is given.

        Raises :class:`UsageError` for an option that is not a field of the policy."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UsageError(f"trust: unknown option(s) {', '.join(unknown)}")
        if trust is None:
            return cls(**options)
        if not isinstance(trust, TrustPolicy):
            raise UsageError(f"trust: expected a TrustPolicy, got {type(trust).__name__}")
        return dataclasses.replace(trust, **options) if options else trust

    def describe(self) -> str:
        """One line for messages: what this policy accepts."""
        parts = [f"{len(self.keys)} pinned key(s)" if self.keys else
                 ("the embedded key" if self.trust_embedded else "no key")]
        parts += [name.replace("_", " ") for name in ("allow_unsigned", "allow_unsealed", "require_closed")
                  if getattr(self, name)]
        if self.expect_head is not None:
            parts.append(f"head {self.expect_head[0]}:{self.expect_head[1][:12]}...")
        if self.expect_checkpoint is not None:
            parts.append("an expected checkpoint")
        if self.roster is not None:
            parts.append(f"a roster of {self.roster.describe()}")
        return ", ".join(parts)
