"""The one place that turns events into bytes and bytes into events.

A journal line is the canonical encoding of a *record*: the event's fields in
declaration order after its ``kind`` tag, then ``seq``, ``ts`` and ``h``::

    {"kind":"step_observed","step":3,"loss":2.5,...,"seq":7,"ts":1732...,"h":"9f2c..."}

For each event class the codec derives a record class (a subclass with the
three trailing members), so a decoded record *is* an instance of its event
class and projections can treat live events and replayed records alike.

Canonical form is whatever this module writes: msgspec's compact JSON, fields
in declaration order, floats in shortest round-trip form, non-finite floats as
``"NaN"``/``"Infinity"``/``"-Infinity"``. Decoding is strict by construction:
a line is decoded, re-encoded, and must come back byte-identical, so duplicate
keys, reordered keys, whitespace, other float spellings and numbers-as-strings
all fail as :class:`NonCanonicalRecord`.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Union

import msgspec

from trainledger.journal.errors import NonCanonicalRecord, SchemaError
from trainledger.journal.events import Event

__all__ = [
    "UnknownEvent",
    "encode_event",
    "encoder_for",
    "encode_record",
    "decode_line",
    "decode_batch",
    "decode_block",
    "decode_unchecked_block",
    "record_type",
    "refresh",
    "known_kinds",
    "HASH_SUFFIX_LEN",
]

#: Length of ``,"h":"<64 hex>"}`` at the end of every line (newline excluded).
HASH_SUFFIX_LEN = 72
_BOUNDARY = b'},{"kind":"'
_RESERVED = frozenset({"kind", "seq", "ts", "h"})
_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")

#: The deepest nesting of arrays and objects a line may hold (the line itself is level 1). Deeper lines are
#: refused by the writer and are a schema error to every reader: without a cap, nesting alone exhausts a
#: parser's recursion. Strings are capped by the line length (16 MiB, ``_scan.MAX_LINE``).
MAX_DEPTH = 32
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def nesting_depth(line: bytes) -> int:
    """How deeply arrays and objects nest in one JSON line (brackets inside strings do not count)."""
    bare = _JSON_STRING.sub(b"", line).translate(None, _NOT_BRACKET)
    depth = best = 0
    for c in bare:
        if c == 0x5B or c == 0x7B:
            depth += 1
            if depth > best:
                best = depth
        else:
            depth -= 1
    return best


def too_deep(line: bytes) -> bool:
    """Whether ``line`` nests deeper than :data:`MAX_DEPTH` (a byte count first: almost every line is flat)."""
    return line.count(b"[") + line.count(b"{") > MAX_DEPTH and nesting_depth(line) > MAX_DEPTH

_encoder = msgspec.json.Encoder()
_generic_decoder = msgspec.json.Decoder()


class UnknownEvent(msgspec.Struct, frozen=True):
    """A line whose kind this version does not know: verified, then skipped by projections."""

    kind: str
    seq: int
    ts: int
    h: str
    fields: dict[str, Any]


class _KindInfo:
    """Per-class facts the hot paths need, computed once (the encoder when first asked for: a reader never is)."""

    __slots__ = ("cls", "kind", "record", "_encode", "scalars")

    def __init__(self, cls: type, kind: str, record: type):
        self.cls = cls
        self.kind = kind
        self.record = record
        self._encode: Callable[[Any], bytes] | None = None
        self.scalars: tuple[bytes, bytes] | None = None  # (offsets, kinds) of a class of plain ints and floats

    @property
    def encode(self) -> Callable[[Any], bytes]:
        """The class's canonical encoder. Scalar-only classes are fully validated by a strict typed decode; a
        class with containers also needs the decode to re-encode identically (an int inside a list[float] passes
        the decode but would not read back as written)."""
        if self._encode is None:
            import msgspec.inspect

            fields = typing.cast(Any, msgspec.inspect.type_info(self.cls)).fields  # a StructType's
            flat = all(_is_flat_type(f.type) for f in fields)
            spec = _scalar_spec(self.cls, fields)
            self.scalars = None if spec is None else spec[1:]
            self._encode = _make_encoder(msgspec.json.Decoder(self.cls), flat, spec)
        return self._encode


_by_event: dict[type, _KindInfo] = {}  # event class -> info
_by_record: dict[type, _KindInfo] = {}  # record class -> info
_by_kind: dict[str, type] = {}  # kind -> event class
_decoder: msgspec.json.Decoder | None = None
_batch_decoder: msgspec.json.Decoder | None = None


def _is_flat_type(t: Any) -> bool:
    """True for scalar field types (no container that could hide a number)."""
    ti = msgspec.inspect
    flat = (ti.IntType, ti.FloatType, ti.StrType, ti.BoolType, ti.NoneType, ti.LiteralType)
    if isinstance(t, flat):
        return True
    if isinstance(t, ti.UnionType):
        return all(isinstance(x, flat) for x in t.types)
    return False


#: ``typing.Union``, subscripted with a tuple built at run time (which a type checker cannot follow)
_Union: Any = Union


def _widened_floats(cls: type) -> list[tuple]:
    """Record-field overrides that read a top-level float field as ``int | float``.

    The writer does not turn ``loss=3`` into ``3.0`` (that would cost every
    append a conversion); it writes ``3``, and the record reads it back as the
    int 3, so the line stays canonical. Overridden fields keep their position.
    """
    out: list[tuple] = []
    for f in msgspec.structs.fields(cls):
        t = f.type
        args = typing.get_args(t) if typing.get_origin(t) in (Union, types.UnionType) else (t,)
        if float in args and all(a in (float, type(None)) for a in args):
            new_t = _Union[(int, *args)]
            if f.default is not msgspec.NODEFAULT:
                out.append((f.name, new_t, f.default))
            elif f.default_factory is not msgspec.NODEFAULT:
                out.append((f.name, new_t, msgspec.field(default_factory=f.default_factory)))
            else:
                out.append((f.name, new_t))
    return out


def _register(cls: type) -> _KindInfo:
    info = _by_event.get(cls)
    if info is not None:
        return info
    if not (isinstance(cls, type) and issubclass(cls, Event)) or cls is Event or cls in _by_record:
        raise TypeError(f"not an event class: {cls!r}")
    cfg = cls.__struct_config__
    kind = cfg.tag
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise TypeError(f"{cls.__name__}: event tag must be snake_case (got {kind!r}); pass tag=\"...\"")
    if not cfg.frozen:
        raise TypeError(f"{cls.__name__}: event classes must be frozen")
    clash = _RESERVED.intersection(cls.__struct_fields__)
    if clash:
        raise TypeError(f"{cls.__name__}: field names {sorted(clash)} are reserved for the journal")
    other = _by_kind.get(kind)
    if other is not None and other is not cls:
        raise TypeError(f"{cls.__name__}: kind {kind!r} is already used by {other.__name__}")
    record = msgspec.defstruct(
        cls.__name__ + "Record",
        _widened_floats(cls) + [("seq", int), ("ts", int), ("h", str)],
        bases=(cls,),
        tag=kind,
        kw_only=True,
        frozen=True,
        module=cls.__module__,
    )
    info = _KindInfo(cls, kind, record)
    _by_event[cls] = info
    _by_record[record] = info
    _by_kind[kind] = cls
    global _decoder, _batch_decoder
    _decoder = _batch_decoder = None
    return info


def _walk(cls: type):
    for sub in cls.__subclasses__():
        if sub not in _by_record:
            yield sub
            yield from _walk(sub)


_rejected: set[type] = set()


def refresh() -> None:
    """Register every :class:`Event` subclass defined so far (readers call this).

    A class that breaks the rules is skipped here (a reader must not fail
    because some module defined a bad kind); encoding one raises ``TypeError``.
    """
    for cls in list(_walk(Event)):
        if cls not in _by_event and cls not in _rejected:
            try:
                _register(cls)
            except TypeError:
                _rejected.add(cls)


def known_kinds() -> dict[str, type]:
    """Kind name -> event class, for every kind registered so far."""
    refresh()
    return dict(_by_kind)


def is_record_type(cls: type) -> bool:
    """Whether ``cls`` is one of the record classes the codec derives (an event class plus seq, ts, h)."""
    return cls in _by_record


def record_type(cls: type) -> type:
    """The record class (event + seq, ts, h) of an event class."""
    return _register(cls).record


def _decoders() -> tuple[msgspec.json.Decoder, msgspec.json.Decoder]:
    global _decoder, _batch_decoder
    if _decoder is None or _batch_decoder is None:
        refresh()
        records = tuple(info.record for info in _by_event.values())
        union = Union[records] if len(records) > 1 else records[0]  # noqa: UP007
        # strict=False lets "NaN"/"Infinity"/"-Infinity" decode into float fields; every
        # other leniency it allows is caught by the byte-exact re-encoding check.
        _decoder = msgspec.json.Decoder(union, strict=False)
        _batch_decoder = msgspec.json.Decoder(types.GenericAlias(list, (union,)), strict=False)
        _flat.clear()
        _flat.update(r for r in records if _is_flat(r))
    return _decoder, _batch_decoder


#: Record types none of whose fields can hold a container (a line of one nests exactly one level).
_flat: set[type] = set()
_SCALARS = (int, float, str, bool, type(None))


def _is_flat(record: type) -> bool:
    import typing

    for hint in typing.get_type_hints(record).values():
        args = typing.get_args(hint) if typing.get_origin(hint) in (Union, getattr(__import__("types"), "UnionType")) \
            else (hint,)
        if not all(a in _SCALARS for a in args):
            return False
    return True


# ---------------------------------------------------------------- non-finite floats


def nonfinite_to_str(obj: Any) -> Any:
    if isinstance(obj, float):
        if obj != obj:
            return "NaN"
        if obj == math.inf:
            return "Infinity"
        if obj == -math.inf:
            return "-Infinity"
        return obj
    if isinstance(obj, dict):
        return {k: nonfinite_to_str(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [nonfinite_to_str(v) for v in obj]
    return obj


def _scalar_spec(cls: type, fields: Any) -> tuple[Any, bytes, bytes] | None:
    """For a class whose fields are all ints and floats without constraints (None allowed only where it is the
    default, so it is left out of the line): the accelerator's ``encode_scalars`` and the offsets and kinds its
    check reads, which settle what the strict decode of the writer's check would (``step_observed``'s fields are
    all such). None for any other class, or without the accelerator."""
    from trainledger.journal.accel import fast  # None without it, or with TRAINLEDGER_NO_ACCEL

    if fast is None or not hasattr(fast, "encode_scalars"):
        return None
    ti = msgspec.inspect
    kinds = []
    for f in fields:
        t, optional = f.type, False
        if isinstance(t, ti.UnionType):
            rest = [x for x in t.types if not isinstance(x, ti.NoneType)]
            if len(rest) != 1 or f.default is not None:
                return None
            t, optional = rest[0], True
        if type(t) not in (ti.IntType, ti.FloatType) or any(
                getattr(t, c, None) is not None for c in ("gt", "ge", "lt", "le", "multiple_of")):
            return None
        kinds.append(("I" if optional else "i") if type(t) is ti.IntType else ("F" if optional else "f"))
    offsets = fast.slot_offsets(cls, tuple(f.name for f in fields))
    return None if offsets is None else (fast.encode_scalars, offsets, "".join(kinds).encode())


def _make_encoder(check: msgspec.json.Decoder, flat: bool,
                  scalars: tuple[Any, bytes, bytes] | None = None) -> Callable[[Any], bytes]:
    """The canonical encoder of one event class: a closure, one call on the hot path. ``scalars``
    (:func:`_scalar_spec`): a class of ints and floats, whose values are checked in C instead of by a decode when
    they are plainly right (exact ints and finite floats; anything else takes the path below, which decides)."""
    encode = _encoder.encode
    decode = check.decode
    invalid = msgspec.ValidationError
    if scalars is not None:  # encode(obj) if its values are plainly right, else the closure below
        import functools

        encode_scalars, offsets, kinds = scalars
        return functools.partial(encode_scalars, encode, _make_encoder(check, flat), offsets, kinds)

    def encode_event(obj: Any) -> bytes:
        out = encode(obj)
        if not flat and too_deep(out):
            raise TypeError(f"{type(obj).__name__}: nested deeper than {MAX_DEPTH} levels")
        # Fields equal to their default (None included) are omitted, so a null here
        # is a NaN or an infinity (msgspec writes those as null), or a None where
        # None is not the default: the exact path handles all of them.
        if out.find(b"null") >= 0:
            return _encode_exact(obj)
        # A strict typed decode proves every field has a type the reader accepts.
        try:
            back = decode(out)
        except invalid:
            return _encode_exact(obj)  # normalizes by schema, or raises TypeError
        if not flat and encode(back) != out:
            return _encode_exact(obj)
        return out

    return encode_event


def _encode_exact(obj: Any) -> bytes:
    """The slow, always-right path: normalize types by schema, spell non-finite floats."""
    try:
        norm = msgspec.convert(nonfinite_to_str(msgspec.to_builtins(obj)), type(obj), strict=False)
    except msgspec.ValidationError as e:
        raise TypeError(f"{type(obj).__name__}: {e}") from None
    return _encoder.encode(nonfinite_to_str(msgspec.to_builtins(norm)))


# ---------------------------------------------------------------- public API


def encode_event(event: Event) -> bytes:
    """Canonical bytes of an event without seq/ts/h: ``{"kind":...,<fields>}``.

    Raises ``TypeError`` for an object that is not an event (records read back
    from a journal included: they already carry seq, ts and h).
    """
    info = _by_event.get(type(event))
    if info is None:
        info = _register(type(event))
    return (info._encode or info.encode)(event)


def encode_document(obj: Any) -> bytes:
    """Canonical JSON of a small document that is not an event (a signed approval and its message): keys sorted,
    no whitespace."""
    return msgspec.json.encode(obj, order="sorted")


def encode_trusted(event: Event) -> bytes:
    """Canonical bytes of an event whose fields already have their declared types (no validation decode):
    what the writer's deferred path uses for events the training loop built itself."""
    out = _encoder.encode(event)
    return _encode_exact(event) if out.find(b"null") >= 0 else out


def scalar_spec(cls: type) -> tuple[bytes, bytes] | None:
    """For an event class of plain ints and floats (:func:`_scalar_spec`), the slot offsets and kinds the
    accelerator's check reads: an event of it whose values pass that check encodes as :func:`encode_into` writes it.
    None for any other class, or without the accelerator."""
    info = _register(cls)
    info.encode  # noqa: B018 (computes the spec with the encoder)
    return info.scalars


#: ``encode_into(event, buf, offset)``: msgspec's encoding of an event written into a bytearray from ``offset`` (the
#: writer's C append calls it for a class :func:`scalar_spec` names, once it has checked the values)
encode_into = _encoder.encode_into


def encoder_for(cls: type) -> Callable[[Any], bytes]:
    """The canonical encoder of one event class (what :func:`encode_event` calls)."""
    return _register(cls).encode


def encode_record(record: Any) -> bytes:
    """Canonical bytes of a record (a full line without its newline)."""
    if type(record) is UnknownEvent:
        body = {"kind": record.kind, **record.fields, "seq": record.seq, "ts": record.ts, "h": record.h}
        return _encoder.encode(body)
    out = _encoder.encode(record)
    # A decoded record has the right types; only non-finite floats need care.
    return _encode_exact(record) if out.find(b"null") >= 0 else out


def _decode_unknown(line: bytes, seq_hint: int | None) -> UnknownEvent:
    """The slow path for a line the typed decoder refused: an unknown kind, or say why not."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SchemaError(f"not valid UTF-8 (byte {e.start})", seq=seq_hint) from None
    try:
        obj = _generic_decoder.decode(line)
    except msgspec.DecodeError as e:
        raise SchemaError(f"not a JSON event line: {e}", seq=seq_hint) from None
    if not isinstance(obj, dict):
        raise SchemaError(f"not a JSON object but a {type(obj).__name__}", seq=seq_hint)
    kind = obj.get("kind")
    seq = obj.get("seq")
    seq = seq if type(seq) is int else seq_hint
    if isinstance(kind, str) and kind in _by_kind:
        # A known kind that failed typed decoding: report msgspec's reason.
        try:
            _decoders()[0].decode(line)
        except msgspec.ValidationError as e:
            raise SchemaError(f"{kind}: {e}", seq=seq) from None
    keys = list(obj)
    if len(keys) < 4 or keys[0] != "kind" or keys[-3:] != ["seq", "ts", "h"]:
        raise SchemaError("not an event line: it must start with kind and end with seq, ts, h", seq=seq)
    ts, h = obj["ts"], obj["h"]
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise SchemaError(f"bad kind {kind!r}", seq=seq)
    if type(obj["seq"]) is not int or type(ts) is not int or type(h) is not str:
        raise SchemaError("seq and ts must be integers and h a string", seq=seq)
    fields = {k: v for k, v in obj.items() if k not in _RESERVED}
    return UnknownEvent(kind=kind, seq=obj["seq"], ts=ts, h=h, fields=fields)


def decode_line(line: bytes, *, seq_hint: int | None = None) -> Any:
    """Decode one line (without its newline) into a record, strictly.

    Returns a record (an instance of the event's class with ``seq``, ``ts``,
    ``h``) or an :class:`UnknownEvent` for a kind this version does not know.
    Raises :class:`SchemaError` for a line that is not a valid event and
    :class:`NonCanonicalRecord` for one that is, but not in canonical form.
    """
    if too_deep(line):
        raise SchemaError(f"nested deeper than {MAX_DEPTH} levels", seq=seq_hint)
    dec = _decoders()[0]
    try:
        rec = dec.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError):
        rec = _decode_unknown(line, seq_hint)
    if encode_record(rec) != line:
        seq = rec.seq if isinstance(rec.seq, int) else seq_hint
        raise NonCanonicalRecord(
            f"line is not in canonical form ({_first_difference(line, encode_record(rec))})", seq=seq
        )
    return rec


def _first_difference(got: bytes, canon: bytes) -> str:
    n = next((i for i, (a, b) in enumerate(zip(got, canon)) if a != b), min(len(got), len(canon)))
    return f"first difference at byte {n}: {got[max(0, n - 12):n + 12]!r} vs canonical {canon[max(0, n - 12):n + 12]!r}"


def decode_unchecked_block(block: bytes, lines: int | None = None) -> list[Any] | None:
    """Decode a block of complete known-kind lines, each ending with a newline, *without* checking canonical
    form; ``None`` if it cannot. ``lines``: how many lines the block has, when the caller has counted them.

    Only for readers whose lines are checked elsewhere (``reader.fold_events``
    checks them in another process at the same time; replay reads what verify checked).
    """
    try:
        records = _decoders()[0].decode_lines(block)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    return records if len(records) == (block.count(b"\n") if lines is None else lines) else None


def decode_batch(lines: list[bytes], *, aligned: bool = False) -> list[Any] | None:
    """Decode many lines at once; ``None`` unless every line is a known kind in canonical form.

    The fast path of verification: one decode and one re-encode for the whole
    batch, compared byte for byte. A ``None`` means "check these lines one by
    one", which then finds and names the bad one.
    """
    if not lines:
        return []
    joined = b"[" + b",".join(lines) + b"]"
    try:
        records = _decoders()[1].decode(joined)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    # The nesting cap: a batch of kinds whose fields are all scalars nests one level per line (the decode above
    # held every field to its type). Otherwise no line can nest deeper than the openers the batch holds beyond
    # one per line: only when that bound passes the cap are the lines measured, one by one, by decode_line.
    if not _flat.issuperset(map(type, records)) and \
            joined.count(b"[") + joined.count(b"{") - len(lines) > MAX_DEPTH:
        return None
    # Every record re-encodes to a line that starts with {"kind":", so the
    # separator below occurs exactly between lines unless some line holds more
    # than one object (or a nested object shaped like an event): then the
    # line-by-line path decides. With the count right, line i == encoding i.
    if len(records) != len(lines) or (not aligned and joined.count(_BOUNDARY) != len(lines) - 1):
        return None
    if _encoder.encode(records) != joined:
        return None
    return records


def decode_block(block: bytes) -> list[Any] | None:
    """:func:`decode_batch` for a block of complete lines, each ending with a newline: the records, or ``None``
    unless every line is one record of a known kind in canonical form.

    One decode of the block as JSON lines and one re-encode of the records, compared byte for byte: the encoding
    of a record never holds a raw newline, so with the bytes equal, line i is exactly the encoding of record i.
    """
    if not block:
        return []
    try:
        records = _decoders()[0].decode_lines(block)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    if _encoder.encode_lines(records) != block:
        return None
    # The nesting cap, bounded as in decode_batch: beyond one opener per line, no line nests deeper than the
    # openers the block holds.
    if not _flat.issuperset(map(type, records)) and \
            block.count(b"[") + block.count(b"{") - len(records) + 1 > MAX_DEPTH:
        return None
    return records


# The registry, loaded with the codec: every kind trainledger defines is known before anything is decoded.
from trainledger.journal import kinds as _kinds  # noqa: E402, F401  isort: skip
