"""Every example in the manual and on the front page: each Python block compiles and its imports resolve; a block that
takes from the reader's own code only the names a training script has (a model, an optimizer, a loss, a loader: the
GIVEN prelude below) runs as written, in a fresh folder; every ``trainledger`` command line in a shell block parses
with the CLI's own parser. A block that cannot run here is listed in NOT_RUN with the reason, so a new example that
does not run is seen, not skipped."""

from __future__ import annotations

import ast
import builtins
import re
import shlex
import textwrap

import pytest
from readme_blocks import README, ROOT

#: what a reader's own script already has, for the examples that take it from "your code"
GIVEN = textwrap.dedent('''
    import argparse, math, os, time
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = scheduler = torch.optim.lr_scheduler.StepLR(opt, 10)
    _xs = torch.randn(64, 8)
    loader = [_xs[i:i + 16] for i in range(0, 64, 16)]
    loss, acc, step, steps = torch.tensor(0.5), 0.9, 3, 5
    args = argparse.Namespace(lr=1e-3, epochs=1, batch_size=16)

    def train_step(model, batch):
        out = torch.nn.functional.mse_loss(model(batch), batch.sum(1, keepdim=True))
        opt.zero_grad(); out.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return out, gn

    def save_checkpoint(*args, **kwargs):
        return None
''')
GIVEN_NAMES = {n for n in re.findall(r"^(?:def )?([a-z_][a-z_, ]*?)\s*[=(]", GIVEN, re.M) for n in n.split(", ")} | {
    "argparse", "math", "os", "time", "torch", "optimizer", "scheduler"}

#: blocks that cannot run here, by file and first line: why. Their imports are still checked.
NOT_RUN = {
    ("docs/sdc.md", "from trainledger.training import Recorder"):
        "a DDP model under torchrun (tests/helpers/sdc_worker.py makes the same calls on 4 ranks)",
    ("docs/sdc.md", "# Lightning: the callback runs training_step and its backward pass again in "
                    "on_before_optimizer_step, on the"):
        "a Lightning module and a Hugging Face model and dataset (test_lightning.py and test_hf.py run both)",
    ("README.md", "from trainledger.training import Recorder, check_checkpoint"):
        "nanoGPT's train.py around it (tests/helpers/nanogpt_shaped.py runs the same lines)",
    ("README.md", "from trainledger.training.integrations.hf import TrainledgerCallback          # pip install "
                  "'.[hf]'"):
        "a Trainer of your own (tests/integration/test_readme_examples.py)",
    ("README.md", "from trainledger.training.integrations.lightning import TrainledgerCallback   # pip install "
                  "'.[lightning]'"): "a LightningModule of your own",
    ("docs/provenance.md", "from trainledger.training import Recorder"):
        "a Hugging Face model's save_pretrained and the key keygen made (tests/integration/training/test_release.py)",
    ("docs/checkpoints.md", "from trainledger import Checkpointer, restore_checkpoint"):
        "a fragment of a loop with a sampler and a checkpoint file of its own",
    ("docs/distributed.md", "from trainledger.training.distributed import (ShardedCheckpointer, StragglerDetector, "
                            "anchor_ranks,"): "torchrun's ranks (tests/integration/training/test_distributed.py)",
    ("docs/index.md", "from trainledger.training.integrations.hf import TrainledgerCallback          # pip install "
                      "'.[hf]'"): "a Trainer of your own",
    ("docs/index.md", "from trainledger.training.integrations.lightning import TrainledgerCallback   # pip install "
                      "'.[lightning]'"): "a LightningModule of your own",
    ("docs/integrations.md", "from trainledger.training.integrations.hf import TrainledgerCallback                  # "
                             "pip install 'trainledger[hf]'"): "a Trainer of your own",
    ("docs/integrations.md", "from trainledger.training.integrations.lightning import TrainledgerCallback          # "
                             "pip install 'trainledger[lightning]'"): "a LightningModule of your own",
    ("docs/integrations.md", "from trainledger.training import batch_fingerprint"):
        "a fragment: x, y and loss_f of your step",
    ("docs/keys.md", 'rec = Recorder("runs/r42", key=URI, model=model, optimizer=opt)    # seals signed in the token'):
        "a PKCS#11 token (tests/integration/journal/test_pkcs11.py)",
    ("docs/keys.md", 'rec = Recorder("runs/r42", key=URI, model=model, optimizer=opt)   # under torchrun: rank keys, '
                     "certified by URI's key"): "a token under torchrun",
    ("docs/provenance.md", 'cb = TrainledgerCallback(key="keys/trainledger.key", export_dir="out/export", '
                           'release_key="keys/release.key")'): "a Trainer of your own",
    ("docs/ladder.md", "from trainledger import Rung, run_pilot_ladder"):
        "trains a ladder of rungs (minutes; tests/integration/ladder)",
}


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    """(file, line, code) of every fenced block of ``lang`` ("python", or "" for shell) in the docs and README."""
    out = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"^```([a-z]*)\n(.*?)^```", text, re.S | re.M):
            if (m.group(1) == "python") == (lang == "python"):
                out.append((str(path.relative_to(ROOT)), text[:m.start()].count("\n") + 1, m.group(2)))
    return out


PYTHON = _blocks("python")


def _free_names(tree: ast.AST) -> set[str]:
    """Names a block reads that it never binds itself (nor are builtins): what it takes from the reader's code."""
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else loaded).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return loaded - bound - set(dir(builtins))


def _key(file: str, code: str) -> tuple[str, str]:
    return file, code.splitlines()[0].rstrip()


@pytest.mark.parametrize("file,line,code", PYTHON, ids=[f"{f}:{n}" for f, n, _ in PYTHON])
def test_a_python_example_runs_or_its_imports_resolve(file, line, code, tmp_path, monkeypatch):
    tree = compile(code, f"{file}:{line}", "exec", ast.PyCF_ONLY_AST)  # a SyntaxError names the block
    imports = ast.Module(body=[n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))],
                         type_ignores=[])
    exec(compile(imports, f"{file}:{line} (imports)", "exec"), {})  # noqa: S102 - our own docs
    free = _free_names(tree)
    key = _key(file, code)
    if key in NOT_RUN:
        return
    assert free <= GIVEN_NAMES, f"{file}:{line} uses {sorted(free - GIVEN_NAMES)} from nowhere: define them in " \
                                "the example, or list it in NOT_RUN with the reason"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "home-keys"))
    ns: dict = {}
    exec(compile(GIVEN, "GIVEN", "exec"), ns)  # noqa: S102
    try:
        exec(compile(code, f"{file}:{line}", "exec"), ns)  # noqa: S102
    finally:
        import trainledger.tracking as tracking

        if tracking.current is not None:  # an example that leaves its W&B-style run open
            tracking.current.finish()


def test_not_run_lists_only_blocks_that_exist():
    keys = {_key(f, c) for f, _, c in PYTHON}
    assert set(NOT_RUN) <= keys, sorted(set(NOT_RUN) - keys)


def _commands() -> list[tuple[str, int, str]]:
    """Every ``trainledger ...`` command line in a shell block (continuations and multi-line quotes joined,
    comments, prompts, redirections and ``[optional]`` parts off). docs/cli.md is left out: it is made from the
    parsers themselves (tools/cli_reference.py, checked by test_docs)."""
    out = []
    for file, line, code in _blocks("shell"):
        if file == "docs/cli.md":
            continue
        lines, i = code.replace("\\\n", " ").splitlines(), 0
        while i < len(lines):
            start, text = i, lines[i]
            while True:  # a quoted string may span lines
                try:
                    shlex.split(text, comments=True)
                    break
                except ValueError:
                    i += 1
                    if i >= len(lines):
                        break
                    text += "\n" + lines[i]
            i += 1
            for part in re.split(r"&&|;\s", text):
                part = re.sub(r"\s#.*$", "", part).strip().removeprefix("$ ")
                part = re.sub(r"\s\[[^\]]*\]", "", part).split(" > ")[0].strip()
                m = re.match(r"^(?:\.venv/bin/)?trainledger\s+(.*)$", part, re.S)
                if m and "|" not in part and "$(" not in part and "..." not in part:
                    out.append((file, line + start + 1, m.group(1)))
    return out


COMMANDS = _commands()


@pytest.mark.parametrize("file,line,argv", COMMANDS, ids=[f"{f}:{n}" for f, n, _ in COMMANDS])
def test_every_command_line_in_the_docs_parses(file, line, argv):
    from trainledger.cli import build_parser

    for args in (shlex.split(argv), [re.sub(r"^[A-Z]+$", "1", a) for a in shlex.split(argv)]):
        try:  # as written; then with each CAPITALS placeholder a number (--from SIZE: an int option)
            build_parser().parse_args(args)
            return
        except SystemExit as e:
            if e.code == 0:
                return
    pytest.fail(f"{file}:{line}: trainledger {argv}: the parser refuses it")


def test_the_docs_have_examples_to_run():
    ran = [b for b in PYTHON if _key(b[0], b[2]) not in NOT_RUN]
    assert len(ran) >= 10 and len(COMMANDS) >= 50, (len(ran), len(COMMANDS))
