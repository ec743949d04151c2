"""Silent data corruption under real torchrun (4 ranks, gloo, CPU), with a bit-flip injector
(tests/helpers/sdc_worker.py): every single-bit flip in a replicated parameter or an optimizer state, and a swap of
two elements, named to its rank, step and tensor at the first fingerprint after it; none on the healthy steps
around them; replay recomputes every verdict from the ranks' signed fingerprints; a doctored fingerprint is named;
and the verdict survives a SIGKILL right after detection, sealed and verifiable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torchrun_tools import kind, torchrun

from trainledger.audit import replay_run_dir
from trainledger.cli import main
from trainledger.journal import keygen, load_public_key, read_events

WORKER = Path(__file__).resolve().parents[2] / "helpers" / "sdc_worker.py"
TENSORS = {"module.0.weight": 16 * 32, "module.0.bias": 32, "module.2.weight": 32}


def _job(tmp_path, name, priv, steps, every, plan, mode="record", check=None):
    run = tmp_path / name
    proc = torchrun(WORKER, [str(run), str(priv), str(steps), str(every), json.dumps(plan), mode,
                             *([str(check)] if check else [])], nproc=4, name=name, cwd=tmp_path)
    return run, proc


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return keygen(tmp_path_factory.mktemp("keys") / "k")


def test_every_flip_and_swap_is_named_to_its_rank_step_and_tensor(tmp_path, keys, rng, capsys):
    priv, pub = keys
    plan, step = [], 5
    for what in ("param", "param", "param", "optim", "optim", "permute"):
        tensor = rng.choice(list(TENSORS))
        plan.append({"step": step, "rank": rng.randrange(4), "what": what, "tensor": tensor,
                     "index": rng.randrange(TENSORS[tensor] - 1), "bit": rng.randrange(32)})
        step += rng.randrange(3, 12)
    run, proc = _job(tmp_path, "flips", priv, step + 10, 1, plan)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = [(i["step"], i["rank"], ("optim:" + i["tensor"] + ":exp_avg") if i["what"] == "optim"
             else "param:" + i["tensor"]) for i in plan]
    # live: rank 0's verdicts; and every one of them, recomputed by replay from the four ranks' fingerprints
    recorded = [e for e in read_events(run / "rank-00000.jsonl") if kind(e) == "state_diverged"]
    assert [(e.step, e.rank, e.tensor) for e in recorded] == want
    assert all(e.replicas == 4 and e.ranks == [e.rank] and e.majority is not None for e in recorded)
    rec = replay_run_dir(run, keys=[load_public_key(pub)])
    assert rec.ok, rec.differences
    assert [(d["step"], d["rank"], d["tensor"]) for d in rec.divergences] == want  # none on the healthy steps
    fps = [e for e in read_events(run / "rank-00002.jsonl") if kind(e) == "state_fingerprinted"]
    assert [e.step for e in fps] == list(range(step + 10))  # every step fingerprinted, on every rank
    assert sum(e.digests is not None for e in fps) == len(plan)  # the digests only where the roots disagreed
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("STATE DIVERGED") == len(plan) and f"rank {plan[0]['rank']} of 4 replicas" in out
    assert main(["query", "--pubkey", str(pub), "--format", "csv", str(run),
                 "SELECT (SELECT count(DISTINCT rank) FROM fingerprints), (SELECT count(*) FROM divergences), "
                 "(SELECT list(tensor ORDER BY step) FROM divergences)"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith(f"4,{len(plan)},") and want[0][2] in row
    # the report's page: the divergences in their table and marked on the per-rank step-time panel
    assert main(["report", "--pubkey", str(pub), str(run), "--out", str(tmp_path / "page.html")]) == 0
    page = (tmp_path / "page.html").read_text()
    assert f"{len(plan)} divergence(s)" in page and "Silent data corruption" in page and want[-1][2] in page


def test_a_doctored_fingerprint_is_named(tmp_path, keys, capsys):
    priv, pub = keys
    run, proc = _job(tmp_path, "healthy", priv, 12, 4, [])
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = run / "rank-00001.jsonl"
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, ln in enumerate(lines) if b'"state_fingerprinted"' in ln)
    root = json.loads(lines[at])["root"]
    lines[at] = lines[at].replace(root.encode(), ("0" * 64).encode())
    path.write_bytes(b"\n".join(lines))
    assert main(["verify", "--pubkey", str(pub), str(run)]) == 1
    out = capsys.readouterr().out
    assert "rank 1" in out or "rank-00001" in out


def test_the_verdict_survives_a_sigkill_right_after_detection(tmp_path, keys, capsys):
    """Fingerprints every 5 steps; rank 3's first-layer weight gets a flipped mantissa bit after step 12 (an
    exponent bit would send every replica to the same NaN through the averaged gradient, where no two differ): the verdict is
    sealed at step 15 before StateDivergence is raised, then every rank dies by SIGKILL. The folder verifies (open,
    not closed) and replay names rank 3, step 15, the tensor."""
    priv, pub = keys
    plan = [{"step": 12, "rank": 3, "what": "param", "tensor": "module.0.weight", "index": 100, "bit": 10}]
    run, proc = _job(tmp_path, "killed", priv, 40, 5, plan, mode="raise")
    assert proc.returncode != 0
    recorded = [e for e in read_events(run / "rank-00000.jsonl") if kind(e) == "state_diverged"]
    assert [(e.step, e.rank, e.tensor) for e in recorded] == [(15, 3, "param:module.0.weight")]
    assert main(["verify", "--pubkey", str(pub), str(run)]) == 0
    rec = replay_run_dir(run, keys=[load_public_key(pub)])
    assert [(d["step"], d["rank"], d["tensor"]) for d in rec.divergences] == [(15, 3, "param:module.0.weight")]
    assert rec.ok, rec.differences


def test_a_gradient_computed_wrong_once_is_caught_by_the_replay_check_before_the_optimizer_step(tmp_path, keys):
    """Replay checks every 5 steps: on rank 1, step 10's first backward pass flips a bit of one gradient (a unit
    that computed wrong once). The replay of that pass computes it right: rank 1's replay_checked at step 10 names
    the gradient, every other check agrees; with "raise", every rank stops before its optimizer step and the record
    is sealed on disk."""
    priv, pub = keys
    plan = [{"step": 10, "rank": 1, "what": "grad", "tensor": "module.2.weight", "index": 7, "bit": 12}]
    run, proc = _job(tmp_path, "grad", priv, 16, 100, plan, check=5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(4):
        checks = [(e.step, e.ok, e.tensor) for e in read_events(run / f"rank-0000{r}.jsonl")
                  if kind(e) == "replay_checked"]
        assert checks == [(0, True, None), (5, True, None), (10, r != 1, "module.2.weight" if r == 1 else None),
                          (15, True, None)], (r, checks)
    run, proc = _job(tmp_path, "grad-raise", priv, 16, 100, plan, mode="raise", check=5)
    assert proc.returncode != 0
    bad = [e for e in read_events(run / "rank-00001.jsonl") if kind(e) == "replay_checked" and not e.ok]
    assert [(e.step, e.tensor) for e in bad] == [(10, "module.2.weight")]
    for r in range(4):  # no rank recorded step 10 (each was killed before its optimizer step)
        assert all(e.step < 10 for e in read_events(run / f"rank-0000{r}.jsonl") if kind(e) == "step_observed")
    assert main(["verify", "--pubkey", str(pub), str(run)]) == 0
    from trainledger.journal import verify

    assert verify(run / "rank-00001.jsonl", keys=[load_public_key(pub)]).last_sealed_seq >= bad[0].seq


def test_a_divergence_rewinds_to_the_last_checkpoint_every_rank_agreed_on_and_the_restart_goes_on(tmp_path, keys):
    """on_divergence="rewind" on 2 ranks, fingerprints every 2 steps, a checkpoint every 4 (after steps 3, 7, ...):
    rank 1's weight gets a flipped bit after step 9, the verdict comes at step 10, every rank records rewind_decided
    naming its checkpoint of step 7 (whose fingerprints agreed) and exits; torchrun's restart resumes both ranks
    from it, the fault does not come back, and the run ends with the replicas agreeing. The folder verifies closed
    and replay recomputes the verdict and the rewind's budget."""
    import os

    priv, pub = keys
    plan = [{"step": 9, "rank": 1, "what": "param", "tensor": "module.0.weight", "index": 5, "bit": 20}]
    run = tmp_path / "rewind"
    os.environ["SDC_CKPT_EVERY"] = "4"
    try:
        proc = torchrun(WORKER, [str(run), str(priv), "16", "2", json.dumps(plan), "rewind", "0"], nproc=2,
                        name="rewind", cwd=tmp_path, restarts=1)
    finally:
        del os.environ["SDC_CKPT_EVERY"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("REWOUND 7") == 2, proc.stdout
    zero = list(read_events(run / "rank-00000.jsonl"))
    assert [(e.step, e.ranks) for e in zero if kind(e) == "state_diverged"] == [(10, [0, 1])]
    for r in (0, 1):
        evs = list(read_events(run / f"rank-0000{r}.jsonl"))
        (decided,) = [e for e in evs if kind(e) == "rewind_decided"]
        assert (decided.spike_step, decided.anomaly, decided.from_step, decided.skip_batches) == \
            (10, "state_diverged", 7, 0)
        assert [e.from_step for e in evs if kind(e) == "run_resumed"] == [7]
        steps = [e.step for e in evs if kind(e) == "step_observed"]
        assert steps == list(range(11)) + list(range(8, 16)), steps
    last = {r: [e.root for e in read_events(run / f"rank-0000{r}.jsonl") if kind(e) == "state_fingerprinted"][-1]
            for r in (0, 1)}
    assert last[0] == last[1]
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    rec = replay_run_dir(run, keys=[load_public_key(pub)])
    assert [d["step"] for d in rec.divergences] == [10] and rec.ok, rec.differences


def test_sharded_state_is_held_to_the_ranks_that_hold_the_same_shards(tmp_path, keys):
    """FSDP2 on a (replicate 2, shard 2) mesh, 4 ranks: each rank fingerprints its own shards and states its replica
    set (ranks 0 and 2 hold one half, 1 and 3 the other). A bit flipped in rank 3's shard after step 5 is named at
    step 5 within its set (two replicas: both ranks) and nowhere else; the halves, which differ by design, are
    never compared; replay recomputes it."""
    import os

    priv, pub = keys
    plan = [{"step": 5, "rank": 3, "what": "param", "tensor": "0.weight", "index": 3, "bit": 7}]
    run = tmp_path / "hsdp"
    os.environ["SDC_MESH"] = "hsdp"
    try:
        proc = torchrun(WORKER, [str(run), str(priv), "8", "1", json.dumps(plan), "record"], nproc=4,
                        name="hsdp", cwd=tmp_path)
    finally:
        del os.environ["SDC_MESH"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    fps = {r: [e for e in read_events(run / f"rank-0000{r}.jsonl") if kind(e) == "state_fingerprinted"]
           for r in range(4)}
    assert {r: {tuple(e.replicas) for e in fps[r]} for r in range(4)} == \
        {0: {(0, 2)}, 1: {(1, 3)}, 2: {(0, 2)}, 3: {(1, 3)}}
    assert all(a.root == b.root for a, b in zip(fps[0], fps[2])) and fps[0][0].root != fps[1][0].root
    zero = list(read_events(run / "rank-00000.jsonl"))
    assert [(e.step, e.ranks, e.replicas, e.tensor) for e in zero if kind(e) == "state_diverged"] == \
        [(5, [1, 3], 2, "param:0.weight")]
    rec = replay_run_dir(run, keys=[load_public_key(pub)])
    assert [(d["step"], d["ranks"]) for d in rec.divergences] == [(5, [1, 3])] and rec.ok, rec.differences
