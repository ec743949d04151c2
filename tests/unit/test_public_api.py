"""The public API holds: every name 0.1.0 exported (and every name added since) imports from where it was
documented, with a signature that takes every call the recorded one took; a moved name warns naming its new place.

The list is tests/unit/public_api.json (tools/public_api.py adds names to it and never drops one)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tool_modules import load_tool

ROOT = Path(__file__).resolve().parents[2]
api = load_tool("public_api")
ENTRIES = json.loads(api.LIST.read_text())


def test_every_listed_name_imports_with_a_compatible_signature():
    assert len(ENTRIES) > 400 and {e["since"] for e in ENTRIES} >= {"0.1.0"}
    assert api.check(ENTRIES) == []


def test_every_import_the_readme_and_docs_show_is_on_the_list():
    listed = {(e["module"], e["name"]) for e in ENTRIES}
    shown = api.documented_imports(ROOT)
    assert ("trainledger.training", "Recorder") in shown
    assert shown - listed == set(), "documented but not held: run tools/public_api.py"


def test_the_compatibility_rule_refuses_what_breaks_a_call():
    old = [["path", "POSITIONAL_OR_KEYWORD", False], ["keys", "KEYWORD_ONLY", True]]
    assert api.incompatible(old, old + [["new", "KEYWORD_ONLY", True]]) == []
    assert api.incompatible(old, [old[0], ["options", "VAR_KEYWORD", False]]) == []     # caught by **kwargs
    assert api.incompatible(old, [old[0]]) == ["keyword 'keys' is gone"]
    assert api.incompatible(old, [old[0], ["keys", "KEYWORD_ONLY", False]]) == ["parameter 'keys' lost its default"]
    assert api.incompatible(old, [["where", "POSITIONAL_OR_KEYWORD", False], old[1]]) == [
        "positional parameter 0 is 'where', was 'path'", "keyword 'path' is gone", "new parameter 'where' has no default"]
    assert api.incompatible(old, old + [["must", "KEYWORD_ONLY", False]]) == ["new parameter 'must' has no default"]


def test_a_moved_name_that_stops_warning_or_vanishes_fails_the_check():
    entry = next(e for e in ENTRIES if e["module"] == "trainledger.training.checkpoint" and e["name"] == "ResumeRejected")
    assert entry["moved_to"] == "trainledger.training.checkpoints.state"
    assert api.check([{**entry, "moved_to": "trainledger.somewhere.else"}])
    assert api.check([{**entry, "name": "ResumeRefused"}])
    assert api.check([{**entry, "kind": "function"}])


def test_last_rounds_torchrun_script_imports_unchanged(tmp_path):
    """The imports 0.1.0's README showed a torchrun user, run as that user's script: they import, the
    moved module warns once naming the new place, the package that stayed does not warn at all."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import warnings
        warnings.simplefilter("error", DeprecationWarning)
        from trainledger.training.distributed import (ShardedCheckpointer, StragglerDetector, anchor_ranks,
                                                      init_process_group, open_rank_journal, rank_key, restore_sharded)
        from trainledger import Checkpointer, restore_checkpoint, Rung, run_pilot_ladder, TrainingHealthMonitor
        warnings.simplefilter("default", DeprecationWarning)
        from trainledger.training.checkpoint import ResumeRejected
        from trainledger.journal.replay import replay
        from trainledger.training.experiment import run_experiment
        from trainledger.training.flops import measure_matmul_peak, PEAK_FLOPS
        print(ResumeRejected.__module__, replay.__module__, run_experiment.__module__)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["trainledger.training.checkpoints.state", "trainledger.audit",
                                  "trainledger.training.experiment.loop"]
    assert ("DeprecationWarning: trainledger.training.checkpoint is deprecated and goes away in 0.3: import "
            "ResumeRejected from trainledger.training.checkpoints.state") in out.stderr
    assert "train.py" in out.stderr        # the warning points at the user's line, not at trainledger
    assert "trainledger.training.experiment" not in out.stderr.replace("trainledger.training.experiment.loop", "")


def test_an_old_keyword_call_still_works(make_journal, pubkey):
    """0.1.0's replay(path, keys=[...]) through its 0.1.0 import path gives the same reconstruction."""
    import warnings

    from trainledger.audit import replay as replay_now

    path = make_journal(30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from trainledger.journal.replay import replay as replay_then
    then, now = replay_then(path, keys=[pubkey]), replay_now(path, keys=[pubkey])
    assert then.ok and then.verify.events == now.verify.events > 30


def test_an_unknown_name_of_a_moved_module_is_an_attribute_error():
    import trainledger.training.checkpoint as old

    try:
        old.NoSuchThing
    except AttributeError as exc:
        assert "trainledger.training.checkpoints.state" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_verify_takes_only_public_parameters():
    """Internal callers' hooks (a fold's consumer, a stream of lines, shared workers) are a Verification passed to
    verify_with, not private keywords of the public verify()."""
    import inspect

    from trainledger.journal import verify

    params = inspect.signature(verify).parameters
    assert not [p for p in params if p.startswith("_")], list(params)


def test_every_old_module_name_still_imports_and_warns_naming_the_new_home():
    """Each module that moved (0.1.0's domain folders, 0.2.0's layers) imports under its old name, in a fresh
    interpreter so that nothing imported earlier helps; every public name it had is there, read with a
    DeprecationWarning that names where it lives now."""
    script = textwrap.dedent("""
        import importlib, warnings
        from trainledger._moved import MOVED, new_home
        bad = []
        for old, (home, _) in sorted(MOVED.items()):
            mod = importlib.import_module(old)
            names = [n for n in getattr(importlib.import_module(home), "__all__", ())][:3]
            for name in names:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    getattr(mod, name)
                if not any(new_home(old, name) in str(w.message) and w.category is DeprecationWarning for w in seen):
                    bad.append(f"{old}.{name}: no warning naming {new_home(old, name)}")
        # an old package's old submodule, and the signer that left the core
        import trainledger.journal.parquet.export as e
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from trainledger.journal.parquet.export import export_parquet
            from trainledger.journal.keys import Pkcs11Signer
        assert any("views.parquet.export" in str(w.message) for w in seen), [str(w.message) for w in seen]
        assert any("backends.hsm" in str(w.message) for w in seen), [str(w.message) for w in seen]
        from trainledger.journal.backends.hsm import Pkcs11Signer as real
        assert Pkcs11Signer is real
        print(len(MOVED), "old names;", "; ".join(bad) or "all warn")
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("all warn"), r.stdout
    assert int(r.stdout.split()[0]) >= 58
