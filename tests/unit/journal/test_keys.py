"""Keys: keygen, permissions, key ids, trusted-keys files."""

from __future__ import annotations

import os
import stat

import pytest

import base64
from pathlib import Path

from trainledger.journal import KeyFileError, Signer, UsageError, keygen, load_public_key, load_signer, trusted_keys
from trainledger.journal.keys import TRUSTED_KEYS_ENV, key_id_of, parse_public_key


def test_keygen_writes_0600_pem_and_one_line_public_key(tmp_path):
    priv, pub = keygen(tmp_path / "k")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    lines = pub.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainledger-ed25519 ")
    signer, pk = load_signer(priv), load_public_key(pub)
    assert signer.key_id == pk.key_id == key_id_of(pk.raw) and len(pk.key_id) == 16


def test_keygen_refuses_to_overwrite(tmp_path):
    keygen(tmp_path)
    before = (tmp_path / "trainledger.key").read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        keygen(tmp_path)
    assert (tmp_path / "trainledger.key").read_bytes() == before


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_private_key_readable_by_others_is_refused(tmp_path, mode):
    priv, _ = keygen(tmp_path)
    os.chmod(priv, mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signer(priv)


def test_public_key_given_as_private_key(tmp_path):
    _, pub = keygen(tmp_path)
    with pytest.raises(KeyFileError, match="this is a public key"):
        load_signer(pub)


def test_private_key_given_as_public_key(tmp_path):
    priv, _ = keygen(tmp_path)
    with pytest.raises(KeyFileError, match="this is a private key"):
        load_public_key(priv)


@pytest.mark.parametrize("text", ["", "ssh-ed25519 AAAA", "trainledger-ed25519 !!!", "trainledger-ed25519 AAAA"])
def test_malformed_public_keys(text):
    with pytest.raises(KeyFileError):
        parse_public_key(text)


def test_public_key_with_wrong_key_id_comment():
    s = Signer.generate()
    with pytest.raises(KeyFileError, match="does not match"):
        parse_public_key(f"trainledger-ed25519 {s.public.b64} {'0' * 16}")


def test_missing_and_directory_key_files(tmp_path):
    with pytest.raises(KeyFileError, match="not found"):
        load_signer(tmp_path / "nope.key")
    with pytest.raises(KeyFileError, match="is a directory"):
        load_public_key(tmp_path)


def test_trusted_keys_file_from_environment(tmp_path):
    _, pub1 = keygen(tmp_path / "a")
    _, pub2 = keygen(tmp_path / "b")
    listing = tmp_path / "allowed"
    listing.write_text(f"# team keys\n{pub2.read_text()}\n\n")
    keys = trusted_keys([], env={TRUSTED_KEYS_ENV: str(listing)})
    assert [k.key_id for k in keys] == [load_public_key(pub2).key_id] and keys[0].source == f"{listing}:2"


def test_pubkey_replaces_the_environment_list_instead_of_widening_it(tmp_path):
    _, pub1 = keygen(tmp_path / "a")
    _, pub2 = keygen(tmp_path / "b")
    listing = tmp_path / "allowed"
    listing.write_text(pub2.read_text())
    keys = trusted_keys([str(pub1)], env={TRUSTED_KEYS_ENV: str(listing)})
    assert [k.key_id for k in keys] == [load_public_key(pub1).key_id]


@pytest.mark.parametrize("point", [
    "0100000000000000000000000000000000000000000000000000000000000000",  # the identity (order 1)
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # order 2
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8, sign bit set
])
def test_small_order_public_keys_are_refused_at_load(tmp_path, point):
    raw = bytes.fromhex(point)
    f = tmp_path / "weak.pub"
    f.write_text(f"trainledger-ed25519 {base64.b64encode(raw).decode()}\n")
    with pytest.raises(KeyFileError, match="small-order"):
        load_public_key(f)


def test_pub_file_with_two_keys_is_refused(tmp_path):
    _, pub1 = keygen(tmp_path / "a")
    _, pub2 = keygen(tmp_path / "b")
    both = tmp_path / "both.pub"
    both.write_text(pub1.read_text() + pub2.read_text())
    with pytest.raises(KeyFileError, match="holds 2 keys"):
        load_public_key(both)


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_fifo_or_device_as_a_key_file_is_refused_at_once(tmp_path, special):
    import os

    path = tmp_path / "k.fifo" if special == "fifo" else Path(special)
    if special == "fifo":
        os.mkfifo(path)
    for load in (load_public_key, load_signer):
        with pytest.raises(KeyFileError, match="not a regular file"):
            load(path)


def test_keygen_where_no_folder_can_be_made_is_an_io_error(tmp_path, capsys):
    """A folder that cannot be created (its parent is a file: the same error path as a read-only disk, and
    one that root cannot bypass) is one line and exit 2."""
    from trainledger.cli import main

    (tmp_path / "file").write_text("x")
    assert main(["keygen", str(tmp_path / "file" / "keys")]) == 2
    assert "cannot create" in capsys.readouterr().err


def test_a_runs_new_key_is_kept_outside_its_folder_and_a_key_inside_is_refused(tmp_path, monkeypatch):
    from trainledger.journal.errors import UsageError
    from trainledger.journal.keys import key_home, run_key

    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "home"))
    priv, pub = run_key(tmp_path / "runs" / "a b")
    assert priv.parent == key_home() == tmp_path / "home" and priv.name.startswith("a-b-")
    assert pub == tmp_path / "runs" / "a b" / "trainledger.pub" and not list((tmp_path / "runs").rglob("*.key"))
    assert load_signer(priv).public.line() == pub.read_text().strip()
    inside, _ = keygen(tmp_path / "runs" / "c")
    with pytest.raises(UsageError, match="inside the run folder"):
        run_key(tmp_path / "runs" / "c", inside)


def test_reading_a_run_folder_that_holds_a_private_key_warns(tmp_path, capsys):
    from trainledger.cli import main
    from trainledger.journal import Journal

    priv, pub = keygen(tmp_path)
    with Journal.create(tmp_path / "journal.jsonl", signer=load_signer(priv)):
        pass
    assert main(["verify", "--pubkey", str(pub), str(tmp_path / "journal.jsonl")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {priv} is a private signing key inside the run folder" in err
    priv.rename(tmp_path.parent / f"{tmp_path.name}-moved.key")
    assert main(["verify", "--pubkey", str(pub), str(tmp_path / "journal.jsonl")]) == 0
    assert "warning" not in capsys.readouterr().err
