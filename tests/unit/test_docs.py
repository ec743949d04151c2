"""The front page and the manual: the README's examples run as written, the docs site builds strictly, the CLI
reference matches the parsers, the import graph keeps its rules, and no tracker label leaks into what users read."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_blocks import README, ROOT, example
from tool_modules import load_tool

from trainledger.cli import main


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024, len(text.encode())
    # the two commands, first: one sets up and runs the main job, one sets up and runs the tests
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    assert blocks[0].strip() == "bash tools/setup.sh && .venv/bin/trainledger ladder runs/ladder-$(date +%s)"
    assert blocks[1].strip() == "bash tools/setup.sh --browser && .venv/bin/python -m pytest -q -n 2"
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1].strip() in ci  # CI runs the README's test command exactly
    for target in re.findall(r"\]\(([^)#]+)\)", text):  # every link on the page names a file that exists
        assert (ROOT / target).exists(), target
    assert (ROOT / "LICENSE").read_text().startswith("\n                                 Apache License")
    assert (ROOT / "CHANGELOG.md").exists()


def test_the_readme_recorder_example_runs(tmp_path, monkeypatch):
    """Key generation, the Recorder, grad_norm, lr and tokens, checkpoints: the page's code as written."""
    monkeypatch.chdir(tmp_path)
    exec(compile(example("readme-recorder"), "README.md (recorder)", "exec"), {})  # noqa: S102
    from trainledger.journal import load_public_key, read_events, verify

    j = tmp_path / "runs" / "mine" / "journal.jsonl"
    rep = verify(j, keys=[load_public_key(tmp_path / "keys" / "trainledger.pub")], require_closed=True)
    assert rep.kinds["step_observed"] == 20 and rep.kinds["checkpoint_saved"] == 2
    steps = [e for e in read_events(j) if type(e).__name__ == "StepObserved"]
    assert all(s.grad_norm is not None and s.lr == 1e-2 and s.tokens == 128 for s in steps)


def test_the_readme_wandb_example_runs_and_verifies(tmp_path, monkeypatch):
    """`import trainledger as wandb`: the page's five lines as written, then the journal they leave verified with
    the public key beside it, every row a metrics_logged, the config recorded."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "home-keys"))
    exec(compile(example("readme-wandb"), "README.md (wandb)", "exec"), {})  # noqa: S102
    from trainledger.journal import load_public_key, verify

    run = tmp_path / "trainledger-runs" / "mine" / "first"
    rep = verify(run / "journal.jsonl", keys=[load_public_key(run / "trainledger.pub")], require_closed=True)
    assert rep.kinds["metrics_logged"] == 100 and rep.kinds["config_logged"] >= 1
    assert not list(run.rglob("*.key"))


def test_the_readme_audit_commands_run(tmp_path, monkeypatch, capsys):
    """'Check a journal someone sent you': each command, as written, exits 0."""
    monkeypatch.chdir(tmp_path)
    commands = [ln.split("#")[0].strip() for ln in example("readme-audit").splitlines()]
    commands = [c for c in commands if c]
    assert [c.split()[1] for c in commands] == ["demo", "verify", "replay", "query"]
    for c in commands:
        argv = shlex.split(c)
        assert argv[0] == "trainledger"
        assert main(argv[1:]) == 0, (c, capsys.readouterr())
    out = capsys.readouterr().out
    assert "OK" in out and "steps" in out


def test_every_command_is_on_the_front_page_and_in_the_reference():
    from trainledger.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    readme, ref = README.read_text(), (ROOT / "docs" / "cli.md").read_text()
    for name in (n for n, p in sub.choices.items() if p.prog.split()[-1] == n):  # aliases: old names
        assert f"`trainledger {name}`" in readme, name
        assert f"\n## {name}\n" in ref, name


def test_the_cli_reference_matches_the_parsers():
    cli_reference = load_tool("cli_reference")
    text = (ROOT / "docs" / "cli.md").read_text()
    made_with = re.search(r"\(Python (\d+\.\d+)\)", text).group(1)
    if made_with != f"{sys.version_info.major}.{sys.version_info.minor}":
        pytest.skip(f"docs/cli.md was generated with Python {made_with}; argparse lays help out differently here")
    assert cli_reference.render() == text, "docs/cli.md is stale: run tools/cli_reference.py"


def test_the_docs_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (the dev extra installs it)")
    r = subprocess.run([mkdocs, "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "cli" / "index.html").exists()
    page = (tmp_path / "site" / "index.html").read_text()
    assert "fonts.googleapis" not in page and "fonts.gstatic" not in page  # the site fetches nothing from elsewhere


def test_the_import_graph_has_no_cycle_and_no_private_import_across_packages():
    res = load_tool("import_graph").analyse()
    assert res["findings"] == [], res["findings"]
    assert res["cycles"] == [] and res["modules"] > 60
    assert not any(k.startswith("journal -> ") for k in res["arrows"])  # the journal imports no other package


def test_the_import_graph_refuses_an_import_up_or_across_a_layer(monkeypatch):
    """The folder-level layers hold: the format core importing a proof module, the audit importing the views, a
    back end importing a statement, the health folds importing an integration are each named, and so is an import
    between two folders placed beside each other; the real graph has none."""
    g = load_tool("import_graph")
    mods = g.modules()
    fake = [("trainledger.journal.writer", "trainledger.journal.proofs.bundle", "", 1),
            ("trainledger.journal.audit.replay", "trainledger.journal.views.query", "", 2),
            ("trainledger.journal.backends.storage", "trainledger.journal.statements.release.attest", "", 3),
            ("trainledger.training.health.monitor", "trainledger.training.integrations.hooks", "", 4),
            ("trainledger.journal.views.query", "trainledger.journal.audit.rundir", "", 5)]  # down: allowed
    found = g.layer_findings(mods, fake)
    assert len(found) == 4, found
    assert "journal/writer.py:1:" in found[0] and "a layer above it" in found[0]
    assert g.layer_findings(mods, g.edges(mods)) == []
    beside = [(".",), ("proofs",), ("audit",), ("backends", "statements"), ("views",)]
    monkeypatch.setattr(g, "LAYERS", {**g.LAYERS, "journal": beside})
    found = g.layer_findings(mods, fake[2:3])
    assert len(found) == 1 and "a folder beside it in its layer" in found[0], found
    assert [line.split(":")[0].strip() for line in g.layer_picture()] == ["journal", "training", "ladder",
                                                                          "trainledger"]


def test_each_c_accelerator_lives_with_the_layer_it_serves():
    """No training code in the journal's C: the format core's accelerator defines no detector, fold or MFU
    function (those are training/health/_fastfolds.c's), and no Arrow column builder (journal/views/_fastcols.c's);
    every C source is one that setup.py builds and the sanitizer test instruments."""
    import re as _re

    sources = sorted(str(p.relative_to(ROOT)) for d in ("journal", "training", "ladder", "src")
                     for p in (ROOT / d).rglob("*.c"))
    assert sources == ["journal/_fast.c", "journal/views/_fastcols.c", "training/health/_fastfolds.c"]
    setup = (ROOT / "setup.py").read_text()
    sanitized = (ROOT / "tests/integration/journal/test_sanitizers.py").read_text()
    assert all(s in setup and s in sanitized for s in sources)
    defined = {s: set(_re.findall(r"^static PyObject \*(\w+)\(", (ROOT / s).read_text(), _re.M)) for s in sources}
    core = defined["journal/_fast.c"]
    assert not core & {"baseline_step", "health_run", "step_columns", "record_column", "record_columns"}
    assert not _re.search(r"health|detector|baseline|anomal|mfu", (ROOT / "journal/_fast.c").read_text().split("*/", 1)[1],
                          _re.I)
    assert {"baseline_step", "health_run"} <= defined["training/health/_fastfolds.c"]
    assert {"step_columns", "record_columns"} <= defined["journal/views/_fastcols.c"]


def test_no_tracker_labels_in_code_or_what_users_read():
    """Roadmap and tracker labels (an issue number) belong to the history (CHANGELOG, commits, docs/bench), not to
    module docstrings, help text or the manual."""
    offenders = []
    paths = [*ROOT.glob("journal/**/*.py"), *ROOT.glob("training/**/*.py"), *ROOT.glob("ladder/**/*.py"),
             *ROOT.glob("src/trainledger/**/*.py"), *ROOT.glob("tools/*.py"), *ROOT.glob("tests/**/*.py"),
             *ROOT.glob("docs/*.md"), README]
    for p in paths:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"\bissue #?\d+|\(#\d+\)", line, re.I):
                offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
    assert offenders == []


def _documented_imports() -> list[str]:
    """Every ``from trainledger... import ...`` and ``import trainledger...`` statement in the README and the docs."""
    out = []
    for p in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = p.read_text()
        for m in re.finditer(r"^\s*from (trainledger[\w.]*) import (\([^)]*\)|[^\n#]+)", text, re.M):
            names = " ".join(m.group(2).strip("()").split()).rstrip(",")
            out.append(f"from {m.group(1)} import {names}")
        out += re.findall(r"^\s*(import trainledger[\w.]*)", text, re.M)
    return sorted(set(out))


def test_every_documented_import_works():
    """What the README and the manual tell users to import exists, under the name they give."""
    statements = _documented_imports()
    assert len(statements) >= 8, statements
    failed = []
    for stmt in statements:
        try:
            exec(stmt, {})  # noqa: S102 - our own docs
        except ImportError as e:
            failed.append(f"{stmt}: {e}")
    assert failed == []


def test_every_dotted_name_the_docs_give_resolves():
    """`trainledger.audit.replay`, `trainledger.journal.views.query.connect`, ...: each names a module or an attribute."""
    import importlib

    names = set()
    for p in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        names |= set(re.findall(r"(?<![\w/.-])(trainledger(?:\.[A-Za-z_]\w*)+)", p.read_text()))
    names = {n for n in names if not n.endswith((".key", ".pub", ".jsonl"))}
    assert len(names) >= 8, names
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert missing == []


def test_the_detection_figures_on_the_front_page_are_the_measured_ones():
    """README's detection table quotes docs/bench/detection.txt (tools/bench_detection.py's output), and
    docs/monitor.md's false-alarm table docs/bench/false_alarms.txt."""
    import re

    bench = (ROOT / "docs" / "bench" / "detection.txt").read_text()
    text = README.read_text()
    block = text[text.index("<!-- detection:begin -->"):text.index("<!-- detection:end -->")]
    quoted = re.findall(r"\b\d+\.\d\d\b|\b\d+/\d+\b", block)
    assert len(quoted) >= 8 and all(q in bench for q in quoted), [q for q in quoted if q not in bench]
    monitor = (ROOT / "docs" / "monitor.md").read_text()
    block = monitor[monitor.index("<!-- false-alarms:begin -->"):monitor.index("<!-- false-alarms:end -->")]
    quoted = re.findall(r"\b\d+\.\d\d\b", block)
    fa = (ROOT / "docs" / "bench" / "false_alarms.txt").read_text()
    assert len(quoted) >= 6 and all(q in fa for q in quoted), [q for q in quoted if q not in fa]


def test_every_package_folder_is_installed():
    """A folder with an ``__init__.py`` that pyproject's package list lacks works in the editable install the tests
    use and is missing from ``pip install .``: every one must be listed."""
    tomllib = pytest.importorskip("tomllib")

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    dirs = {"journal": "trainledger.journal", "training": "trainledger.training", "ladder": "trainledger.ladder",
            "trainledger": "trainledger"}
    found = set()
    for folder, name in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found - listed == set()
