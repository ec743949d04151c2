"""The writer's first part: the chain and its buffer, the lines of a journal as they are made.

Pure state and arithmetic: no file, no thread, no clock (the caller gives every line its time). Each line is an
encoded event with its ``seq``, ``ts`` and ``h`` added (docs/FORMAT.md section 3), appended to one ``bytearray``; the
lines join the Merkle tree of every line written (section 4.1) a batch at a time, before they leave the buffer; a
seal's message is the signed note of that tree's head. ``tests/unit/journal/test_chainbuffer.py`` holds it byte for
byte to the format's worked example.
"""

from __future__ import annotations

import binascii

from trainledger.journal import accel as _accel
from trainledger.journal.chain import seal_checkpoint, seal_message
from trainledger.journal.merkle import CompactRange, range_of_block

__all__ = ["ChainBuffer", "chain_line", "chain_step"]

_link = _accel.link
_hexlify = binascii.hexlify


def chain_line(buf: bytearray, body: bytes, prev: bytes, seq: int, ts: int) -> tuple[bytes, bytes]:
    """One line of the chain onto the end of ``buf``: ``body`` (an encoded event) with its seq, ts and hash; returns
    the hash and its hex (the accelerator's ``chain_append`` where it is built: the same bytes in one call)."""
    prefix = b'%b,"seq":%d,"ts":%d' % (body[:-1], seq, ts)
    d = _link(prev, prefix)
    hx = _hexlify(d)
    buf += b'%b,"h":"%b"}\n' % (prefix, hx)
    return d, hx


#: the chain step the writer runs: the accelerator's ``chain_append`` where it is built, else :func:`chain_line`
chain_step = getattr(_accel.fast, "chain_append", None) or chain_line
_chain = chain_step


class ChainBuffer:
    """The head of the chain and the lines not yet handed on.

    ``seq``: the next line's seq; ``prev``: the last line's hash (the genesis hash before the first); ``head_hex``
    its hex; ``buf``: the lines not yet written out; ``tree``: the Merkle tree of every line so far (None for a
    journal of a format before tree heads), of which the buffer's lines from ``unhashed`` on are not yet part.
    """

    __slots__ = ("seq", "prev", "head_hex", "buf", "tree", "unhashed")

    def __init__(self, seq: int, prev: bytes, tree: CompactRange | None):
        self.seq = seq
        self.prev = prev
        self.head_hex = _hexlify(prev)
        self.buf = bytearray()
        self.tree = tree
        self.unhashed = 0

    def add(self, body: bytes, ts: int) -> tuple[int, bytes]:
        """Chain one encoded event at time ``ts`` (ns); return its seq and the hex of its hash."""
        seq = self.seq
        d, hx = _chain(self.buf, body, self.prev, seq, ts)
        self.seq = seq + 1
        self.prev = d
        self.head_hex = hx
        return seq, hx

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, hash_hex)`` of the last line chained."""
        return self.seq - 1, self.head_hex.decode()

    def hash_pending(self) -> None:
        """Add the buffered lines not yet in the tree to it (a batch: in C where the accelerator is built)."""
        buf = self.buf
        if self.tree is not None and len(buf) > self.unhashed:  # the buffer holds whole lines
            self.tree.merge(range_of_block(self.tree.end, buf, self.unhashed))
            self.unhashed = len(buf)

    def written(self, n: int) -> None:
        """The first ``n`` bytes of the buffer were written out (after :meth:`hash_pending`): drop them."""
        del self.buf[:n]
        self.unhashed = len(self.buf)

    def seal_message(self, run_id: str) -> tuple[bytes, int | None, str | None]:
        """What a seal of the head signs, with the tree's size and root (hex) it names: the signed note of the tree
        of every line so far (format 1.3), or for a journal without a tree the older seal message (size and root
        None)."""
        tree = self.tree
        if tree is None:
            return seal_message(run_id, self.seq - 1, self.prev), None, None
        self.hash_pending()
        root = tree.root()
        return seal_checkpoint(run_id, tree.end, root, self.seq - 1, self.prev).encode(), tree.end, root.hex()
