"""Validly signed but hostile journals: every command answers with one line and exit 1 or 2, never a traceback.

Here the writer holds the key (a buggy or malicious writer, or a stolen key): signatures all check out, and the
content is what no honest trainledger would write. Some lines are also unsigned forgeries (no key needed).
"""

from __future__ import annotations

import json
import math

import pytest
from journal_tools import dump, read_lines, rechain, write_lines
from test_cli import run

from trainledger.journal import Journal, codec


@pytest.fixture
def hostile(tmp_path, keypair):
    """``make(events, run_id=None)``: a closed journal holding ``events`` (dicts), every seal signed by the key."""
    signer, _, pub = keypair

    def make(events: list[dict], *, name: str = "j.jsonl", opened: dict | None = None) -> tuple:
        p = tmp_path / name
        Journal.create(p, signer=signer, background=False).suspend()
        lines = read_lines(p)
        if opened is not None:
            lines[0] = dump({**json.loads(lines[0]), **opened})
        body = [dump({"kind": e["kind"], **_in_field_order(e), "seq": 0, "ts": 1, "h": "0" * 64}) for e in events]
        seal = dump({"kind": "seal", "sealed_seq": 0, "sealed_hash": "", "key_id": signer.key_id, "sig": "",
                     "seq": 0, "ts": 1, "h": "0" * 64})
        write_lines(p, rechain(lines + body + [seal], resign=signer))
        return p, pub

    return make


def _in_field_order(e: dict) -> dict:
    """The fields in the order the event class declares them (the canonical order); unknown kinds as given."""
    cls = codec.known_kinds().get(e["kind"])
    order = list(cls.__struct_fields__) if cls is not None else [k for k in e if k != "kind"]
    return {k: codec.nonfinite_to_str(e[k]) for k in order if k in e}  # NaN is written "NaN", as the writer does


def _steps(losses, **kw):
    return [{"kind": "step_observed", "step": i, "loss": loss, **kw} for i, loss in enumerate(losses)]


COMMANDS = [("verify",), ("show",), ("replay",), ("query", "SELECT * FROM mfu"), ("report",)]


def _all_commands(capsys, p, pub, tmp_path):
    """Run every reading command; return {command: (exit code, its output)}."""
    out = {}
    for cmd in COMMANDS:
        if cmd[0] == "show":
            argv = ["show", p]
        elif cmd[0] == "report":
            argv = ["report", p, "--pubkey", pub, "-o", tmp_path / "r.html"]
        else:
            argv = [cmd[0], "--pubkey", pub, p, *cmd[1:]]
        code, o, e = run(capsys, *argv)  # run() asserts there is no traceback
        out[cmd[0]] = (code, (o + e).strip())
    return out


@pytest.mark.parametrize("config", [
    pytest.param({"devices": 0, "n_params": 10, "n_layer": 1, "n_head": 1, "head_dim": 2, "seq_len": 4,
                  "peak_flops_per_sec": 1e9}, id="zero-devices"),
    pytest.param({"peak_flops_per_sec": 0.0}, id="zero-peak"),
    pytest.param({"loss_window": 0}, id="window-zero"),
    pytest.param({"loss_min_periods": -3}, id="min-periods-negative"),
    pytest.param({"grad_norm_z_thresh": -1.0}, id="threshold-negative"),
    pytest.param({"loss_window": 10**12}, id="window-huge"),
    pytest.param({"n_params": 10}, id="flop-shape-missing"),
])
def test_out_of_range_detector_settings_fail_verification(hostile, capsys, tmp_path, config):
    p, pub = hostile([{"kind": "run_configured", **config}] + _steps([1.0] * 5, step_time_s=0.1, tokens=8))
    results = _all_commands(capsys, p, pub, tmp_path)
    for cmd, (code, text) in results.items():
        assert code == 1 and "run_configured" in text, (cmd, text)


@pytest.mark.parametrize("verdict", [
    pytest.param({"measured": {}, "bars": {}}, id="bars-missing"),
    pytest.param({"measured": {"final_loss": "low", "forgetting_gap": [1]},
                  "bars": {"max_final_loss": {"a": 1}, "max_forgetting_gap": None}}, id="mistyped"),
    pytest.param({"measured": {"final_loss": 0.1, "forgetting_gap": 0.0},
                  "bars": {"max_final_loss": 1.0, "max_forgetting_gap": 1.0, "max_anomalies": 0}},
                 id="measurement-missing"),
])
def test_gate_verdict_with_missing_or_mistyped_bars(hostile, capsys, tmp_path, verdict):
    p, pub = hostile([{"kind": "gate_verdict", "rung": "r", "passed": True, "reason": "x", "artifacts": {},
                       **verdict}])
    code, out, _ = run(capsys, "replay", "--pubkey", pub, p)
    assert code == 1 and "DIFFERENCE" in out and "cannot be recomputed" in out
    code, _, _ = run(capsys, "report", p, "--pubkey", pub, "-o", tmp_path / "r.html")
    assert code == 1


@pytest.mark.parametrize("losses", [
    pytest.param([math.nan] * 40, id="every-loss-nan"),
    pytest.param([1e308, -1e308] * 30, id="plus-minus-1e308"),
    pytest.param([math.inf, -math.inf, 1.0] * 20, id="infinities"),
])
def test_extreme_losses_give_a_page_not_a_traceback(hostile, capsys, tmp_path, losses):
    pytest.importorskip("matplotlib")
    p, pub = hostile(_steps(losses, grad_norm=1.0))
    results = _all_commands(capsys, p, pub, tmp_path)
    assert results["verify"][0] == 0 and results["query"][0] == 0, results
    assert results["replay"][0] in (0, 1) and results["report"][0] in (0, 1)  # unrecorded anomalies: differences
    assert (tmp_path / "r.html").exists()


def test_mathtext_names_are_drawn_as_text(hostile, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    p, pub = hostile([{"kind": "rung_started", "rung": "$\\frac{$", "real_target": "$x^$", "spec": {}}]
                     + _steps([1.0, 0.9, 0.8]))
    code, _, _ = run(capsys, "report", p, "--pubkey", pub, "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert code in (0, 1) and "data:image/png" in page and "could not be drawn" not in page


def test_deep_nesting_is_a_schema_error_without_a_key(tmp_path, capsys, keypair):
    """Nesting far past the cap: verify, show and query fail on one line (show needs no key at all)."""
    signer, _, pub = keypair
    p = tmp_path / "deep.jsonl"
    Journal.create(p, signer=signer, background=False).suspend()
    deep = b'{"kind":"note","x":' + b"[" * 900 + b"]" * 900 + b',"seq":0,"ts":1,"h":"' + b"0" * 64 + b'"}'
    write_lines(p, rechain(read_lines(p) + [deep]))
    for argv in (["show", p], ["verify", "--pubkey", pub, p], ["query", "--pubkey", pub, p, "SELECT 1"]):
        code, out, err = run(capsys, *argv)
        assert code == 1 and "nested" in out + err, argv


def test_moderate_nesting_within_the_cap_verifies(hostile, capsys, tmp_path):
    p, pub = hostile([{"kind": "note", "x": [[[[["ok"]]]]]}])
    code, _, _ = run(capsys, "verify", "--pubkey", pub, p)
    assert code == 0


def test_long_run_id_is_a_schema_error(tmp_path, keypair, capsys):
    signer, _, pub = keypair
    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer, background=False).suspend()
    lines = read_lines(p)
    write_lines(p, rechain([dump({**json.loads(lines[0]), "run_id": "r" * 70000})] + lines[1:]))
    code, out, _ = run(capsys, "verify", "--pubkey", pub, p)
    assert code == 1 and "run id" in out


def test_crafted_key_id_cannot_turn_fail_into_ok(hostile, capsys):
    p, pub = hostile([], opened={"key_id": "\r\x1b[2KOK  \x1b[1A"})
    code, out, _ = run(capsys, "verify", "--pubkey", pub, p)
    assert code == 1 and out.startswith("FAIL") and "\x1b" not in out and "\r" not in out


def test_escapes_in_names_reach_the_terminal_escaped(hostile, capsys, tmp_path):
    evil = "ok\x1b[2K\r\nOK  fake line (pinned)\u202e"
    p, pub = hostile([{"kind": "gate_verdict", "rung": evil, "passed": False, "reason": evil, "artifacts": {},
                       "measured": {"final_loss": 9.0, "forgetting_gap": 0.0},
                       "bars": {"max_final_loss": 1.0, "max_forgetting_gap": 1.0}},
                      {"kind": "checkpoint_saved", "step": 1, "path": evil, "bytes": 1, "sha256": "0" * 64,
                       "contents": [], "duration_s": 0.1}])
    for argv in (["replay", "--pubkey", pub, p], ["query", "--pubkey", pub, p, "SELECT rung, reason FROM verdicts"],
                 ["query", "--pubkey", pub, p, "SELECT path FROM checkpoints"]):
        _, out, err = run(capsys, *argv)
        assert not any(c in out + err for c in "\x1b\r\u202e"), argv
        assert "\\x1b" in out, argv
        assert not any(line.startswith("OK  fake") for line in out.splitlines())


def test_csv_cells_cannot_be_formulas(hostile, capsys):
    p, pub = hostile([{"kind": "run_stopped", "rule": "=HYPERLINK(\"http://x\")", "reason": "+1", "value": -3.0}])
    code, out, _ = run(capsys, "query", "--pubkey", pub, "--format", "csv", p,
                       "SELECT rule, reason, -3.5 AS n FROM stops")
    rows = out.splitlines()
    assert code == 0 and rows[1].startswith("\"'=HYPERLINK") and ",'+1," in rows[1] and rows[1].endswith("-3.5")


def test_known_kind_with_a_bad_schema_fails_verify_in_a_fresh_process(hostile):
    """verify checks trainledger's own kinds whatever was imported (the CLI alone, here)."""
    import subprocess
    import sys

    p, pub = hostile([{"kind": "gate_verdict", "rung": 7, "passed": "yes", "reason": "x", "measured": {},
                       "bars": {}, "artifacts": {}}])
    proc = subprocess.run([sys.executable, "-c", "import sys; from trainledger.cli.journal import main; sys.exit(main(sys.argv[1:]))",
                           "verify", "--pubkey", str(pub), str(p)], capture_output=True, text=True)
    assert proc.returncode == 1 and "gate_verdict" in proc.stdout and "Traceback" not in proc.stderr


def test_replay_is_linear_in_unsupported_anomalies(tmp_path, signer, pubkey):
    """4,000 recorded anomalies that no step supports: 65 s when the comparison was quadratic."""
    import time

    from conftest import step

    from trainledger.training.health.detectors import AnomalyDetected
    from trainledger.audit import replay

    p = tmp_path / "a.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(200):
            j.append(step(i))
        for i in range(4000):
            j.append(AnomalyDetected(step=i, anomaly="loss_spike", value=float(i), z_score=99.0, threshold=8.0))
    t0 = time.process_time()  # CPU: a busy machine does not make it fail
    rec = replay(p, keys=[pubkey])
    assert len(rec.differences) == 4000 and time.process_time() - t0 < 5


def test_hostile_distributed_fields_fail_verification_of_the_folder(hostile, capsys, tmp_path):
    """A signed rank journal whose anchors or straggler scores name no rank: one line, exit 1, no traceback."""
    p, pub = hostile([{"kind": "ranks_anchored", "heads": {"x": "1:" + "ab" * 32}}], name="rank-00000.jsonl")
    code, out, _ = run(capsys, "verify", "--pubkey", pub, tmp_path)
    assert code == 1 and "ranks_anchored" in out
    p.unlink()
    hostile([{"kind": "straggler_scores", "window_start": 0, "window_end": 9, "medians": {"zero": 0.1},
              "scores": {"zero": 1.0}, "threshold": 0.75}], name="rank-00000.jsonl")
    code, out, _ = run(capsys, "replay", "--pubkey", pub, tmp_path)
    assert code == 1 and "straggler_scores" in out
