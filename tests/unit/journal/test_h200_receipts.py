"""Receipts written on a real GPU (an NVIDIA H200 lent to this project, tools/device_check.py, docs/bench/device.txt)
verify, replay and query here, without torch or a GPU: the real NVML readings are in them, replay recomputes the
MFU the device measured, and the sharded checkpoints' digests are on record."""

from __future__ import annotations

import json
from pathlib import Path

from trainledger.cli import main
from trainledger.journal import load_public_key, read_events, verify
from trainledger.audit import replay

H200 = Path(__file__).resolve().parents[2] / "assets" / "h200"
KEY = H200 / "device.pub"


def _kind(e) -> str:
    return type(e).__struct_config__.tag


def test_the_h200_journals_verify_with_their_pinned_key():
    for name in ("model.jsonl", "ckpt-rank-00000.jsonl"):
        rep = verify(H200 / name, keys=[load_public_key(KEY)], require_closed=True)
        assert rep.ok and rep.tail == "closed"


def test_replay_recomputes_the_mfu_the_device_measured():
    """The loop measured MFU with its own clock (device.json); replay folds the journaled step times to the same
    figure, within the spread of the step times (the loop's median against replay's mean)."""
    measured = json.loads((H200 / "device.json").read_text())["model-sdpa"]
    rec = replay(H200 / "model.jsonl", keys=[load_public_key(KEY)])
    assert rec.ok and not rec.differences
    mfu = rec.to_dict()["health"]["mfu"]
    assert mfu["count"] == 199 and not mfu["implausible"]
    assert abs(mfu["mean"] - measured["mfu"]) < 0.02 and mfu["min"] <= measured["mfu"] <= mfu["max"]


def test_the_telemetry_is_what_nvml_reported_and_nothing_invented():
    samples = [e for e in read_events(H200 / "model.jsonl") if _kind(e) == "device_sampled"]
    assert len(samples) >= 5 and {s.device for s in samples} == {0}
    for s in samples:  # every field the H200 reports is there, none made up
        assert 20 <= s.temp_c <= 95 and 20 <= s.temp_hbm_c <= 95
        assert 50 <= s.power_w <= 1000 and 300 <= s.sm_clock_mhz <= 2100
        assert set(s.ecc) == {"corrected_volatile", "uncorrected_volatile", "corrected_aggregate",
                              "uncorrected_aggregate"}
    assert max(s.power_w for s in samples) > 300  # under the training load, not idle
    assert not [e for e in read_events(H200 / "model.jsonl") if _kind(e) in ("telemetry_unavailable",
                                                                             "device_changed")]


def test_the_sharded_checkpoints_digests_are_on_record(capsys):
    shards = [e for e in read_events(H200 / "ckpt-rank-00000.jsonl") if _kind(e) == "shards_saved"]
    assert len(shards) == 16 and all(s.metadata_sha256 and s.save_id for s in shards)
    assert all(f["bytes"] > 500 * 2 ** 20 and len(f["sha256"]) == 64 for s in shards for f in s.files)
    assert main(["query", "--pubkey", str(KEY), str(H200 / "model.jsonl"),
                 "select count(*) as n, max(power_w) > 300 as loaded from telemetry"]) == 0
    assert "True" in capsys.readouterr().out.splitlines()[1]


def test_one_changed_byte_in_the_h200_journal_is_caught(tmp_path, capsys):
    data = bytearray((H200 / "model.jsonl").read_bytes())
    i = data.index(b'"power_w":') + len(b'"power_w":')
    data[i] = ord("9") if data[i] != ord("9") else ord("8")
    (tmp_path / "model.jsonl").write_bytes(bytes(data))
    assert main(["verify", "--pubkey", str(KEY), str(tmp_path / "model.jsonl")]) == 1
    assert "FAIL" in capsys.readouterr().out
