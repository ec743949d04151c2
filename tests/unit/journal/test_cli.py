"""The trainledger command: every subcommand, exit codes, bad input, help, README."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainledger.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ["keygen", "verify", "head", "show", "demo", "ladder", "replay", "query", "report", "serve", "watch", "manifest", "preflight", "approve", "import", "export", "fit",
            "tree-head", "prove", "verify-proof", "consistency", "witness", "release", "verify-model", "pubkey", "compute",
            "log", "timestamp", "bom", "verify-bom"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_line_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def demo(tmp_path, capsys):
    code, out, _ = run(capsys, "demo", tmp_path / "run", "--steps", 300)
    assert code == 0 and "OK" in out and "tail      closed" in out
    return tmp_path / "run" / "journal.jsonl", tmp_path / "run" / "trainledger.pub"


def test_demo_writes_verifies_and_summarises(demo, capsys):
    path, pub = demo
    code, out, _ = run(capsys, "verify", path, "--pubkey", pub, "--require-closed", "--json")
    d = json.loads(out)
    assert code == 0 and d["ok"] and d["tail"] == "closed" and d["kinds"]["step_observed"] == 300
    for key in ("ok", "events", "run_id", "key_id", "tail", "last_sealed_seq", "unsealed_events", "first_bad_seq", "error"):
        assert key in d


def test_verify_human_output_names_first_bad_seq(demo, capsys):
    path, pub = demo
    data = bytearray(path.read_bytes())
    data[data.index(b'"step":100,') + 8] ^= 1  # step 100 -> 101
    path.write_bytes(bytes(data))
    code, out, _ = run(capsys, "verify", path, "--pubkey", pub)
    assert code == 1
    line = one_line_error(out)
    assert line.startswith("FAIL") and "seq " in line and "chain broken" in line


def test_verify_json_on_failure(demo, capsys):
    path, pub = demo
    path.write_bytes(path.read_bytes()[:-300])
    code, out, _ = run(capsys, "verify", path, "--pubkey", pub, "--require-closed", "--json")
    d = json.loads(out)
    assert code == 1 and d["ok"] is False and d["error"] and d["tail"] == "torn"


def test_verify_refuses_without_a_pinned_key(demo, capsys):
    path, _ = demo
    code, _, err = run(capsys, "verify", path)
    assert code == 2 and "--pubkey" in one_line_error(err)
    code, out, _ = run(capsys, "verify", path, "--trust-embedded")
    assert code == 0 and "authenticity NOT established" in out


def test_verify_with_trusted_keys_env(demo, capsys, monkeypatch, tmp_path):
    path, pub = demo
    listing = tmp_path / "allowed_keys"
    listing.write_text(pub.read_text())
    monkeypatch.setenv("TRAINLEDGER_TRUSTED_KEYS", str(listing))
    code, out, _ = run(capsys, "verify", path)
    assert code == 0 and "(pinned)" in out


def test_head_and_expect_head(demo, capsys):
    path, pub = demo
    code, out, _ = run(capsys, "head", path, "--pubkey", pub)
    head = out.strip()
    assert code == 0 and ":" in head
    code, _, _ = run(capsys, "verify", path, "--pubkey", pub, "--expect-head", head)
    assert code == 0
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-5]))
    code, out, _ = run(capsys, "verify", path, "--pubkey", pub, "--expect-head", head)
    assert code == 1 and "truncated" in out


def test_bad_expect_head_is_usage_error(demo, capsys):
    path, pub = demo
    code, _, err = run(capsys, "verify", path, "--pubkey", pub, "--expect-head", "12:xyz")
    assert code == 2 and "SEQ:HASH" in one_line_error(err)


def test_show_summarises(demo, capsys):
    path, _ = demo
    code, out, _ = run(capsys, "show", path)
    assert code == 0 and "step_observed" in out and "signatures not checked" in out and "tail      closed" in out
    code, out, _ = run(capsys, "show", path, "--json")
    assert json.loads(out)["kinds"]["step_observed"] == 300


def test_keygen_command(tmp_path, capsys):
    code, out, _ = run(capsys, "keygen", tmp_path / "k")
    assert code == 0 and (tmp_path / "k" / "trainledger.key").exists()
    code, _, err = run(capsys, "keygen", tmp_path / "k")
    assert code == 2 and "already exists" in one_line_error(err)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("content,code,needle", [
    (b"", 1, "empty file"),
    (bytes(range(256)) * 64, 1, "not"),
    (b"\xff\xfe\xfa garbage \x80\n", 1, "UTF-8"),
    (b'{"kind":"run_opened"}\n', 1, "run_opened"),
    (b"[1,2,3]\n", 1, "not"),
])
def test_bad_journal_files(tmp_path, capsys, content, code, needle, keypair):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    got, out, err = run(capsys, "verify", p, "--pubkey", keypair[2])
    assert got == code
    assert needle in one_line_error(out + err)


def test_fifty_megabyte_single_line(tmp_path, capsys, keypair):
    p = tmp_path / "huge.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"kind":"run_opened","x":"')
        f.write(b"a" * (50 * 1024 * 1024))
        f.write(b'"}\n')
    code, out, err = run(capsys, "verify", p, "--pubkey", keypair[2])
    assert code == 1 and "longer than" in one_line_error(out + err)


def test_directory_given_as_journal(tmp_path, capsys, keypair):
    code, _, err = run(capsys, "verify", tmp_path, "--pubkey", keypair[2])
    assert code == 2 and "a folder, but no journal in it" in one_line_error(err)


def test_missing_journal(tmp_path, capsys, keypair):
    code, _, err = run(capsys, "verify", tmp_path / "nope.jsonl", "--pubkey", keypair[2])
    assert code == 2 and "no such file" in one_line_error(err)


def test_public_key_given_as_private_key(tmp_path, capsys, keypair):
    code, _, err = run(capsys, "demo", tmp_path / "r", "--key", keypair[2])
    assert code == 2 and "this is a public key" in one_line_error(err)


def test_private_key_given_as_public_key(demo, capsys, keypair):
    path, _ = demo
    code, _, err = run(capsys, "verify", path, "--pubkey", keypair[1])
    assert code == 2 and "this is a private key" in one_line_error(err)


def test_unreadable_key_file(demo, capsys, tmp_path):
    path, _ = demo
    code, _, err = run(capsys, "verify", path, "--pubkey", tmp_path / "missing.pub")
    assert code == 2 and "not found" in one_line_error(err)


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["verify"])
    assert ei.value.code == 2
    assert main([]) == 2


def test_real_process_exit_codes(demo, tmp_path):
    path, pub = demo
    exe = [sys.executable, "-m", "trainledger"]
    ok = subprocess.run(exe + ["verify", str(path), "--pubkey", str(pub)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0
    bad = tmp_path / "garbage.jsonl"
    bad.write_bytes(os.urandom(4096))
    r = subprocess.run(exe + ["verify", str(bad), "--pubkey", str(pub)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr
    r = subprocess.run(exe + ["verify", str(tmp_path), "--pubkey", str(pub)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"reading {bad}" in r.stderr    # the folder's one journal, named
    (tmp_path / "empty").mkdir()
    r = subprocess.run(exe + ["verify", str(tmp_path / "empty"), "--pubkey", str(pub)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr


# ---------------------------------------------------------------- help and README


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_is_in_the_readme(command, capsys):
    with pytest.raises(SystemExit) as ei:
        main([command, "--help"])
    assert ei.value.code == 0
    assert len(capsys.readouterr().out) > 100
    assert f"trainledger {command}" in (ROOT / "README.md").read_text()


def test_parser_lists_exactly_the_documented_commands():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    names = [n for n, p in sub.choices.items() if p.prog.split()[-1] == n]  # an old name is an alias, not a command
    assert sorted(names) == sorted(COMMANDS)
    assert sub.choices["checkpoint"] is sub.choices["tree-head"]  # the old name still runs it (with a warning)


def test_verify_proof_given_a_journal_is_a_usage_error_that_says_what_to_run(demo, capsys):
    path, pub = demo
    code, _, err = run(capsys, "verify-proof", path, "--pubkey", pub)
    assert code == 2 and "a journal, not a proof bundle; make one with 'trainledger prove" in one_line_error(err)
