"""The path users release by: a tiny GPT-2 (from a config, nothing downloaded) trained by the real Hugging Face
Trainer with the callback, saved with save_pretrained at the end and released; then a fine-tune of the released
model, whose verify-model names its base."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from trainledger.journal.statements.release.keys import ReleaseKey  # noqa: E402
from trainledger.journal.statements.release.verify import verify_model  # noqa: E402
from trainledger.training.integrations.hf import TrainledgerCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, t: int = 16, seed: int = 0):
        self.x = torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _train(out: Path, signer, key: Path, *, model=None, base_model=None, steps: int = 6):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if model is None:
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                           bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, save_steps=steps,
                             logging_steps=steps, report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                             learning_rate=1e-3)
    cb = TrainledgerCallback(signer=signer, export_dir=out / "export", release_key=key, base_model=base_model)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[cb]).train()
    return out / "export"


def test_a_trainer_run_released_at_its_end_and_a_fine_tune_that_names_its_base(tmp_path, signer, capsys):
    from transformers import GPT2LMHeadModel

    key = ReleaseKey.generate()
    key.save(tmp_path / "release.key")
    base = _train(tmp_path / "base", signer, tmp_path / "release.key")
    assert (base / "model.safetensors").is_file() and (base / "model.sig").is_file()
    v = verify_model(base, release_keys=[key.public], run_keys=[signer.public], journal=tmp_path / "base"
                     / "journal.jsonl")
    assert v.final and v.step == 5 and v.checkpoint["path"] == "checkpoint-6"
    # the Trainer's checkpoint-6 holds the same weights file, byte for byte
    assert "model.safetensors" in v.checkpoint["same_files"]
    assert v.base is None and v.compute["steps"] == 6 and v.compute["tokens"] > 0
    assert v.weights["relation"] == "identical" and "byte-identical to checkpoint checkpoint-6" in v.weights["says"]
    # where a user reads step 5 beside checkpoint-6, it is explained
    from trainledger.cli import main

    (tmp_path / "run.pub").write_text(signer.public.line() + "\n")
    assert main(["verify-model", str(base), "--release-key", str(tmp_path / "release.pub"), "--pubkey",
                 str(tmp_path / "run.pub")]) == 0
    assert "step 5 (the Trainer's checkpoint-6: trainledger numbers steps from 0, so its step 5 is the Trainer's " \
           "global_step 6)" in capsys.readouterr().out
    import model_signing

    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "release.pub").verify(
        base, base / "model.sig")
    tuned = _train(tmp_path / "tuned", signer, tmp_path / "release.key",
                   model=GPT2LMHeadModel.from_pretrained(base), base_model=base, steps=4)
    t = verify_model(tuned, release_keys=[key.public], run_keys=[signer.public])
    assert t.base == {"digest": v.digest, "run_id": v.run_id, "lineage": []}


def test_a_release_key_without_an_export_folder_is_refused_by_both_callbacks(tmp_path):
    from trainledger.journal import Signer
    from trainledger.journal.errors import UsageError

    with pytest.raises(UsageError, match="release_key= releases the model saved to export_dir=: give both"):
        TrainledgerCallback(signer=Signer.generate(), release_key=tmp_path / "release.key")
    lightning_cb = pytest.importorskip("trainledger.training.integrations.lightning").TrainledgerCallback
    with pytest.raises(UsageError, match="give both"):
        lightning_cb(tmp_path / "run", signer=Signer.generate(), release_key=tmp_path / "release.key")
    cb = TrainledgerCallback(signer=Signer.generate(), export_dir=tmp_path / "out", base_model=str(tmp_path / "b"))
    assert cb.export_dir == tmp_path / "out" and cb.base_model == tmp_path / "b" and cb.release_key is None
