"""One registry of event kinds: verify, the query views and FORMAT.md all follow the classes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec

from trainledger.journal import codec
from trainledger.journal.kinds import BUILTIN_KINDS

FORMAT = Path(__file__).resolve().parents[3] / "docs" / "FORMAT.md"


def test_every_builtin_kind_is_known_in_a_fresh_process_that_imports_only_the_codec():
    code = ("import sys; from trainledger.journal import codec; from trainledger.journal.kinds import BUILTIN_KINDS;"
            "sys.exit(0 if set(BUILTIN_KINDS) <= set(codec.known_kinds()) else 1)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_domains_kinds_register_with_the_codec_whatever_the_caller_imported(tmp_path):
    """The training and ladder kinds live with their domains; a process that imports only the journal package knows
    them before it decodes anything, and verifies the signed journal of every kind as it was written."""
    golden = Path(__file__).resolve().parents[2] / "assets" / "golden" / "every_kind_v1.jsonl"
    code = ("import sys; from trainledger.journal import verify; from trainledger.journal import codec;"
            "kinds = codec.known_kinds();"
            "assert kinds['gate_verdict'].__module__ == 'trainledger.ladder.kinds', kinds['gate_verdict'].__module__;"
            "assert kinds['run_configured'].__module__ == 'trainledger.training.kinds';"
            f"r = verify({str(golden)!r}, trust_embedded=True); print(r.ok, r.kinds)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True ") and "gate_verdict" in out.stdout and "run_configured" in out.stdout


def test_an_old_import_of_a_moved_kind_warns_and_gives_the_same_class():
    import warnings

    from trainledger.ladder.kinds import GateVerdict
    from trainledger.training.kinds import RunConfigured

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from trainledger.journal.kinds import GateVerdict as old_gate, RunConfigured as old_rc
    assert old_gate is GateVerdict and old_rc is RunConfigured
    assert [str(w.message).split(" moved to ")[1].split(" in ")[0] for w in caught] == [
        "trainledger.ladder.kinds.GateVerdict", "trainledger.training.kinds.RunConfigured"]


def test_the_registry_holds_every_event_class_trainledger_defines():
    from trainledger.journal.events import Event

    def walk(c):
        for s in c.__subclasses__():
            yield s
            yield from walk(s)

    ours = {c for c in walk(Event) if c.__module__.startswith("trainledger.") and not codec.is_record_type(c)}
    assert ours == set(BUILTIN_KINDS.values())


def test_query_views_have_every_field_of_every_kind(tmp_path, signer, pubkey):
    from trainledger.journal import Journal
    from trainledger.journal.views.query import VIEW_NAMES, connect

    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer, background=False).close()
    con = connect([p], keys=[pubkey], use_cache=False)
    for kind, cls in BUILTIN_KINDS.items():
        cols = [r[0] for r in con.execute(f'DESCRIBE "{kind}"').fetchall()]
        rank_col = "journal_rank" if "rank" in cls.__struct_fields__ else "rank"
        assert cols == ["run_id", rank_col, "seq", "ts",
                        *(f for f in cls.__struct_fields__ if f not in ("run_id", "seq", "ts"))], kind
    for name, kind in VIEW_NAMES.items():
        assert [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()][4:] == list(BUILTIN_KINDS[kind].__struct_fields__)


def test_format_md_lists_every_kind_with_its_fields_in_order():
    """docs/FORMAT.md's kind table is tested against the classes: one row per kind, every field, in order."""
    full = FORMAT.read_text()
    text = full[full.index("## 6. Core event kinds"):full.index("## 7.")]
    for kind, cls in BUILTIN_KINDS.items():
        row = re.search(rf"^\| `{kind}` \|([^\n]*)$", text, re.M)
        assert row is not None, f"FORMAT.md has no row for {kind}"
        names = re.findall(r"`([a-z_][a-z0-9_]*)\??`", row.group(1).split("|")[0])
        fields = [f.encode_name for f in msgspec.inspect.type_info(cls).fields]
        it = iter(names)
        assert all(f in it for f in fields), f"{kind}: FORMAT.md lists {names}, the class has {fields}"
        # A field the decoder requires is shown neither as optional (`name?`) nor with a default (`name` int (0)):
        # a writer that follows the page and leaves it out would be refused.
        cell = row.group(1).split("|")[0]
        for f in msgspec.inspect.type_info(cls).fields:
            if not f.required:
                continue
            m = re.search(rf"`{f.encode_name}(\??)`([^`]*)", cell)
            if m is None:
                continue
            assert not m.group(1), f"{kind}.{f.encode_name}: required by the reader, shown as optional"
            assert not re.match(r"\s*[^\s(,]+\s*\((?:-?\d[\d.]*|\[\]|\{\}|\"\"|false|true|null)\)", m.group(2)), \
                f"{kind}.{f.encode_name}: required by the reader, shown with a default: {m.group(2)!r}"
