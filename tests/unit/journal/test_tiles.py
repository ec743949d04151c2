"""The organisation log's tlog-tiles folder (journal/proofs/tiles.py): the spec's own example of which tiles a tree
of 70,000 leaves has, built by appends of every awkward size; every tile's hashes and every entry checked against
the signed root on reading, a flipped byte refused with its path; paths as the spec spells them."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainledger.journal.errors import UsageError
from trainledger.journal.merkle import inclusion_proof, leaf_hash, root, verify_inclusion
from trainledger.journal.note import NoteError, parse_checkpoint
from trainledger.journal.proofs.tiles import TileError, TileLog, tile_path

ORIGIN = "example.com/ml-runs"


def test_tile_paths_as_the_spec_spells_them():
    assert tile_path(0, 1234067) == "tile/0/x001/x234/067"
    assert tile_path(1, 5, 17) == "tile/1/005.p/17"
    assert tile_path("entries", 1000) == "tile/entries/x001/000"
    with pytest.raises(ValueError):
        tile_path(0, 0, 256)


def test_a_tree_of_70000_has_the_tiles_the_spec_lists(tmp_path):
    """tlog-tiles: 273 full level-0 tiles, a partial of 112, one full level-1 tile, a partial of 17, and a partial
    level-2 tile of 1; built by appends of 1, 254, 1, 300 and 69,444 entries (each crossing or filling a tile), and
    read back whole: every entry, every hash, the root."""
    key = Ed25519PrivateKey.generate()
    pub = key.public_key().public_bytes_raw()
    log = TileLog.init(tmp_path / "log", ORIGIN, key)
    entries = [f"entry {i}".encode() for i in range(70000)]
    at = 0
    for n in (1, 254, 1, 300, 69444):
        before, note, where = log.add(entries[at:at + n], key)
        assert where == list(range(at, at + n))
        assert before.checkpoint.size == at
        at += n
        assert parse_checkpoint(note[:note.rfind("\n\n") + 1]).size == at
    tiles = tmp_path / "log" / "tile"
    full0 = [p for p in (tiles / "0").rglob("*") if p.is_file() and not any(x.endswith(".p") for x in p.parts)]
    assert len(full0) == 273
    assert (tiles / "0" / "273.p" / "112").is_file() and (tiles / "1" / "000").is_file()
    assert (tiles / "1" / "001.p" / "17").is_file() and (tiles / "2" / "000.p" / "1").is_file()
    assert not (tiles / "2" / "000").exists() and not (tiles / "3").exists()
    assert (tiles / "entries" / "273.p" / "112").is_file()
    view = log.read(pub)
    assert view.entries == entries and view.checkpoint.size == 70000
    assert view.checkpoint.root == root([leaf_hash(e) for e in entries])
    # the partial tiles of every earlier checkpoint stay (a reader of an older, cosigned checkpoint needs them)
    assert (tiles / "0" / "000.p" / "1").is_file() and (tiles / "0" / "002.p" / "44").is_file()
    # an inclusion proof from the tiles checks against the signed root
    i = 65432
    verify_inclusion(leaf_hash(entries[i]), i, 70000, inclusion_proof(view.leaves, i), view.checkpoint.root)


def test_a_changed_byte_anywhere_is_refused_with_its_path(tmp_path):
    key = Ed25519PrivateKey.generate()
    pub = key.public_key().public_bytes_raw()
    log = TileLog.init(tmp_path / "log", ORIGIN, key)
    log.add([b"run a", b"run b", b"run c"], key)
    for rel, err, says in [("tile/0/000.p/3", TileError, "do not hash to the checkpoint's root"),
                           ("tile/entries/000.p/3", TileError, "entry 1 does not hash to its leaf"),
                           ("checkpoint", NoteError, "does not verify|not a signed note|checkpoint")]:
        p = tmp_path / "log" / rel
        good = p.read_bytes()
        bad = bytearray(good)
        bad[{"tile/0/000.p/3": 40, "tile/entries/000.p/3": 10}.get(rel, 25)] ^= 1
        p.write_bytes(bytes(bad))
        with pytest.raises(err, match=says):
            log.read(pub)
        p.write_bytes(good)
    assert log.read(pub).entries == [b"run a", b"run b", b"run c"]
    # found by mutating a log folder at random: a checkpoint with a byte that is not UTF-8 was a traceback
    for rel, read in (("checkpoint", lambda: log.read(pub)), (".cosigned-checkpoint", log.last_cosigned)):
        p = tmp_path / "log" / rel
        good = p.read_bytes() if p.exists() else None
        p.write_bytes(b"example.com/log\n3\n\xff\n")
        with pytest.raises(NoteError, match=f"{rel}: not a signed note \\(not UTF-8 text at byte 18\\)"):
            read()
        p.unlink() if good is None else p.write_bytes(good)
    with pytest.raises(NoteError):  # another key
        log.read(Ed25519PrivateKey.generate().public_key().public_bytes_raw())
    with pytest.raises(UsageError, match="already a log"):
        TileLog.init(tmp_path / "log", ORIGIN, key)
    with pytest.raises(UsageError, match="at most 65535"):
        log.add([b"x" * 70000], key)
    assert log.read(pub).checkpoint.size == 3  # nothing half-written


def test_tiles_match_an_independent_computation_of_each_level(tmp_path):
    """Each level-1 hash is the root of the 256 level-0 hashes below it (MTH of 256 leaves), as the spec defines:
    recomputed here with the journal's plain root over the entries themselves."""
    key = Ed25519PrivateKey.generate()
    log = TileLog.init(tmp_path / "log", ORIGIN, key)
    entries = [bytes([i % 251, i // 251]) for i in range(600)]
    log.add(entries, key)
    level1 = (tmp_path / "log" / "tile" / "1" / "000.p" / "2").read_bytes()
    assert level1 == root([leaf_hash(e) for e in entries[:256]]) + root([leaf_hash(e) for e in entries[256:512]])
    assert Path(tmp_path / "log" / "tile" / "0" / "002.p" / "88").stat().st_size == 88 * 32
