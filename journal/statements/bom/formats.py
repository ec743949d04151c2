"""The four documents, each a pure function of a run's facts (:class:`~trainledger.journal.statements.bom.facts.Collected`):
the same facts give the same bytes, so ``verify-bom`` rebuilds a document from the proven events and names the first
place the one it was given differs. Each builder also returns its links: every place in the document a fact
stands (a JSON pointer; for the model card, into its metadata), for readers and for the proof pack.

- ``cyclonedx``: a CycloneDX 1.6 ML-BOM (ECMA-424): the model a ``machine-learning-model`` component, its model card's
  performance metrics (gate verdicts, evaluations), the training (or fine-tuning) energy under
  ``considerations.environmentalConsiderations.energyConsumptions``, compute and hyperparameters as properties.
- ``spdx``: SPDX 3.0.1 JSON-LD, an ``ai_AIPackage`` with ``ai_energyConsumption``, ``ai_hyperparameter``,
  ``ai_metric``, ``ai_metricDecisionThreshold`` and ``ai_informationAboutTraining``.
- ``hf-card``: a Hugging Face model card (README.md): YAML metadata (written in YAML's JSON form) with
  ``model-index`` results and a ``trainledger`` block, and a body rendered from that metadata alone.
- ``intoto-eval``: an in-toto Statement v1 carrying the evaluation-result predicate proposed to in-toto
  (in-toto/attestation#565): each gate's metric, comparator, threshold and verdict, ``assuranceLevel`` ``reproduced``
  where replay recomputes the verdict, ``self_attested`` for a recorded evaluation.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from trainledger.journal.statements.bom.facts import Collected

__all__ = ["FORMATS", "build", "as_text", "INTOTO_PREDICATE", "split_card"]

FORMATS = ("cyclonedx", "spdx", "hf-card", "intoto-eval")
INTOTO_PREDICATE = "https://b7n0de.com/attestation/eval-result/v0.1"
_NS = uuid.UUID("6b1d6f1e-5a1c-4d43-9a43-74726c656467")  # trainledger's namespace for the documents' own ids


def as_text(v: Any) -> str:
    """A value as a string field states it: ``true``/``false``, an integer's digits, a float's shortest repr."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


class _Doc:
    """A document being built and the links of its facts."""

    def __init__(self, c: Collected):
        self.c = c
        self.links: list[dict[str, str]] = []

    def num(self, name: str, at: str) -> Any:
        self.links.append({"at": at, "fact": name, "as": "value"})
        return self.c.facts[name].value

    def text(self, name: str, at: str) -> str:
        self.links.append({"at": at, "fact": name, "as": "text"})
        return as_text(self.c.facts[name].value)

    def has(self, name: str) -> bool:
        return name in self.c.facts


def _when(c: Collected) -> str:
    """The document's date: the run's last step (its total's ``ended_ns``), so the same run gives the same bytes."""
    ends = [ln.get("ended_ns") for (_, _), ln in sorted(c.lines.items()) if ln.get("kind") == "compute_totaled"]
    ns = next((e for e in ends if e is not None), 0)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def _serial(c: Collected, fmt: str) -> str:
    key = json.dumps([fmt, c.run, sorted((n, repr(f.value)) for n, f in c.facts.items())], separators=(",", ":"))
    return str(uuid.uuid5(_NS, key))


def _metrics(d: _Doc) -> list[tuple[str, str, str, str | None]]:
    """(metric, value fact, where it was measured, threshold fact or None) of every gate and evaluation."""
    out = []
    for g in d.c.gates:
        for m in g["metrics"]:
            out.append((m["metric"], m["value"], f"gate {g['rung']}", m["threshold"]))
    for e in d.c.evaluations:
        for m in e["metrics"]:
            out.append((m["metric"], m["value"], f"evaluation {e['hook']} at step {e['step']}", None))
    return out


#: each run's compute facts, as the documents name them
RUN_PROPS = (("training_flops", "training_compute_flop"), ("tokens", "training_tokens"), ("steps", "training_steps"),
             ("training_hours", "training_time_in_steps_hours"), ("energy_kwh", "energy_kwh"))
#: the model's facts (the last run's)
MODEL_PROPS = (("shape:n_params", "parameters"), ("shape:n_layer", "layers"), ("shape:n_head", "attention_heads"),
               ("shape:seq_len", "sequence_length"), ("model_digest", "model_sha256"),
               ("base_model_digest", "base_model_sha256"))


def _props(d: _Doc) -> list[tuple[str, str]]:
    """(fact, property name) of every compute fact of every run, the model's, then its hyperparameters."""
    out = []
    for r, run in enumerate(d.c.runs):
        for fact, key in RUN_PROPS:
            if d.has(f"run{r}:{fact}"):
                out.append((f"run{r}:{fact}", f"{run['run']}:{key}"))
    out += [(fact, key) for fact, key in MODEL_PROPS if d.has(fact)]
    out += [(name, name) for name in d.c.hyperparameters]
    return out


def _activity(run: dict[str, Any]) -> str:
    return "fine-tuning" if run["fine_tune"] else "training"


def _cyclonedx(d: _Doc, version: str) -> dict[str, Any]:
    c = d.c
    comp: dict[str, Any] = {"type": "machine-learning-model", "bom-ref": "model", "name": c.run or "model"}
    base = "/metadata/component"
    if d.has("model_digest"):
        comp["hashes"] = [{"alg": "SHA-256", "content": d.text("model_digest", f"{base}/hashes/0/content")}]
    card: dict[str, Any] = {}
    metrics = []
    for i, (metric, value, where, _) in enumerate(_metrics(d)):
        metrics.append({"type": metric, "value": d.text(value, f"{base}/modelCard/quantitativeAnalysis/"
                                                               f"performanceMetrics/{i}/value"), "slice": where})
    if metrics:
        card["quantitativeAnalysis"] = {"performanceMetrics": metrics}
    energy = []
    for r, run in enumerate(c.runs):
        if not d.has(f"run{r}:energy_kwh"):
            continue
        at = f"{base}/modelCard/considerations/environmentalConsiderations/energyConsumptions/{len(energy)}"
        energy.append({
            "activity": _activity(run),
            "energyProviders": [{"organization": {"name": "not recorded"}, "energySource": "unknown",
                                 "energyProvided": {"value": d.num(f"run{r}:energy_kwh", f"{at}/energyProviders/0/"
                                                                                          "energyProvided/value"),
                                                    "unit": "kWh"}}],
            "activityEnergyCost": {"value": d.num(f"run{r}:energy_kwh", f"{at}/activityEnergyCost/value"),
                                   "unit": "kWh"},
            "properties": [{"name": "trainledger:run", "value": run["run"]}]})
    if energy:
        card["considerations"] = {"environmentalConsiderations": {"energyConsumptions": energy}}
    props = []
    for fact, key in _props(d):
        props.append({"name": "trainledger:" + key,
                      "value": d.text(fact, f"{base}/modelCard/properties/{len(props)}/value")})
    if props:
        card["properties"] = props
    if card:
        comp["modelCard"] = card
    return {"bomFormat": "CycloneDX", "specVersion": "1.6", "serialNumber": "urn:uuid:" + _serial(c, "cyclonedx"),
            "version": 1, "metadata": {"timestamp": _when(c), "tools": {"components": [
                {"type": "application", "name": "trainledger", "version": version}]}, "component": comp}}


def _spdx(d: _Doc, version: str) -> dict[str, Any]:
    c = d.c
    sid = _serial(c, "spdx")
    ns = f"urn:trainledger:spdx:{sid}"
    creation = {"type": "CreationInfo", "@id": "_:creationinfo", "specVersion": "3.0.1", "created": _when(c),
                "createdBy": [f"{ns}#trainledger"]}
    tool = {"type": "SoftwareAgent", "spdxId": f"{ns}#trainledger", "creationInfo": "_:creationinfo",
            "name": f"trainledger {version}"}
    pkg: dict[str, Any] = {"type": "ai_AIPackage", "spdxId": f"{ns}#model", "creationInfo": "_:creationinfo",
                           "name": c.run or "model", "software_primaryPurpose": "model",
                           "software_downloadLocation": "NOASSERTION", "releaseTime": _when(c)}
    at = "/@graph/2"
    if d.has("model_digest"):
        pkg["verifiedUsing"] = [{"type": "Hash", "algorithm": "sha256",
                                 "hashValue": d.text("model_digest", f"{at}/verifiedUsing/0/hashValue")}]
    energy: dict[str, list[dict[str, Any]]] = {}
    for r, run in enumerate(c.runs):
        if d.has(f"run{r}:energy_kwh"):
            field = "ai_finetuningEnergyConsumption" if run["fine_tune"] else "ai_trainingEnergyConsumption"
            got = energy.setdefault(field, [])
            got.append({"type": "ai_EnergyConsumptionDescription",
                        "ai_energyQuantity": d.num(f"run{r}:energy_kwh",
                                                   f"{at}/ai_energyConsumption/{field}/{len(got)}/ai_energyQuantity"),
                        "ai_energyUnit": "kilowattHour"})
    if energy:
        pkg["ai_energyConsumption"] = {"type": "ai_EnergyConsumption", **energy}
    hyper = []
    for fact, key in _props(d):
        hyper.append({"type": "DictionaryEntry", "key": key,
                      "value": d.text(fact, f"{at}/ai_hyperparameter/{len(hyper)}/value")})
    if hyper:
        pkg["ai_hyperparameter"] = hyper
    metrics, thresholds = [], []
    for metric, value, where, threshold in _metrics(d):
        key = f"{metric} ({where})"
        metrics.append({"type": "DictionaryEntry", "key": key,
                        "value": d.text(value, f"{at}/ai_metric/{len(metrics)}/value")})
        if threshold is not None:
            thresholds.append({"type": "DictionaryEntry", "key": key,
                               "value": d.text(threshold, f"{at}/ai_metricDecisionThreshold/{len(thresholds)}/value")})
    if metrics:
        pkg["ai_metric"] = metrics
    if thresholds:
        pkg["ai_metricDecisionThreshold"] = thresholds
    pkg["ai_informationAboutTraining"] = (
        "Trained by the run named here; every figure in this document is one of its signed journal lines, replayed "
        "(trainledger verify-bom checks them against the proof pack beside this document).")
    doc = {"type": "SpdxDocument", "spdxId": f"{ns}#document", "creationInfo": "_:creationinfo",
           "rootElement": [f"{ns}#model"], "element": [f"{ns}#model", f"{ns}#trainledger"],
           "profileConformance": ["core", "software", "ai"], "dataLicense": "https://spdx.org/licenses/CC0-1.0"}
    return {"@context": "https://spdx.org/rdf/3.0.1/spdx-context.jsonld",
            "@graph": [creation, tool, pkg, doc]}


def _intoto(d: _Doc, version: str) -> dict[str, Any]:
    c = d.c
    if d.has("model_digest"):
        subject = {"name": c.run or "model", "digest": {"sha256": d.text("model_digest", "/subject/0/digest/sha256")}}
    else:  # no weights exported: the statement is about the run, named by the chain hash of its compute total
        h = next((ln["h"] for (_, _), ln in sorted(c.lines.items()) if ln.get("kind") == "compute_totaled"), "0" * 64)
        subject = {"name": f"trainledger-run:{c.run}", "digest": {"sha256": h}}
    claims = []
    for g in c.gates:
        for m in g["metrics"]:
            at = f"/predicate/claims/{len(claims)}"
            claims.append({"metric": m["metric"], "comparator": m["comparator"],
                           "threshold": d.num(m["threshold"], f"{at}/threshold"),
                           "value": d.num(m["value"], f"{at}/value"),
                           "passed": d.num(g["passed"], f"{at}/passed"),
                           "assuranceLevel": "reproduced",
                           "harness": {"name": f"trainledger gate {g['rung']}"}})
    for e in c.evaluations:
        for m in e["metrics"]:
            at = f"/predicate/claims/{len(claims)}"
            claims.append({"metric": m["metric"], "value": d.num(m["value"], f"{at}/value"),
                           "sampleSize": d.num(e["cases"], f"{at}/sampleSize"),
                           "assuranceLevel": "self_attested",
                           "harness": {"name": f"trainledger evaluation {e['hook']} ({e['role']}) at step {e['step']}"}})
    return {"_type": "https://in-toto.io/Statement/v1", "subject": [subject], "predicateType": INTOTO_PREDICATE,
            "predicate": {"producer": {"name": "trainledger", "version": version}, "claims": claims}}


def _card(d: _Doc, version: str) -> tuple[dict[str, Any], str]:
    c = d.c
    meta: dict[str, Any] = {"tags": ["trainledger"]}
    results = []
    for metric, value, where, _ in _metrics(d):
        at = f"/model-index/0/results/{len(results)}"
        results.append({"task": {"type": "text-generation"}, "dataset": {"name": where, "type": "trainledger"},
                        "metrics": [{"type": metric, "name": metric,
                                     "value": d.num(value, f"{at}/metrics/0/value")}]})
    if results:
        meta["model-index"] = [{"name": c.run or "model", "results": results}]
    tl: dict[str, Any] = {"run": c.run}
    for fact, key in _props(d):
        if fact.startswith("hyperparameter:"):
            continue
        tl[key] = d.num(fact, "/trainledger/" + key.replace("~", "~0").replace("/", "~1"))
    hp = {}
    for name in c.hyperparameters:
        key = name.split(":", 1)[1]
        hp[key] = d.num(name, f"/trainledger/hyperparameters/{key.replace('~', '~0').replace('/', '~1')}")
    if hp:
        tl["hyperparameters"] = hp
    tl["proof"] = "every figure here is a signed journal line, replayed: trainledger verify-bom README.md"
    meta["trainledger"] = tl
    return meta, card_body(meta)


def card_body(meta: dict[str, Any]) -> str:
    """The card's prose, a function of its metadata alone (``verify-bom`` renders it again and compares)."""
    tl = meta.get("trainledger", {})
    lines = [f"# {tl.get('run') or 'model'}", "",
             "Every figure below is the metadata's, and each is a line of the run's signed journal, replayed "
             "(`trainledger verify-bom README.md --pubkey KEY` checks them).", "", "| figure | value |", "|---|---|"]
    for k, v in tl.items():
        if k not in ("run", "proof", "hyperparameters"):
            lines.append(f"| {k} | {as_text(v)} |")
    for k, v in (tl.get("hyperparameters") or {}).items():
        lines.append(f"| hyperparameter {k} | {as_text(v)} |")
    for r in (meta.get("model-index") or [{}])[0].get("results", []):
        m = r["metrics"][0]
        lines.append(f"| {m['type']} ({r['dataset']['name']}) | {as_text(m['value'])} |")
    return "\n".join(lines) + "\n"


def split_card(text: str) -> tuple[dict[str, Any], str]:
    """A card this module wrote: (metadata, body). ``ValueError`` for one whose metadata is not JSON-form YAML
    between ``---`` lines."""
    if not text.startswith("---\n"):
        raise ValueError("no metadata block (a card opens with '---')")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ValueError("the metadata block is not closed ('---')")
    meta = json.loads(text[4:end])
    if not isinstance(meta, dict):
        raise ValueError("the metadata is not a mapping")
    return meta, text[end + 5:]


def build(c: Collected, fmt: str, *, version: str) -> tuple[bytes, list[dict[str, str]]]:
    """The document ``fmt`` of the run ``c``, as bytes, and its links."""
    d = _Doc(c)
    if fmt == "cyclonedx":
        data = json.dumps(_cyclonedx(d, version), indent=2, ensure_ascii=False) + "\n"
    elif fmt == "spdx":
        data = json.dumps(_spdx(d, version), indent=2, ensure_ascii=False) + "\n"
    elif fmt == "intoto-eval":
        data = json.dumps(_intoto(d, version), indent=2, ensure_ascii=False) + "\n"
    elif fmt == "hf-card":
        meta, body = _card(d, version)
        data = "---\n" + json.dumps(meta, indent=2, ensure_ascii=False) + "\n---\n" + body
    else:
        raise ValueError(f"a format {fmt!r} not among {', '.join(FORMATS)}")
    return data.encode(), d.links
