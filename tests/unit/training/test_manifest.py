"""The experiment manifest: identity, the seed's two teaching failures, and every validation finding."""

from __future__ import annotations

import json

import pytest
from manifest_fixtures import base, typed, write

from trainledger.cli import main
from trainledger.training.experiment.manifest import ManifestError, load_findings, load_manifest, manifest_identity, parse_manifest, validate


def codes(d):
    m, findings = parse_manifest(d)
    if m is not None:
        findings = validate(m, raw=d)
    return {(f.code, f.path): f for f in findings}


def test_the_example_is_clean():
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    assert [f.line() for f in codes(d).values()] == []


def test_accumulation_change_is_rejected_with_its_arithmetic():
    """Seed 001's first teaching failure: accumulation 4 -> 8 with microbatch 2 on 2 devices is 32, not 16."""
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    d["batch"]["accumulation"] = 8
    f = codes(d)[("E_EFFECTIVE_BATCH", "batch.effective_global_batch")]
    assert f.severity == "error"
    assert "microbatch 2 x 2 data-parallel devices x 8 accumulation steps = 32 examples per update, " \
           "but 16 is declared" in f.message


def test_weights_only_checkpoint_contract_is_rejected():
    """The second teaching failure: a checkpoint of weights alone is not a resume."""
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    d["checkpoint"]["contents"] = ["model"]
    f = codes(d)[("E_CHECKPOINT_CONTRACT", "checkpoint.contents")]
    assert f.message.startswith("missing optimizer, scheduler, scaler, rng, sampler, counters, accumulation, "
                                "manifest_id: a resume from such a checkpoint is resume-invalid-missing-state")


def test_identity_changes_with_content_not_with_the_label():
    m = typed(base())
    d = base()
    d["label"] = "a nicer name"
    assert manifest_identity(typed(d)) == manifest_identity(m)
    d["optimization"]["lr"] = 3.1e-3
    assert manifest_identity(typed(d)) != manifest_identity(m)
    assert manifest_identity(m).startswith("sha256:") and len(manifest_identity(m)) == 71


def test_warmup_must_name_what_it_is_a_fraction_of():
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    del d["optimization"]["warmup_fraction_of"]
    assert ("E_WARMUP_UNANCHORED", "optimization.warmup_fraction_of") in codes(d)
    d["optimization"]["warmup_fraction_of"] = 160
    d["optimization"]["planned_updates"] = 80  # a shortened run: warm-up stays 8 updates, with a warning
    f = codes(d)[("W_WARMUP_ANCHOR", "optimization.warmup_fraction_of")]
    assert f.severity == "warning" and "stays 8 updates" in f.message
    assert typed(d).warmup() == 8


@pytest.mark.parametrize("fraction", [1e308, float("inf"), float("nan"), -1e308])
def test_a_warmup_fraction_out_of_range_is_one_finding_not_a_crash(fraction):
    """Found by mutating a manifest at random: a fraction of 1e308 made the count it implies overflow in validate
    (an OverflowError, a traceback from 'manifest validate' and 'manifest id')."""
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    d["optimization"]["warmup_fraction"] = fraction
    found = codes(d)
    assert ("E_RANGE", "optimization.warmup_fraction") in found
    assert ("E_WARMUP_CONFLICT", "optimization.warmup_updates") not in found


def test_secrets_paths_missing_and_unknown_fields():
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    d["data"]["artifacts"][0]["ref"] = "/home/alice/data/train.bin"
    d["environment"]["code"] = "https://bob:hunter2@git.example.com/repo"
    d["question"]["baseline"] = "AKIAABCDEFGHIJKLMNOP"
    d["model"]["hf_token"] = "x"
    del d["precision"]["grad_dtype"]
    d["precision"]["sharding_plan"] = "fsdp"
    c = codes(d)
    assert ("E_MISSING", "precision.grad_dtype") in c and ("E_UNKNOWN_FIELD", "precision.sharding_plan") in c
    d["precision"]["grad_dtype"] = "fp32"
    del d["precision"]["sharding_plan"]
    c = codes(d)
    assert ("E_ABSOLUTE_PATH", "data.artifacts[0].ref") in c
    assert ("E_SECRET", "environment.code") in c and ("E_SECRET", "question.baseline") in c
    assert ("E_SECRET", "model.hf_token") in c
    d["precision"]["param_dtype"] = "float32"
    d["artifacts"]["tokenizer"] = "abc"
    assert ("E_TYPE", "artifacts.tokenizer") in codes(d)


@pytest.mark.parametrize("fmt", ["yaml", "json", "toml"])
def test_every_format_loads_to_the_same_identity(tmp_path, fmt):
    d = base()
    p = write(tmp_path, d)
    want = manifest_identity(load_manifest(p))
    q = tmp_path / f"m.{fmt}"
    if fmt == "json":
        q.write_text(json.dumps(d))
    elif fmt == "toml":
        q.write_text(_toml(d))
    else:
        q = p
    assert manifest_identity(load_manifest(q)) == want


def _toml(d, prefix=""):
    """Just enough TOML for the manifest: scalars, lists of scalars, tables, arrays of tables."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)
    lines, subs = [], []
    for k, v in d.items():
        if v is None:
            continue
        if isinstance(v, dict):
            subs.append((k, v, False))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            subs.append((k, v, True))
        else:
            lines.append(f"{k} = {val(v)}")
    out = "\n".join(lines) + "\n"
    for k, v, many in subs:
        name = f"{prefix}{k}"
        for item in (v if many else [v]):
            out += f"\n[[{name}]]\n" if many else f"\n[{name}]\n"
            out += _toml(item, prefix=name + ".")
    return out


def test_cli_validate_and_id(tmp_path, capsys):
    d = base()
    p = write(tmp_path, d)
    assert main(["manifest", "validate", str(p)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["manifest", "id", str(p)]) == 0
    assert capsys.readouterr().out.strip() == manifest_identity(load_manifest(p))
    d["batch"]["accumulation"] = 8
    bad = write(tmp_path, d, "bad.yaml")
    assert main(["manifest", "validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "ERROR   batch.effective_global_batch: E_EFFECTIVE_BATCH" in out and "FAIL" in out
    assert main(["manifest", "validate", "--json", str(bad)]) == 1
    assert json.loads(capsys.readouterr().out)["findings"][0]["code"] == "E_EFFECTIVE_BATCH"
    with pytest.raises(ManifestError):
        load_manifest(bad)
    (tmp_path / "broken.toml").write_text("label = \n")
    assert main(["manifest", "validate", str(tmp_path / "broken.toml")]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["manifest", "validate", str(tmp_path / "nope.yaml")]) == 2
    m, findings = load_findings(p)
    assert m is not None and findings == []


def test_billion_laughs_yaml_is_refused_at_once(tmp_path, capsys):
    """Nested aliases would expand 1 KB into billions of nodes; aliases are refused before any expansion."""
    lol = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lol.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    (tmp_path / "m.yaml").write_text("\n".join(lol) + "\n")
    import time

    t0 = time.process_time()  # CPU: the bomb is refused, not expanded
    for argv in (["manifest", "validate", tmp_path / "m.yaml"], ["manifest", "id", tmp_path / "m.yaml"]):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert code == 2 and "aliases" in err and "Traceback" not in out + err  # unparsable: exit 2
    assert time.process_time() - t0 < 5


def test_oversized_and_over_deep_manifests_are_refused(tmp_path, capsys):
    (tmp_path / "big.json").write_text(json.dumps({"x": "y" * (2 << 20)}))
    assert main(["manifest", "validate", str(tmp_path / "big.json")]) == 2
    assert "at most" in capsys.readouterr().err
    (tmp_path / "deep.json").write_text("[" * 200 + "]" * 200)
    assert main(["manifest", "validate", str(tmp_path / "deep.json")]) == 2
    assert "nested deeper" in capsys.readouterr().err


@pytest.mark.parametrize("ref", ["../outside.bin", "/etc/passwd", "data/../../x.bin"])
def test_data_refs_outside_the_data_root_are_findings(ref):
    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    d["data"]["artifacts"][0]["ref"] = ref
    assert ("E_UNSAFE_REF", "data.artifacts[0].ref") in codes(d)
