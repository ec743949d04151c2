"""Shared fixtures: real keys on disk, real journals, a seeded RNG that prints its seed."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

# As the console script does (src/trainledger/cli/__init__.py's entry): the numerical work the tests drive (the scaling fits' small
# matrices, replay's refits) gains nothing from BLAS threads, whose helpers spin on a shared machine; one thread halved
# the fast tier's scaling tests' CPU time. Read when numpy loads, which is after this; a value the caller set is kept.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Tests run with --import-mode=importlib (no folder of theirs lands on sys.path by itself, so a folder named
# journal/ or training/ can never shadow the package); the shared helpers (journal_tools, manifest_fixtures, the
# torchrun workers, ...) live in tests/helpers/; a test may import another's helpers by module name (test
# basenames are unique across the tiers), so every test folder is importable too.
_HERE = Path(__file__).resolve().parent
for _d in (_HERE, _HERE / "helpers", *sorted(d for kind in ("unit", "integration", "adversarial")
                                             for d in (_HERE / kind).rglob("*") if d.is_dir())):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

#: the tiers, by folder: ``pytest -m unit`` (or ``pytest tests/unit``) is the fast one
KINDS = ("unit", "integration", "adversarial")


def pytest_ignore_collect(collection_path, config):
    """``-m unit`` (or ``-m integration``, ``-m adversarial``) alone: the other tiers' folders are not even imported
    (the integration tests import transformers, lightning and tensorboard, seconds the fast tier need not pay)."""
    want = (config.getoption("markexpr") or "").strip()
    if want in KINDS:
        path = Path(str(collection_path)).resolve()
        parts = path.relative_to(_HERE).parts if _HERE in path.parents else ()
        if parts and parts[0] in KINDS and parts[0] != want:
            return True
    return None


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, from the folder it lives in (tests/unit/, tests/integration/,
    tests/adversarial/)."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(_HERE).parts
        if parts and parts[0] in KINDS:
            item.add_marker(getattr(pytest.mark, parts[0]))

from trainledger.journal import Journal, StepObserved, keygen, load_signer  # noqa: E402

try:  # tqdm (the Trainers' progress bars) starts a monitor thread that outlives the test that made a bar; a process
    import tqdm  # with another thread never forks, so verify's workers and fold_events' checker would not run

    tqdm.tqdm.monitor_interval = 0
except ImportError:
    pass


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's query cache or key folder."""
    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    # nor the user's key folder (the ladder and demo keep a run's new key there)
    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path_factory.mktemp("keyhome")))
    yield
    from trainledger.journal.views import query

    while query._REFRESHERS:  # a background cache refresher a test started ends before the next test
        query._REFRESHERS.pop().wait(timeout=120)


@pytest.fixture
def rng(request) -> random.Random:
    seed = int(os.environ.get("TRAINLEDGER_TEST_SEED", random.randrange(2**32)))
    print(f"\n[{request.node.name}] seed={seed} (rerun with TRAINLEDGER_TEST_SEED={seed})")
    return random.Random(seed)


@pytest.fixture
def keypair(tmp_path):
    """A real key pair written by keygen: (signer, private path, public path)."""
    priv, pub = keygen(tmp_path / "keys")
    return load_signer(priv), priv, pub


@pytest.fixture
def signer(keypair):
    return keypair[0]


@pytest.fixture
def pubkey(keypair):
    return keypair[0].public


def step(i: int, **kw) -> StepObserved:
    kw.setdefault("loss", 3.0 - i * 0.01)
    kw.setdefault("grad_norm", 1.0 + (i % 7) * 0.01)
    kw.setdefault("lr", 3e-4)
    kw.setdefault("step_time_s", 0.25)
    kw.setdefault("tokens", 4096)
    return StepObserved(step=i, **kw)


@pytest.fixture
def make_journal(tmp_path, signer):
    """Write a closed journal of ``n`` step events; returns its path."""
    counter = iter(range(10**6))

    def make(n: int = 50, *, seal_every: int = 10, close: bool = True, run_id: str | None = None,
             signer_=signer, name: str | None = None) -> Path:
        path = tmp_path / (name or f"j{next(counter)}.jsonl")
        j = Journal.create(path, signer=signer_, run_id=run_id, seal_every=seal_every, background=False)
        for i in range(n):
            j.append(step(i))
        if close:
            j.close()
        else:
            j.suspend()
        return path

    return make
