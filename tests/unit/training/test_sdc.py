"""Silent data corruption: the state fingerprint (every flipped bit and every swap seen, on the tensor's own
device, exact against an int64 reference) and the fold that holds replicas to each other (the rank and tensor
named, by majority or both, once a round; rank 0's records held to the fingerprints)."""

from __future__ import annotations

import random

import pytest
import torch

from trainledger.journal.kinds import RankJoined
from trainledger.training.distributed.sdc import audit_state, diverged
from trainledger.training.health.state_fingerprint import (CHUNK, fingerprint_root, pair_hex, state_fingerprint,
                                                           tensor_sums)
from trainledger.training.kinds import StateDiverged, StateFingerprinted

MASK = (1 << 64) - 1
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool, torch.complex64]


def _reference(t: torch.Tensor) -> list[int]:
    """s0 and s1 of the module docstring, the slow way: every integer widened, every position weighted."""
    from trainledger.training.health.state_fingerprint import _as_ints

    x = _as_ints(t).to(torch.int64)
    pos = torch.arange(1, x.numel() + 1, dtype=torch.int64)
    return [int(x.sum()) & MASK, int((x * pos).sum()) & MASK]


def _sums(t: torch.Tensor) -> list[int]:
    return [v & MASK for v in tensor_sums(t).tolist()]


def _tensor(dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 50
    return x.to(dtype) if dtype != torch.complex64 else torch.complex(x, -x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 2047, 2049, CHUNK - 3, CHUNK + 2049])
def test_the_sums_are_exact_against_the_int64_reference(dtype, n):
    t = _tensor(dtype, n, n)
    assert _sums(t) == _reference(t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_single_bit_flip_changes_the_fingerprint(dtype, rng):
    """Every bit position of a random element of each dtype, one at a time, in a tensor that spans chunks."""
    t = _tensor(dtype, CHUNK + 5000, 1)
    base = _sums(t)
    flat = t.view(-1) if dtype != torch.complex64 else torch.view_as_real(t).reshape(-1)
    ints = flat.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[flat.element_size()])
    bits = flat.element_size() * 8
    for i in [0, CHUNK - 1, CHUNK, rng.randrange(ints.numel()), ints.numel() - 1]:
        for b in range(bits):
            one = torch.tensor(1, dtype=ints.dtype) << b if b < bits - 1 or ints.dtype == torch.uint8 else \
                torch.tensor(torch.iinfo(ints.dtype).min, dtype=ints.dtype)
            ints[i] ^= one
            assert _sums(t) != base, (i, b)
            ints[i] ^= one
    assert _sums(t) == base


def test_a_swap_or_a_permutation_changes_the_fingerprint_where_xor_would_not(rng):
    t = _tensor(torch.float32, 50_000, 2)
    base = _sums(t)
    for _ in range(200):
        i, j = rng.randrange(t.numel()), rng.randrange(t.numel())
        if t[i] == t[j]:
            continue
        t[i], t[j] = t[j].clone(), t[i].clone()
        assert _sums(t) != base, (i, j)
        t[i], t[j] = t[j].clone(), t[i].clone()
    perm = t[torch.randperm(t.numel(), generator=torch.Generator().manual_seed(3))]
    assert _sums(perm)[0] == base[0] and _sums(perm) != base  # the same multiset, another order


def test_a_states_fingerprint_names_every_tensor_and_equal_states_agree():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    fp = state_fingerprint(model, opt, grads=True)
    names = list(fp)
    assert names[:4] == ["param:0.weight", "param:0.bias", "param:1.weight", "param:1.bias"]
    assert "buffer:1.running_mean" in fp and "buffer:1.num_batches_tracked" in fp
    assert "grad:2.weight" in fp and "optim:2.weight:exp_avg_sq" in fp and "optim:0.bias:step" in fp
    import copy

    twin, twin_opt = copy.deepcopy(model), None
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    twin_opt.load_state_dict(opt.state_dict())
    for p, q in zip(model.parameters(), twin.parameters()):
        q.grad = p.grad.clone()
    same = state_fingerprint(twin, twin_opt, grads=True)
    assert fingerprint_root(same) == fingerprint_root(fp)
    with torch.no_grad():
        twin_opt.state[twin[2].weight]["exp_avg"].view(-1).view(torch.int32)[3] ^= 1 << 7
    other = state_fingerprint(twin, twin_opt, grads=True)
    assert fingerprint_root(other) != fingerprint_root(fp)
    assert [n for n in fp if fp[n] != other[n]] == ["optim:2.weight:exp_avg"]
    left = state_fingerprint(twin, twin_opt, exclude=["optim:2.weight:exp_avg"])
    assert "optim:2.weight:exp_avg" not in left and len(pair_hex(next(iter(left.values())))) == 32


# ---------------------------------------------------------------- the fold

def _fp(step: int, root: str, digests: dict[str, str] | None = None) -> StateFingerprinted:
    return StateFingerprinted(step=step, root=root, tensors=len(digests) if digests else 2, digests=digests)


R_OK, R_BAD, R_ODD = "a" * 64, "b" * 64, "c" * 64
D_OK = {"param:w": "1" * 32, "optim:w:exp_avg": "2" * 32}
D_BAD = {"param:w": "1" * 32, "optim:w:exp_avg": "3" * 32}


def test_three_or_more_replicas_name_the_odd_one_and_its_tensor_by_majority():
    named: set[int] = set()
    roots = {0: R_OK, 1: R_OK, 2: R_BAD, 3: R_OK}
    d = diverged(roots, {0: D_OK, 1: D_OK, 2: D_BAD, 3: D_OK}, named)
    assert d == {"rank": 2, "ranks": [2], "replicas": 4, "tensor": "optim:w:exp_avg", "majority": R_OK}
    assert diverged(roots, {}, named) is None  # named once: its state stays diverged from then on
    d = diverged({0: R_OK, 1: R_ODD, 2: R_BAD, 3: R_OK, 4: R_OK}, {}, named)  # a second rank leaves, later
    assert d == {"rank": 1, "ranks": [1], "replicas": 5, "tensor": None, "majority": R_OK}


def test_a_rank_is_named_again_once_the_replicas_agreed_in_between():
    """An episode ends when every replica agrees again (the state repaired, or rewound to a checkpoint the ranks
    agree on): the same rank corrupted later is a new divergence, named again."""
    named: set[int] = set()
    bad = {0: R_OK, 1: R_BAD, 2: R_OK}
    assert diverged(bad, {}, named)["ranks"] == [1]
    assert diverged(bad, {}, named) is None
    assert diverged({0: R_OK, 1: R_OK, 2: R_OK}, {}, named) is None and named == set()
    assert diverged(bad, {}, named)["ranks"] == [1]


def test_two_replicas_or_an_even_split_name_every_rank():
    assert diverged({0: R_OK, 1: R_BAD}, {0: D_OK, 1: D_BAD}, set()) == \
        {"rank": 0, "ranks": [0, 1], "replicas": 2, "tensor": "optim:w:exp_avg", "majority": None}
    assert diverged({0: R_OK, 1: R_OK, 2: R_BAD, 3: R_BAD}, {}, set())["ranks"] == [0, 1, 2, 3]
    assert diverged({0: R_OK, 1: R_OK}, {}, set()) is None


def _joined(rank: int, restart: int) -> RankJoined:
    return RankJoined(run="r", rank=rank, world_size=4, local_rank=rank, node="n", restart_count=restart)


def _runs(bad_from: int | None, *, record: bool = True, doctor: dict | None = None) -> dict[int, list]:
    """Four ranks fingerprinting steps 0, 10, ..., 90; rank 3's state corrupted from ``bad_from``; rank 0 records
    what the rule gives (``doctor``: fields of its record replaced)."""
    events: dict[int, list] = {r: [_joined(r, 0)] for r in range(4)}
    named: set[int] = set()
    for step in range(0, 100, 10):
        roots, digests = {}, {}
        for r in range(4):
            bad = r == 3 and bad_from is not None and step >= bad_from
            roots[r] = R_BAD if bad else R_OK
            digests[r] = (D_BAD if bad else D_OK) if bad_from is not None and step >= bad_from else None
            events[r].append(_fp(step, roots[r], digests[r]))
        d = diverged(roots, digests, named)
        if d is not None and record:
            events[0].append(StateDiverged(step=step, **{**d, **(doctor or {})}))
    return events


def test_replay_recomputes_the_first_step_rank_and_tensor_and_names_a_doctored_record():
    found, diffs = audit_state(_runs(40))
    assert [(d["step"], d["rank"], d["tensor"]) for d in found] == [(40, 3, "optim:w:exp_avg")] and diffs == []
    assert audit_state(_runs(None)) == ([], [])
    _, diffs = audit_state(_runs(40, doctor={"rank": 2, "ranks": [2]}))
    assert len(diffs) == 1 and "recorded" in diffs[0]["detail"] and diffs[0]["kind"] == "state_diverged"
    _, diffs = audit_state(_runs(40, record=False))  # rank 0 went on and never recorded it
    assert len(diffs) == 1 and "recorded no state_diverged" in diffs[0]["detail"]
    forged = _runs(None)
    forged[0].append(StateDiverged(step=90, rank=1, ranks=[1], replicas=4))
    _, diffs = audit_state(forged)
    assert len(diffs) == 1 and "do not give" in diffs[0]["detail"]


def test_a_restart_is_a_new_round_and_a_fingerprint_out_of_shape_is_refused():
    events = _runs(40)
    for r in range(4):  # torchrun restarted the group: a new round, whose replicas agree again
        events[r].append(_joined(r, 1))
        events[r].append(_fp(40, R_OK))
    found, diffs = audit_state(events)
    assert [(d["round"], d["step"]) for d in found] == [(0, 40)] and diffs == []
    with pytest.raises(ValueError, match="root"):
        StateFingerprinted(step=1, root="xyz", tensors=1)
    with pytest.raises(ValueError, match="digests"):
        StateFingerprinted(step=1, root=R_OK, tensors=3, digests=D_OK)
    with pytest.raises(ValueError, match="ranks"):
        StateDiverged(step=1, rank=2, ranks=[1], replicas=2)


def test_randomised_states_never_disagree_unless_a_bit_changed():
    """Replicas built from the same seed and updated with the same gradient agree, 50 steps of 2 optimizers."""
    r = random.Random(7)
    for opt_kind in (torch.optim.AdamW, torch.optim.SGD):
        states = []
        for _ in range(2):
            torch.manual_seed(11)
            m = torch.nn.Linear(32, 8)
            states.append((m, opt_kind(m.parameters(), lr=1e-2)))
        for step in range(50):
            x = torch.randn(4, 32, generator=torch.Generator().manual_seed(step))
            roots = []
            for m, o in states:
                o.zero_grad()
                m(x).square().mean().backward()
                o.step()
                roots.append(fingerprint_root(state_fingerprint(m, o)))
            assert roots[0] == roots[1], (opt_kind, step)
        m, o = states[1]
        with torch.no_grad():
            m.weight.view(-1).view(torch.int32)[r.randrange(256)] ^= 1 << r.randrange(32)
        assert fingerprint_root(state_fingerprint(*states[0])) != fingerprint_root(state_fingerprint(m, o))


def _bn_ranks(rank: int, tmp: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainledger.journal import Journal, load_signer
    from trainledger.training.distributed.state_watch import StateWatch

    dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 2), rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Journal.create(f"{tmp}/rank-{rank}.jsonl", signer=load_signer(f"{tmp}/keys/trainledger.key")) as j:
            watch = StateWatch(j, model, opt, every=1, on_divergence="record")
            torch.manual_seed(1 + rank)  # each rank its own batches: its own running statistics
            for step in range(6):
                opt.zero_grad()
                model(torch.randn(16, 4)).square().mean().backward()
                opt.step()
                watch.after_step(step)
            from trainledger.training.health.state_fingerprint import fingerprint_root, state_fingerprint

            whole = fingerprint_root(state_fingerprint(model, opt))  # the buffers in: the ranks differ
            roots = [None, None]
            dist.all_gather_object(roots, whole)
            if rank == 0:
                with open(f"{tmp}/result.json", "w") as f:
                    import json

                    json.dump({"divergences": watch.divergences, "excluded": watch.exclude,
                               "with_buffers_equal": roots[0] == roots[1]}, f)
    finally:
        dist.destroy_process_group()


def test_a_ddp_models_buffers_are_left_out_and_listed(tmp_path):
    """Under DDP each rank's BatchNorm updates its running statistics from its own batch in the forward pass (DDP
    broadcasts rank 0's at the next one), so after a step the replicas' buffers differ by design: the watch leaves
    every buffer out and records that it did ("buffer:*"); with them in, the two ranks' roots differ."""
    import json

    import torch.multiprocessing as mp

    from trainledger.journal import keygen, read_events

    keygen(tmp_path / "keys")
    mp.spawn(_bn_ranks, args=(str(tmp_path),), nprocs=2, join=True)
    res = json.loads((tmp_path / "result.json").read_text())
    assert res == {"divergences": [], "excluded": ["buffer:*"], "with_buffers_equal": False}
    fps = [e for e in read_events(tmp_path / "rank-1.jsonl") if type(e).__struct_config__.tag == "state_fingerprinted"]
    assert len(fps) == 6 and all(e.excluded == ["buffer:*"] and e.digests is None for e in fps)


# ---------------------------------------------------------------- replay checks

class _Glitch(torch.nn.Module):
    """Dropout and a unit that computes wrong once: on the call numbered ``at``, one output's bit flips."""

    def __init__(self, at: int | None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.calls, self.at = 0, at

    def forward(self, x):
        y = self.net(x)
        self.calls += 1
        if self.calls == self.at:
            y = y.clone()
            y.view(-1).view(torch.int32)[0] ^= 1 << 20
        return y


def test_a_replay_check_agrees_with_dropout_and_keeps_the_first_passs_gradients(tmp_path, signer):
    from trainledger.journal import Journal, read_events
    from trainledger.training.distributed.state_watch import ReplayCheck

    torch.manual_seed(0)
    model, twin = _Glitch(None), _Glitch(None)
    twin.load_state_dict(model.state_dict())
    with Journal.create(tmp_path / "j.jsonl", signer=signer) as j:
        check = ReplayCheck(j, model, every=4)
        for step in range(9):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            torch.manual_seed(100 + step)
            loss = check.backward(step, lambda: model(x).square().mean())
            torch.manual_seed(100 + step)
            twin(x).square().mean().backward()  # the same pass once: the same gradients
            for p, q in zip(model.parameters(), twin.parameters()):
                assert torch.equal(p.grad, q.grad), step
                p.grad = q.grad = None
            assert loss.requires_grad
    checks = [e for e in read_events(tmp_path / "j.jsonl") if type(e).__struct_config__.tag == "replay_checked"]
    assert [(e.step, e.ok) for e in checks] == [(0, True), (4, True), (8, True)]  # the first step, then every 4
    assert all(e.root == e.root_again and e.loss == e.loss_again and e.tensors == 4 for e in checks)


def test_a_unit_that_computes_wrong_once_is_caught_before_the_optimizer_step(tmp_path, signer):
    from trainledger.journal import Journal, read_events, verify
    from trainledger.training.distributed.state_watch import ReplayCheck, ReplayMismatch

    torch.manual_seed(0)
    model = _Glitch(at=6)  # the first pass of step 4 (calls 1, 2: step 0's two passes; 3-5: steps 1-3)
    with Journal.create(tmp_path / "j.jsonl", signer=signer) as j:
        check = ReplayCheck(j, model, every=4)
        with pytest.raises(ReplayMismatch, match="step 4") as e:
            for step in range(8):
                x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
                check.backward(step, lambda: model(x).square().mean())
                for p in model.parameters():
                    p.grad = None
        assert e.value.record["ok"] is False and e.value.record["tensor"] == "net.0.weight"  # the first in order
        j.suspend()  # as a crash leaves it: the check's line is sealed already
    (bad,) = [ev for ev in read_events(tmp_path / "j.jsonl") if type(ev).__struct_config__.tag == "replay_checked"
              and not ev.ok]
    assert bad.step == 4 and bad.loss != bad.loss_again and bad.root != bad.root_again
    assert verify(tmp_path / "j.jsonl", keys=[signer.public]).last_sealed_seq >= bad.seq


def test_replay_names_a_replay_check_whose_verdict_its_fields_do_not_give(tmp_path, signer):
    """A lone journal's replay holds each replay_checked to its own fields: a mismatch is a note, a verdict its
    fields do not give (ok with roots that differ) a difference."""
    from trainledger.audit import replay
    from trainledger.journal import Journal
    from trainledger.training.kinds import ReplayChecked

    ok = dict(loss="0" * 16, loss_again="0" * 16, root=R_OK, root_again=R_OK, tensors=3)
    with Journal.create(tmp_path / "j.jsonl", signer=signer) as j:
        j.append(ReplayChecked(step=0, ok=True, **ok))
        j.append(ReplayChecked(step=5, ok=False, tensor="w", **{**ok, "root_again": R_BAD}))
        j.append(ReplayChecked(step=10, ok=True, **{**ok, "root_again": R_BAD}))  # doctored: the roots differ
    rec = replay(tmp_path / "j.jsonl", keys=[signer.public])
    assert [(d["kind"], "step 10" in d["detail"]) for d in rec.differences] == [("replay_checked", True)]
    assert any("replay check of step 5 differed" in n and "in w" in n for n in rec.notes)


# ---------------------------------------------------------------- on_divergence="rewind" and the options


def _verdict(step):
    from trainledger.training.distributed.state_watch import StateDivergence

    def compare():
        raise StateDivergence(f"step {step}: diverged", {"step": step, "rank": 1, "ranks": [1], "replicas": 3,
                                                         "tensor": "param:0.weight"})
    return compare


def test_a_rewind_goes_to_the_last_agreed_checkpoint_within_its_budget_then_the_run_stops(tmp_path, signer, pubkey):
    """The Recorder's rewind (the verdict handed in as StateWatch raises it: one process cannot diverge): the first
    three verdicts within 1,000 steps rewind to the newest checkpoint whose fingerprints agreed (step 3; not the
    user's own record_checkpoint of step 5, which has no fingerprint), each a rewind_decided on record; the fourth is
    past the budget: run_stopped and the StateDivergence itself. A run with no agreed checkpoint stops at once.
    Replay finds the budget kept; an unknown on_divergence is refused before the journal is opened."""
    from trainledger.audit import replay
    from trainledger.journal import read_events
    from trainledger.journal.errors import UsageError
    from trainledger.training import Recorder
    from trainledger.training.distributed.state_watch import StateDivergence, StateRewound

    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "r", signer=signer, model=model, optimizer=opt, fingerprint_every=1,
                   on_divergence="rewind")
    for step in range(6):
        rec.step(step, 1.0)
        if step == 3:
            rec.checkpoint(step, data_state={"step": step})
    torch.save(model.state_dict(), tmp_path / "r" / "mine.pt")
    rec.record_checkpoint(tmp_path / "r" / "mine.pt", step=5)
    for step in (6, 7, 8):
        with pytest.raises(StateRewound, match="resumes every rank from the checkpoint of step 3") as e:
            rec._watched(_verdict(step))
        assert e.value.from_step == 3 and e.value.verdict["step"] == step
    with pytest.raises(StateDivergence) as e:
        rec._watched(_verdict(9))
    assert not isinstance(e.value, StateRewound)
    rec.close(status="stopped")
    evs = list(read_events(tmp_path / "r" / "journal.jsonl"))
    decided = [(e.spike_step, e.from_step, e.anomaly) for e in evs if type(e).__struct_config__.tag == "rewind_decided"]
    assert decided == [(6, 3, "state_diverged"), (7, 3, "state_diverged"), (8, 3, "state_diverged")]
    (stopped,) = [e for e in evs if type(e).__struct_config__.tag == "run_stopped"]
    assert stopped.rule == "max_rewinds=3 per 1000 steps" and "rank(s) 1 in param:0.weight" in stopped.reason
    assert replay(tmp_path / "r" / "journal.jsonl", keys=[pubkey]).ok

    bare = Recorder(tmp_path / "bare", signer=signer, model=model, optimizer=opt, fingerprint_every=1,
                    on_divergence="rewind")
    bare.step(0, 1.0)
    with pytest.raises(StateDivergence):
        bare._watched(_verdict(0))
    bare.close(status="stopped")
    assert [e.rule for e in read_events(tmp_path / "bare" / "journal.jsonl")
            if type(e).__struct_config__.tag == "run_stopped"] == ["no checkpoint whose fingerprints every rank agreed on"]
    with pytest.raises(UsageError, match="on_divergence must be 'raise', 'record' or 'rewind'"):
        Recorder(tmp_path / "never", signer=signer, model=model, optimizer=opt, on_divergence="restart")
    assert not (tmp_path / "never").exists()
    with pytest.raises(UsageError, match="'rewind' is the Recorder's"):
        from trainledger.training.distributed.state_watch import StateWatch

        StateWatch(None, model, opt, on_divergence="rewind")


def test_fingerprint_grads_adds_the_gradients_after_the_step(tmp_path, signer):
    """fingerprint_grads=True: each fingerprint holds the gradients as the optimizer step left them (grad:NAME)
    beside the parameters and the optimizer state, and says so (grads=True)."""
    from trainledger.journal import read_events
    from trainledger.training import Recorder

    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "g", signer=signer, model=model, optimizer=opt, fingerprint_every=2,
                   fingerprint_grads=True)
    for step in range(4):
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        rec.step(step, 1.0)
    rec.close()
    fps = [e for e in read_events(tmp_path / "g" / "journal.jsonl")
           if type(e).__struct_config__.tag == "state_fingerprinted"]
    assert [(e.step, e.grads, e.tensors) for e in fps] == [(0, True, 2 + 2 + 3 * 2), (2, True, 2 + 2 + 3 * 2)]


def test_sharded_ranks_are_held_only_to_the_ranks_that_state_the_same_shards():
    """The fold over stated replica sets: 4 ranks of HSDP ({0, 2} and {1, 3}), rank 2's shard corrupted from step
    20: named within its set (two replicas: both), the other set's different roots never compared with it; FSDP
    with no replicas (each rank alone): different roots every step and no verdict; a record naming ranks that hold
    different shards is one the fingerprints do not give."""
    hsdp = {r: [_joined(r, 0)] for r in range(4)}
    for step in range(0, 40, 10):
        for r in range(4):
            bad = r == 2 and step >= 20
            root = (R_BAD if bad else R_OK) if r % 2 == 0 else "cd" * 32
            hsdp[r].append(StateFingerprinted(step=step, root=root, tensors=2, replicas=[r % 2, r % 2 + 2],
                                              digests=(D_BAD if bad else D_OK) if step >= 20 and r % 2 == 0
                                              else None))
    found, diffs = audit_state(hsdp)
    assert [(d["step"], d["ranks"], d["replicas"], d["tensor"]) for d in found] == [(20, [0, 2], 2, "optim:w:exp_avg")]
    assert len(diffs) == 1 and "recorded no state_diverged" in diffs[0]["detail"]  # rank 0 recorded nothing here
    hsdp[0].insert(3, StateDiverged(step=20, **{k: found[0][k] for k in ("rank", "ranks", "replicas", "tensor",
                                                                          "majority")}))
    assert audit_state(hsdp)[1] == []
    fsdp = {r: [_joined(r, 0)] + [StateFingerprinted(step=s, root=f"{r}{s % 10}" * 32, tensors=2, replicas=[r])
                                  for s in range(5)] for r in range(4)}
    assert audit_state(fsdp) == ([], [])
    fsdp[0].append(StateDiverged(step=4, rank=0, ranks=[0, 1], replicas=2))
    _, diffs = audit_state(fsdp)
    assert len(diffs) == 1 and "do not give" in diffs[0]["detail"]


def test_a_rewind_for_a_state_divergence_rests_on_one_the_fingerprints_give():
    """replay holds every rank's rewind_decided (anomaly state_diverged) to a divergence the fingerprints give at its
    step: the one at step 40 stands; one at step 50, or one in a run whose replicas all agreed, is named."""
    from trainledger.training.kinds import RewindDecided

    def rewind(step):
        return RewindDecided(spike_step=step, anomaly="state_diverged", checkpoint="checkpoints/rank-00001/x.pt",
                             from_step=29, skip_batches=0, lr_scale=1.0, reason="state diverged")

    events = _runs(40)
    events[1].append(rewind(40))
    assert audit_state(events)[1] == []
    events[2].append(rewind(50))
    (d,) = audit_state(events)[1]
    assert d["kind"] == "rewind_decided" and "step 50" in d["detail"]
    healthy = _runs(None)
    healthy[0].append(rewind(40))
    assert [x["kind"] for x in audit_state(healthy)[1]] == ["rewind_decided"]
