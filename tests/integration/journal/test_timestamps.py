"""RFC 3161 trusted time on seals, against a real authority: Debian's ``openssl ts -reply`` behind a loopback
endpoint (tests/helpers/openssl_tsa.py). Tokens over a journal's seals from 'trainledger timestamp' and from the
Recorder's tsa= (in the journal after each checkpoint, beside it for the final seal), each checked by
'openssl ts -verify' and by 'verify --tsa-cert' (printed as "existed by" beside the trainer's clock); a token over
another note, one signed by an authority not pinned, one whose certificate is not for time stamping, and a
tampered token refused; an authority that cannot be reached leaves the run training and says which seal lacks one."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "helpers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conftest import step  # noqa: E402
from openssl_tsa import OpensslTsa  # noqa: E402

from trainledger.cli import main  # noqa: E402
from trainledger.journal import Journal, keygen, load_signer, read_events  # noqa: E402
from trainledger.journal.proofs.timestamp import (TimestampError, check_journal, load_certificates,  # noqa: E402
                                                  seal_notes, sidecar, verify_token)


@pytest.fixture(scope="module")
def tsa(tmp_path_factory):
    t = OpensslTsa(tmp_path_factory.mktemp("tsa"))
    url = t.start()
    yield t, url
    t.stop()


def _journal(path: Path, signer, n: int = 12) -> Path:
    j = Journal.create(path, signer=signer, seal_every=5, background=False)
    for i in range(n):
        j.append(step(i))
    j.close()
    return path


def test_a_written_journal_is_timestamped_and_every_token_checked_both_ways(tmp_path, tsa, capsys):
    t, url = tsa
    priv, pub = keygen(tmp_path / "keys")
    jp = _journal(tmp_path / "run" / "journal.jsonl", load_signer(priv))
    assert main(["timestamp", str(jp), "--tsa", url, "--pubkey", str(pub), "--all-seals"]) == 0
    out = capsys.readouterr().out
    notes = seal_notes(jp, [load_signer(priv).public])
    assert out.count("EXISTED BY") == len(notes) >= 3
    recs = [json.loads(x) for x in sidecar(jp).read_text().splitlines()]
    assert sorted(r["seal_seq"] for r in recs) == sorted(notes)
    for r in recs:  # the stock verifier agrees on every token
        proc = t.openssl_verify(notes[r["seal_seq"]][0].encode(), base64.b64decode(r["token"]))
        assert "Verification: OK" in proc.stdout, proc.stderr
    # verify --tsa-cert: every token checked, printed beside the trainer's own clock
    assert main(["verify", str(jp), "--pubkey", str(pub), "--tsa-cert", str(t.dir / "ca.crt")]) == 0
    out = capsys.readouterr().out
    assert out.count("EXISTED BY") == len(notes) and "the trainer's clock:" in out
    # the authority named is the certificate whose key verified each token, not only the URL it was fetched from
    assert out.count(f"per {url}, signed by CN=trainledger test TSA (") == len(notes)
    # pinned to the TSA's own certificate instead of its CA: also holds
    assert main(["verify", str(jp), "--pubkey", str(pub), "--tsa-cert", str(t.dir / "tsa.crt")]) == 0
    capsys.readouterr()
    # show lists each token with the time it states, and says it did not check it (no authority pinned)
    assert main(["show", str(jp)]) == 0
    out = capsys.readouterr().out
    assert out.count("NOT checked here") == len(notes) and "EXISTED BY" not in out and url in out
    assert main(["show", str(jp), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["timestamps"]
    assert sorted(x["seal_seq"] for x in shown) == sorted(notes) and not any(x["checked"] for x in shown)
    assert {x["says"] for x in shown} == {r["time"] for r in recs}
    # a token moved onto another seal's line: over another note, refused (exit 1), and openssl agrees
    bad = [dict(r) for r in recs]
    bad[0]["seal_seq"], bad[1]["seal_seq"] = bad[1]["seal_seq"], bad[0]["seal_seq"]
    sidecar(jp).write_text("".join(json.dumps(r) + "\n" for r in bad))
    assert main(["verify", str(jp), "--pubkey", str(pub), "--tsa-cert", str(t.dir / "ca.crt")]) == 1
    assert "is over another note" in capsys.readouterr().out
    assert "Verification: OK" not in t.openssl_verify(notes[bad[0]["seal_seq"]][0].encode(),
                                                      base64.b64decode(bad[0]["token"])).stdout
    # a journal someone else wrote, stamped without a key pinned (the key it names: a token is over bytes), then
    # checked under the key pinned
    jp2 = _journal(tmp_path / "run2" / "journal.jsonl", load_signer(priv), 4)
    assert main(["timestamp", str(jp2), "--tsa", url]) == 0
    assert main(["verify", str(jp2), "--pubkey", str(pub), "--tsa-cert", str(t.dir / "ca.crt")]) == 0
    capsys.readouterr()
    # one digit of the time a token states changed (inside the signed TSTInfo): refused
    tok = bytearray(base64.b64decode(recs[0]["token"]))
    at = bytes(tok).index(b"\x18\x0f") + 2  # the GeneralizedTime: YYYYMMDDHHMMSSZ
    tok[at + 3] ^= 1
    with pytest.raises(TimestampError):
        verify_token(bytes(tok), notes[recs[0]["seal_seq"]][0], load_certificates((t.dir / "ca.crt").read_bytes()))


def test_an_authority_not_pinned_or_not_for_time_stamping_is_refused(tmp_path, tsa):
    t, url = tsa
    other = OpensslTsa(tmp_path / "other")
    no_eku = OpensslTsa(tmp_path / "noeku", eku=False)
    note = "trainledger/r\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n\u2014 x y\n"
    token = base64.b64decode(__import__("trainledger.journal.proofs.timestamp", fromlist=["x"]).stamp_record(
        url, 0, note)["token"])
    ours = load_certificates((t.dir / "ca.crt").read_bytes())
    assert verify_token(token, note, ours).digest
    with pytest.raises(TimestampError, match="neither the pinned authority nor issued by it"):
        verify_token(token, note, load_certificates((other.dir / "ca.crt").read_bytes()))
    u2 = no_eku.start()
    try:
        from trainledger.journal.proofs.timestamp import request

        try:
            tok2 = request(u2, note)
        except (TimestampError, OSError):
            return  # this openssl refuses to sign with a certificate not for time stamping: refused either way
        with pytest.raises(TimestampError, match="not one for time stamping"):
            verify_token(tok2, note, load_certificates((no_eku.dir / "ca.crt").read_bytes()))
    finally:
        no_eku.stop()


def test_the_recorder_stamps_each_checkpoint_and_the_final_seal_and_goes_on_without_an_authority(tmp_path, tsa):
    torch = pytest.importorskip("torch")
    from trainledger.journal.kinds import TimestampRecorded
    from trainledger.training import Recorder

    t, url = tsa
    priv, pub = keygen(tmp_path / "keys")

    def train(run, tsa_url):
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(run, key=priv, model=model, optimizer=opt, tsa=tsa_url)
        for s in range(6):
            rec.step(s, 1.0 / (s + 1))
            if s % 3 == 2:
                rec.checkpoint(s, data_state={"s": s})
        rec.close()
        return run / "journal.jsonl"

    # an event the user names: rec.timestamp() seals what is there and stamps that seal
    model = torch.nn.Linear(4, 1)
    rec = Recorder(tmp_path / "named", key=priv, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   tsa=url)
    rec.step(0, 1.0)
    rec.log({"crossed_1e25": 1.0})
    rec.timestamp()
    rec.close()
    named = [e for e in read_events(tmp_path / "named" / "journal.jsonl") if isinstance(e, TimestampRecorded)]
    logged = next(e for e in read_events(tmp_path / "named" / "journal.jsonl")
                  if type(e).__struct_config__.tag == "metrics_logged")
    assert named and named[0].token and named[0].seal_seq > logged.seq  # a seal after the event, stamped
    jp = train(tmp_path / "ok", url)
    inline = [e for e in read_events(jp) if isinstance(e, TimestampRecorded)]
    assert len(inline) >= 1 and all(e.token for e in inline)  # the first checkpoint's came in before the close
    side = [json.loads(x) for x in sidecar(jp).read_text().splitlines()]
    assert side[-1]["token"] and max(seal_notes(jp, [load_signer(priv).public])) == side[-1]["seal_seq"]
    checked = check_journal(jp, [load_signer(priv).public], load_certificates((t.dir / "ca.crt").read_bytes()))
    assert all(c.error is None for c in checked) and len(checked) == len(inline) + len(side)
    # no authority: training goes on, each seal that lacks a token says so
    jp2 = train(tmp_path / "down", "http://127.0.0.1:9/")
    lacking = [e for e in read_events(jp2) if isinstance(e, TimestampRecorded)]
    assert lacking and all(e.error and e.token is None for e in lacking)
    assert "error" in json.loads(sidecar(jp2).read_text().splitlines()[-1])
    assert main(["verify", str(jp2), "--pubkey", str(pub), "--tsa-cert", str(t.dir / "ca.crt")]) == 1


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on a toy run, and its use of a torch API
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
def test_the_callbacks_stamp_their_seals_and_add_the_run_to_the_team_log(tmp_path, tsa, capsys):
    """Lightning and the Hugging Face Trainer take tsa=, team_log= and team_log_key= as the Recorder does: a token
    after each recorded checkpoint (in the journal) and over the final seal (beside it), every one verifying; and at
    the end the run's checkpoint is an entry of the team log, which 'log prove' and 'verify --policy' then hold."""
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from trainledger.journal.kinds import TimestampRecorded
    from trainledger.training.integrations.lightning import TrainledgerCallback

    t, url = tsa
    priv, pub = keygen(tmp_path / "keys")
    log_priv, _ = keygen(tmp_path / "logkey")
    assert main(["log", "init", str(tmp_path / "log"), "--origin", "example.com/ml-runs", "--key", str(log_priv)]) == 0

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            xs = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True)), batch_size=8)

    run = tmp_path / "lit"
    cb = TrainledgerCallback(run, key=str(priv), tsa=url, team_log=tmp_path / "log", team_log_key=log_priv)
    L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
              enable_model_summary=False, callbacks=[cb, ModelCheckpoint(dirpath=run / "ckpts", every_n_train_steps=3,
                                                                         save_top_k=-1)]).fit(Tiny())
    jp = run / "journal.jsonl"
    inline = [e for e in read_events(jp) if isinstance(e, TimestampRecorded)]
    assert inline and all(e.token for e in inline)
    found = check_journal(jp, [load_signer(priv).public], load_certificates((t.dir / "ca.crt").read_bytes()))
    assert found and all(s.error is None for s in found) and len(found) == len(inline) + 1
    assert "entry 0 of the team log" in capsys.readouterr().err
    policy = tmp_path / "p.policy"
    policy.write_text(f"log {(tmp_path / 'log' / 'log.vkey').read_text().strip()}\nquorum none\n")
    assert main(["log", "prove", str(tmp_path / "log"), str(run), "--pubkey", str(pub)]) == 0
    assert main(["verify", str(run), "--pubkey", str(pub), "--policy", str(policy), "--tsa-cert",
                 str(t.dir / "ca.crt")]) == 0
    out = capsys.readouterr().out
    assert "PUBLISHED" in out and "EXISTED BY" in out

    # the Hugging Face Trainer, the same options
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from trainledger.training.integrations.hf import TrainledgerCallback as HfCallback

    transformers.logging.set_verbosity_error()

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            x = torch.arange(8) % 16
            return {"input_ids": x, "labels": x}

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=16, n_positions=8))
    out_dir = tmp_path / "hf"
    args = TrainingArguments(output_dir=str(out_dir), max_steps=4, per_device_train_batch_size=4, save_steps=2,
                             report_to="none", use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(),
            callbacks=[HfCallback(key=str(priv), tsa=url, team_log=tmp_path / "log", team_log_key=log_priv)]).train()
    jp = out_dir / "journal.jsonl"
    found = check_journal(jp, [load_signer(priv).public], load_certificates((t.dir / "ca.crt").read_bytes()))
    assert len(found) >= 2 and all(s.error is None for s in found)
    assert "entry 1 of the team log" in capsys.readouterr().err
    with pytest.raises(Exception, match="team_log= and team_log_key= go together"):
        TrainledgerCallback(run, key=str(priv), team_log=tmp_path / "log")


def test_a_malformed_token_or_record_is_refused_in_one_line_never_a_traceback(tmp_path, tsa, capsys):
    """Written by someone without the key (the file beside the journal is anyone's): every truncation and every
    single flipped byte of a real token is a TimestampError (or verifies: a flip in what the signature does not
    cover), a record whose fields are not a record's is listed as such, and a recorded time or digest that is not the
    token's is refused; verify exits 1 with one line each, no traceback."""
    t, url = tsa
    priv, pub = keygen(tmp_path / "keys")
    jp = _journal(tmp_path / "run" / "journal.jsonl", load_signer(priv))
    assert main(["timestamp", str(jp), "--tsa", url, "--pubkey", str(pub)]) == 0
    rec = json.loads(sidecar(jp).read_text())
    token = base64.b64decode(rec["token"])
    note = seal_notes(jp, [load_signer(priv).public])[rec["seal_seq"]][0]
    ca = load_certificates((t.dir / "ca.crt").read_bytes())
    for k in range(0, len(token), 7):
        for bad in (token[:k], token[:k] + bytes([token[k] ^ 0x40]) + token[k + 1:]):
            try:
                verify_token(bad, note, ca)
            except TimestampError:
                pass
    lines = [json.dumps({**rec, "time": "2001-01-01T00:00:00+00:00"}),
             json.dumps({**rec, "note_sha256": "0" * 64}),
             json.dumps({**rec, "token": [1, 2]}),
             json.dumps({"seal_seq": "x", "tsa": 5}),
             "not json"]
    sidecar(jp).write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["verify", str(jp), "--pubkey", str(pub), "--tsa-cert", str(t.dir / "ca.crt")]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "recorded time" in out and "recorded note_sha256" in out and out.count("not a timestamp record") == 3
    # show reads the same records without checking them: the two whose token parses state a time, the rest are named
    sidecar(jp).write_text("\n".join(lines + [json.dumps({**rec, "token": "AAAA"})]) + "\n")
    assert main(["show", str(jp)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert out.count("NOT checked here") == 2 and out.count("not a timestamp record") == 3
    assert out.count("NO TIME") == 4 and "[journal.timestamps.jsonl:6]" in out
    # stamping again over that file: the junk lines are kept and passed over, never a traceback
    before = sidecar(jp).read_text()
    assert main(["timestamp", str(jp), "--tsa", url, "--pubkey", str(pub), "--all-seals"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and sidecar(jp).read_text().startswith(before)
    # a timestamps file that is a link (to anything outside the folder) is refused in one line, and left as it is
    outside = tmp_path / "outside.jsonl"
    outside.write_text(before)
    sidecar(jp).unlink()
    sidecar(jp).symlink_to(outside)
    assert main(["timestamp", str(jp), "--tsa", url, "--pubkey", str(pub)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "link" in out + err and outside.read_text() == before
