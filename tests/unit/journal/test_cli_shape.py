"""The CLI's shape: every argument explained, --json where a script wants a result (and JSON when the
command fails too), --no-progress wherever a bar can show, one convention for the folder a command creates."""

from __future__ import annotations

import argparse
import json

import pytest

from trainledger.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) of every command and sub-command, nested ones included ('witness cosign')."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                full = f"{prefix} {name}".strip()
                yield full, sp
                yield from _commands(sp, full)


COMMANDS = dict(_commands(build_parser()))

#: what a script would want a result of, as one JSON object
JSON_COMMANDS = ["keygen", "verify", "head", "show", "tree-head", "prove", "verify-proof", "consistency",
                 "witness vkey", "witness cosign", "replay", "report", "demo", "ladder", "fit", "preflight", "approve",
                 "manifest validate", "manifest id", "manifest init", "import tensorboard", "import megatron",
                 "export tensorboard", "export parquet"]

#: every command that can draw a progress bar while it reads
PROGRESS_COMMANDS = ["verify", "head", "show", "tree-head", "prove", "consistency", "replay", "report", "serve",
                     "export parquet"]


def _options(sp: argparse.ArgumentParser) -> set[str]:
    return {o for a in sp._actions for o in a.option_strings}


def test_every_argument_of_every_command_has_help():
    missing = [f"{name}: {'/'.join(a.option_strings) or a.dest}" for name, sp in COMMANDS.items()
               for a in sp._actions if a.dest != "help" and not a.help]
    assert missing == []


@pytest.mark.parametrize("command", JSON_COMMANDS)
def test_json_where_a_script_wants_a_result(command):
    assert "--json" in _options(COMMANDS[command])


@pytest.mark.parametrize("command", PROGRESS_COMMANDS)
def test_no_progress_wherever_a_bar_can_show(command):
    assert "--no-progress" in _options(COMMANDS[command])


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_json_prints_json_when_the_journal_fails(tmp_path, capsys, signer, pubkey):
    from trainledger.journal import Journal, StepObserved

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        for s in range(5):
            j.append(StepObserved(step=s, loss=1.0))
    raw = p.read_bytes()
    p.write_bytes(raw.replace(b'"step":3', b'"step":4', 1))
    pub = tmp_path / "k.pub"
    pub.write_text(pubkey.line() + "\n")
    code, out, _ = _run(capsys, "replay", p, "--pubkey", pub, "--json")
    d = json.loads(out)
    assert code == 1 and d["ok"] is False and d["path"] == str(p) and d["error"]
    code, out, _ = _run(capsys, "report", p, "--pubkey", pub, "--json", "-o", tmp_path / "r.html")
    assert code == 1 and json.loads(out)["ok"] is False and not (tmp_path / "r.html").exists()


def test_a_usage_error_under_json_is_json_on_stdout_and_one_line_on_stderr(tmp_path, capsys):
    code, out, err = _run(capsys, "replay", tmp_path / "none.jsonl", "--json")
    d = json.loads(out)
    assert code == 2 and d == {**d, "ok": False, "command": "replay", "exit_code": 2} and "none.jsonl" in d["error"]
    assert len(err.strip().splitlines()) == 1 and err.startswith("trainledger replay: error:")


def test_keygen_and_demo_json(tmp_path, capsys):
    code, out, _ = _run(capsys, "keygen", tmp_path / "keys", "--json")
    k = json.loads(out)
    assert code == 0 and k["key_id"] and k["public_key_line"] in (tmp_path / "keys" / "trainledger.pub").read_text()
    code, out, _ = _run(capsys, "demo", tmp_path / "run", "--steps", 50, "--key", k["private_key"], "--json")
    d = json.loads(out)
    assert code == 0 and d["ok"] and d["verify"]["events"] > 50 and d["journal"].endswith("journal.jsonl")


def test_demo_takes_its_folder_as_the_argument_and_the_old_option_with_a_warning(tmp_path, capsys):
    code, out, err = _run(capsys, "demo", "--out", tmp_path / "old", "--steps", 20)
    assert code == 0 and (tmp_path / "old" / "journal.jsonl").exists()
    assert "--out is deprecated; give the run folder as the argument" in err
    code, _, err = _run(capsys, "demo", tmp_path / "a", "--out", tmp_path / "b")
    assert code == 2 and "two run folders" in err


def test_proof_commands_json(tmp_path, capsys, signer, pubkey):
    from trainledger.journal import Journal, StepObserved

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        for s in range(30):
            j.append(StepObserved(step=s, loss=1.0))
    pub = tmp_path / "k.pub"
    pub.write_text(pubkey.line() + "\n")
    code, out, _ = _run(capsys, "prove", p, "--seq", 3, "-o", tmp_path / "b.json", "--pubkey", pub, "--json")
    d = json.loads(out)
    assert code == 0 and d["seqs"] == [3] and d["tree_size"] > 30 and (tmp_path / "b.json").exists()
    code, out, _ = _run(capsys, "consistency", p, "--from", 5, "--pubkey", pub, "--json")
    d = json.loads(out)
    assert code == 0 and d["from_size"] == 5 and d["bundle"]["consistency"]["from_size"] == 5


def test_an_s3_url_with_no_server_names_the_endpoint_it_could_not_reach(capsys, monkeypatch):
    pytest.importorskip("pyarrow")
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():   # no credential lookup leaves this machine
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    url = "s3://bucket/run?endpoint_override=127.0.0.1:9&scheme=http"   # port 9 (discard): nothing listens
    code, _, err = _run(capsys, "verify", url, "--trust-embedded")
    assert code == 2 and "could not reach the S3 endpoint 127.0.0.1:9" in err and "AWS_ENDPOINT_URL" in err
    assert len(err.strip().splitlines()) == 1


def test_setup_installs_the_main_job_by_default_and_the_tests_with_a_flag():
    """The README's first command installs what `trainledger ladder` imports (torch, the report, the fit) and the
    dashboard it ends by pointing at; the second, the dev extra too; a misspelt flag is refused, not taken for the default."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "tools" / "setup.sh"
    text = script.read_text()
    assert 'EXTRAS="torch,report,scaling,serve"' in text
    assert '--dev) EXTRAS="dev,$EXTRAS"' in text and '--browser) EXTRAS="dev,$EXTRAS"' in text
    r = subprocess.run(["bash", str(script), "--brwoser"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown option --brwoser" in r.stderr


def test_replay_and_the_report_tell_their_progress(tmp_path, signer, pubkey):
    """What their progress bar draws on a terminal: the bytes verified, up to the whole journal."""
    from trainledger.audit import replay
    from trainledger.journal import Journal, StepObserved
    from trainledger.report import write_report

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        for s in range(200):
            j.append(StepObserved(step=s, loss=1.0 + s * 1e-3))
    for call in (lambda cb: replay(p, keys=[pubkey], progress=cb),
                 lambda cb: write_report(p, tmp_path / "r.html", keys=[pubkey], progress=cb)):
        seen: list[tuple[int, int]] = []
        assert call(lambda done, total: seen.append((done, total))).ok
        assert seen and seen[-1] == (p.stat().st_size, p.stat().st_size)


def test_every_json_result_says_ok(tmp_path, capsys, signer, pubkey):
    """A script reads one key to know whether the command did what it asked: "ok", on success and on failure."""
    from trainledger.journal import Journal, StepObserved

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        for s in range(30):
            j.append(StepObserved(step=s, loss=1.0))
    pub = tmp_path / "k.pub"
    pub.write_text(pubkey.line() + "\n")
    for argv in (["verify", p], ["head", p], ["tree-head", p], ["replay", p], ["show", p]):
        code, out, _ = _run(capsys, *argv, "--json", *(["--pubkey", pub] if argv[0] != "show" else []))
        assert code == 0 and json.loads(out)["ok"] is True, argv
