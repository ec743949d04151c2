"""The experiment manifest: what a run is, frozen before it starts (seed document 001).

An :class:`ExperimentManifest` names the question (hypothesis, baseline,
intervention, disconfirmation, stop rules), the exact artifacts by content
digest, the data recipe and splits, the objective, optimizer and schedule,
batch semantics, every precision and sharding choice, the environment, the
checkpoint plan, the budget, the evaluation hooks with their selection rule,
the owners and who must approve. It loads from TOML, YAML or JSON.

Its **identity** is ``sha256:`` + the SHA-256 of its canonical encoding
(compact JSON, keys sorted, defaults omitted) with the ``label`` left out:
any change is a new identity, a new label is not. ``run_opened`` records it.

:func:`validate` returns findings (code, field path, message, severity):
schema problems, the effective-batch arithmetic, warm-up anchoring, the
checkpoint contract, secrets and absolute paths, and the config digest.
Torch-free: ``trainledger manifest validate`` runs on an auditor's machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import stat
import sys
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import msgspec

from trainledger.journal.errors import UsageError
from trainledger.training.kinds import CHECKPOINT_CONTRACT

__all__ = ["ExperimentManifest", "Finding", "ManifestError", "load_manifest", "parse_manifest", "validate",
           "manifest_identity", "config_digest", "file_digest", "DTYPES"]

Digest = Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}$")]
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8")


class _S(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    pass


class Futility(_S, kw_only=True):
    """The preregistered futility rule: by ``by_update``, the hook's metric must be at most ``threshold``."""

    hook: str
    metric: str
    threshold: float
    by_update: int


class Question(_S, kw_only=True):
    hypothesis: str
    baseline: str
    intervention: str
    disconfirmation: str
    alternative_explanations: list[str] = []
    stop_rules: list[str]
    futility: Futility | None = None


class Artifacts(_S, kw_only=True):
    """The exact base tuple, by content digest."""

    base_weights: Digest | None = None  # None: trained from scratch (say so in the hypothesis)
    config: Digest
    tokenizer: Digest
    template: Digest
    runtime: Digest


class DataArtifact(_S, kw_only=True):
    name: str
    split: str
    digest: Digest
    ref: str  # relative to the data root, or an approved reference (s3://..., hf://...)
    protected: bool = False  # training may never read it (evaluation hooks may)


class Data(_S, kw_only=True):
    recipe: Digest
    artifacts: list[DataArtifact]
    sampler: str = "random-windows"


class Objective(_S, kw_only=True):
    loss: str
    supervised_tokens: Literal["all", "completion", "assistant"]
    trainable: list[str] = msgspec.field(default_factory=lambda: ["*"])  # parameter-name prefixes that must receive gradients; "*" is all


class Optimization(_S, kw_only=True):
    optimizer: str
    lr: float
    weight_decay: float
    scheduler: str
    planned_updates: int
    clip_grad_norm: float | None = None
    warmup_updates: int | None = None
    warmup_fraction: float | None = None
    warmup_fraction_of: int | None = None  # the planned update count the fraction is of


class Batch(_S, kw_only=True):
    microbatch_per_device: int
    data_parallel: int
    accumulation: int
    effective_global_batch: int
    seq_len: int
    packing: bool = False
    truncation: Literal["left", "right"] = "right"


class Precision(_S, kw_only=True):
    param_dtype: str
    grad_dtype: str
    optimizer_dtype: str
    activation_dtype: str
    reduction_dtype: str
    accumulation_dtype: str
    loss_scaling: str
    sharding: str
    offload: str
    state_dict_format: str


class Environment(_S, kw_only=True):
    code: str
    dependencies: Digest
    environment: Digest
    seeds: dict[str, int]
    hardware_class: str
    topology: str


class CheckpointPlan(_S, kw_only=True):
    every_updates: int
    contents: list[str]
    keep_last: int
    recovery: str


class Budget(_S, kw_only=True):
    max_wall_s: float | None = None
    max_tokens: int | None = None
    max_memory_bytes: int | None = None


class EvalHook(_S, kw_only=True):
    name: str
    role: Literal["target", "retention", "control"]
    split: str
    suite: Digest
    metric: str = "loss"
    every_updates: int
    forbidden_regression: float | None = None  # largest allowed rise of the metric over its first value


class Evaluation(_S, kw_only=True):
    hooks: list[EvalHook]
    selection_rule: str  # "min:<hook>.<metric>" or "max:<hook>.<metric>"


class Authority(_S, kw_only=True):
    experiment_owner: str
    approvers: list[str]
    owners: list[str] = []


class PreflightPlan(_S, kw_only=True):
    overfit_steps: int = 40
    overfit_min_drop: float = 0.5  # the loss must fall by at least this fraction on the disposable subset
    resume_boundary: int = 8
    resume_steps: int = 16
    probe_batches: list[int] = msgspec.field(default_factory=lambda: [1, 4])
    probe_seq_lens: list[int] = []


class ExperimentManifest(_S, kw_only=True):
    label: str = ""
    question: Question
    model: dict[str, Any]
    artifacts: Artifacts
    data: Data
    objective: Objective
    optimization: Optimization
    batch: Batch
    precision: Precision
    environment: Environment
    checkpoint: CheckpointPlan
    budget: Budget
    evaluation: Evaluation
    authority: Authority
    preflight: PreflightPlan = msgspec.field(default_factory=PreflightPlan)

    @property
    def identity(self) -> str:
        return manifest_identity(self)

    def warmup(self) -> int:
        """Warm-up in updates: stated, or the stated fraction of the stated update count (never recomputed)."""
        o = self.optimization
        if o.warmup_updates is not None:
            return o.warmup_updates
        if o.warmup_fraction is not None and o.warmup_fraction_of is not None:
            return round(o.warmup_fraction * o.warmup_fraction_of)
        return 0

    def artifact(self, name: str) -> DataArtifact:
        for a in self.data.artifacts:
            if a.name == name:
                return a
        raise KeyError(name)


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    path: str
    message: str
    severity: str = "error"  # error | warning

    def line(self) -> str:
        return f"{self.severity.upper():<7} {self.path}: {self.code}: {self.message}"


class ManifestError(UsageError):
    """A manifest that cannot be used: ``findings`` says why."""

    def __init__(self, message: str, findings: list[Finding]):
        super().__init__(message)
        self.findings = findings


def _canonical(obj: Any) -> bytes:
    return msgspec.json.encode(obj, order="sorted")


def manifest_identity(m: ExperimentManifest) -> str:
    """``sha256:`` + SHA-256 of the canonical encoding, the label left out."""
    return "sha256:" + hashlib.sha256(_canonical(msgspec.structs.replace(m, label=""))).hexdigest()


def config_digest(model: dict[str, Any]) -> str:
    """The digest a manifest's ``artifacts.config`` must carry for its ``model`` section."""
    return "sha256:" + hashlib.sha256(_canonical(model)).hexdigest()


def file_digest(path: str | Path) -> str:
    from trainledger.journal.paths import file_sha256

    return "sha256:" + file_sha256(path)[0]


# -- loading --------------------------------------------------------------------------------------------------


#: A manifest is a page of settings; anything larger (or deeper) is refused before it is parsed further.
MAX_MANIFEST_BYTES = 1 << 20
MAX_MANIFEST_DEPTH = 32


def _yaml_loader():
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        """safe_load without anchors' aliases: ``*name`` can multiply a 1 KB file into gigabytes (billion
        laughs), and a manifest has no use for them."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a manifest", mark)
            return super().compose_node(parent, index)

    return NoAliasLoader


def _check_depth(raw: Any, path: Path) -> None:
    stack = [(raw, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_MANIFEST_DEPTH:
            raise ManifestError(f"{path}: nested deeper than {MAX_MANIFEST_DEPTH} levels",
                                [Finding("E_PARSE", "$", f"nested deeper than {MAX_MANIFEST_DEPTH} levels")])
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]


def _read_raw(path: Path) -> Any:
    raw = _parse_raw(path)
    _check_depth(raw, path)
    return raw


def _parse_raw(path: Path) -> Any:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: not a regular file")
        if st.st_size > MAX_MANIFEST_BYTES:
            raise UsageError(f"{path}: {st.st_size:,} bytes: a manifest is at most {MAX_MANIFEST_BYTES:,}")
        with open(path, "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    if len(text) > MAX_MANIFEST_BYTES:
        raise UsageError(f"{path}: a manifest is at most {MAX_MANIFEST_BYTES:,} bytes")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - Python 3.10
                import tomli as tomllib
            return tomllib.loads(text.decode("utf-8"))
        if suffix in (".yaml", ".yml"):
            import yaml

            return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader without aliases
        if suffix == ".json":
            return json.loads(text)
    except Exception as e:  # noqa: BLE001 - every parser's error is a user mistake here: one line
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ManifestError(f"{path}: not valid {suffix[1:].upper()}: {first}",
                            [Finding("E_PARSE", "$", first)]) from None
    raise UsageError(f"{path}: unknown manifest format {suffix or '(no extension)'}: use .toml, .yaml or .json")


def _walk(raw: Any, info: Any, path: str, out: list[Finding]) -> None:
    """Every missing required field and every unknown field under ``info``, not only the first."""
    I = msgspec.inspect  # noqa: N806
    if isinstance(info, I.UnionType):
        info = next((t for t in info.types if not isinstance(t, I.NoneType)), info)
    if isinstance(info, I.StructType):
        if not isinstance(raw, dict):
            return  # the typed conversion names it
        names = {f.encode_name: f for f in info.fields}
        for key in raw:
            if key not in names:
                out.append(Finding("E_UNKNOWN_FIELD", f"{path}.{key}" if path else key,
                                   f"not a manifest field (known here: {', '.join(sorted(names))})"))
        for name, f in names.items():
            p = f"{path}.{name}" if path else name
            if name not in raw:
                if f.required:
                    out.append(Finding("E_MISSING", p, "required field is missing"))
            else:
                _walk(raw[name], f.type, p, out)
    elif isinstance(info, (I.ListType, I.TupleType)) and isinstance(raw, list):
        item = getattr(info, "item_type", None)
        if item is not None:
            for i, v in enumerate(raw):
                _walk(v, item, f"{path}[{i}]", out)


def parse_manifest(raw: Any) -> tuple[ExperimentManifest | None, list[Finding]]:
    """Typed manifest and schema findings from already-parsed data (a dict)."""
    if not isinstance(raw, dict):
        return None, [Finding("E_SCHEMA", "$", f"a manifest is a table/object, not {type(raw).__name__}")]
    findings: list[Finding] = []
    _walk(raw, msgspec.inspect.type_info(ExperimentManifest), "", findings)
    if findings:
        return None, findings
    try:
        return msgspec.convert(raw, ExperimentManifest, strict=False), []
    except msgspec.ValidationError as e:
        msg = str(e)
        m = re.search(r" - at `\$\.?([^`]*)`$", msg)
        where = m.group(1) if m else "$"
        what = msg[: m.start()] if m else msg
        if "sha256:" in what or "pattern" in what:
            what += " (a content digest: sha256: and 64 lowercase hex digits)"
        return None, [Finding("E_TYPE", where or "$", what)]


def load_manifest(path: str | Path) -> ExperimentManifest:
    """Load and validate; raise :class:`ManifestError` (with every finding) if any finding is an error."""
    m, findings = load_findings(path)
    errors = [f for f in findings if f.severity == "error"]
    if m is None or errors:
        first = errors[0] if errors else findings[0]
        raise ManifestError(f"{path}: {len(errors)} error(s) in the manifest, first: {first.path}: {first.message}",
                            findings)
    return m


def load_findings(path: str | Path) -> tuple[ExperimentManifest | None, list[Finding]]:
    """What ``trainledger manifest validate`` prints: the typed manifest (if it parses) and every finding."""
    raw = _read_raw(Path(path))
    m, findings = parse_manifest(raw)
    if m is None:
        return None, findings + _lint(raw)
    return m, validate(m, raw=raw)


# -- validation -----------------------------------------------------------------------------------------------

_SECRET_VALUE = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key id"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "a GitHub token"),
    (re.compile(r"\b(sk|hf|xox[abp])[-_][A-Za-z0-9_-]{16,}"), "an API token"),
    (re.compile(r"(?i)\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)\s*[:=]\s*\S+"),
     "a credential assignment"),
    (re.compile(r"://[^/\s:@]+:[^/\s@]+@"), "credentials in a URL"),
]
_SECRET_KEY = re.compile(r"(?i)^(.*[_-])?(password|passwd|secret|api[_-]?key|token|access[_-]?key|credentials?|"
                         r"private[_-]?key)$")
_ABS_PATH = re.compile(r"^(/|~(/|$)|[A-Za-z]:[\\/]|\\\\)")


def _strings(raw: Any, path: str = ""):
    if isinstance(raw, dict):
        for k, v in raw.items():
            p = f"{path}.{k}" if path else str(k)
            yield p, str(k), None
            yield from _strings(v, p)
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(raw, str):
        yield path, None, raw


def scrub(raw: Any) -> Any:
    """A copy of ``raw`` (dicts, lists, scalars) safe to journal, by the linter's rules: a field named like a
    credential, or a value that looks like one, becomes ``"<redacted>"``; an absolute path keeps its last part
    (``"<abs>/checkpoint-10"``)."""
    if isinstance(raw, dict):
        return {str(k): "<redacted>" if _SECRET_KEY.search(str(k)) and v not in (None, "", [], {}) else scrub(v)
                for k, v in raw.items()}
    if isinstance(raw, (list, tuple)):
        return [scrub(v) for v in raw]
    if isinstance(raw, str):
        if any(rx.search(raw) for rx, _ in _SECRET_VALUE):
            return "<redacted>"
        if _ABS_PATH.match(raw) and " " not in raw.strip():
            return "<abs>/" + raw.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        return raw
    if raw is None or isinstance(raw, (bool, int, float)):
        return raw
    return str(raw)


def _lint(raw: Any) -> list[Finding]:
    """Secrets and unrestricted absolute paths anywhere in the manifest."""
    out: list[Finding] = []
    for path, key, value in _strings(raw):
        if key is not None:
            if _SECRET_KEY.search(key):
                out.append(Finding("E_SECRET", path, f"a field named {key!r} looks like a credential: a manifest "
                                                     "carries content digests and approved references, never secrets"))
            continue
        for rx, what in _SECRET_VALUE:
            if rx.search(value):
                out.append(Finding("E_SECRET", path, f"the value looks like {what}: remove it (secrets belong in "
                                                     "the platform's secret store, not in the manifest)"))
                break
        if _ABS_PATH.match(value) and " " not in value.strip():
            out.append(Finding("E_ABSOLUTE_PATH", path, f"{value!r} is an unrestricted absolute path: use a content "
                                                        "digest, a path relative to the data root, or an approved "
                                                        "reference (s3://, gs://, hf://)"))
    return out


def validate(m: ExperimentManifest, *, raw: Any = None) -> list[Finding]:
    """Every finding about a parsed manifest (schema findings come from :func:`parse_manifest`)."""
    out: list[Finding] = []
    b = m.batch
    for name in ("microbatch_per_device", "data_parallel", "accumulation", "effective_global_batch", "seq_len"):
        if getattr(b, name) < 1:
            out.append(Finding("E_RANGE", f"batch.{name}", f"must be at least 1, got {getattr(b, name)}"))
    implied = b.microbatch_per_device * b.data_parallel * b.accumulation
    if implied != b.effective_global_batch:
        out.append(Finding(
            "E_EFFECTIVE_BATCH", "batch.effective_global_batch",
            f"microbatch {b.microbatch_per_device} x {b.data_parallel} data-parallel devices x {b.accumulation} "
            f"accumulation steps = {implied} examples per update, but {b.effective_global_batch} is declared; a "
            f"schedule in updates would see {implied / b.effective_global_batch:g}x the examples and tokens: "
            "reconcile the batch and the schedule"))
    o = m.optimization
    if o.planned_updates < 1:
        out.append(Finding("E_RANGE", "optimization.planned_updates", f"must be at least 1, got {o.planned_updates}"))
    if o.warmup_updates is None and o.warmup_fraction is None:
        out.append(Finding("E_WARMUP_MISSING", "optimization", "state warm-up: warmup_updates (0 for none), or "
                                                              "warmup_fraction with warmup_fraction_of"))
    if o.warmup_fraction is not None:
        if not 0 <= o.warmup_fraction <= 1:
            out.append(Finding("E_RANGE", "optimization.warmup_fraction", f"must be in [0, 1], got {o.warmup_fraction}"))
        if o.warmup_fraction_of is None:
            out.append(Finding("E_WARMUP_UNANCHORED", "optimization.warmup_fraction_of",
                               f"warm-up is {o.warmup_fraction:g} of what? Name the planned update count it is a "
                               "fraction of (a resumed or shortened run must not recompute it)"))
        elif 0 <= o.warmup_fraction <= 1:  # out of range (or NaN, or infinite) is named above: no count follows
            w = round(o.warmup_fraction * o.warmup_fraction_of)
            if o.warmup_updates is not None and o.warmup_updates != w:
                out.append(Finding("E_WARMUP_CONFLICT", "optimization.warmup_updates",
                                   f"{o.warmup_updates} updates stated, but {o.warmup_fraction:g} of "
                                   f"{o.warmup_fraction_of} is {w}"))
            if o.warmup_fraction_of != o.planned_updates:
                out.append(Finding("W_WARMUP_ANCHOR", "optimization.warmup_fraction_of",
                                   f"warm-up stays {w} updates ({o.warmup_fraction:g} of {o.warmup_fraction_of}); "
                                   f"it is not recomputed for the {o.planned_updates} updates now planned",
                                   "warning"))
    c = m.checkpoint
    missing = [x for x in CHECKPOINT_CONTRACT if x not in c.contents]
    if missing:
        out.append(Finding("E_CHECKPOINT_CONTRACT", "checkpoint.contents",
                           f"missing {', '.join(missing)}: a resume from such a checkpoint is "
                           "resume-invalid-missing-state (weights alone are not a resume)"))
    for name in ("every_updates", "keep_last"):
        if getattr(c, name) < 1:
            out.append(Finding("E_RANGE", f"checkpoint.{name}", f"must be at least 1, got {getattr(c, name)}"))
    p = m.precision
    for f in ("param_dtype", "grad_dtype", "optimizer_dtype", "activation_dtype", "reduction_dtype",
              "accumulation_dtype"):
        v = getattr(p, f)
        if v not in DTYPES:
            out.append(Finding("E_DTYPE", f"precision.{f}", f"{v!r} is not a dtype ({', '.join(DTYPES)})"))
    for f in ("loss_scaling", "sharding", "offload", "state_dict_format"):
        if not getattr(p, f).strip():
            out.append(Finding("E_MISSING", f"precision.{f}", "state it explicitly (\"none\" where there is none)"))
    if config_digest(m.model) != m.artifacts.config:
        out.append(Finding("E_CONFIG_DIGEST", "artifacts.config",
                           f"does not match the model section: its digest is {config_digest(m.model)}"))
    names = [a.name for a in m.data.artifacts]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        out.append(Finding("E_DUPLICATE", "data.artifacts", f"two artifacts are named {dup!r}"))
    splits = {a.split for a in m.data.artifacts}
    if "train" not in splits:
        out.append(Finding("E_DATA", "data.artifacts", "no artifact in split 'train'"))
    for i, a in enumerate(m.data.artifacts):
        parts = PurePosixPath(a.ref.replace("\\", "/")).parts
        if ".." in parts or _ABS_PATH.match(a.ref) or "\0" in a.ref:
            out.append(Finding("E_UNSAFE_REF", f"data.artifacts[{i}].ref",
                               f"{a.ref!r} leads outside the data root: refs are paths inside it, without '..'"))
        if a.split == "train" and a.protected:
            out.append(Finding("E_PROTECTED_TRAINING", f"data.artifacts[{i}]",
                               f"{a.name!r} is protected but in the training split: training may not read it"))
    hook_names = [h.name for h in m.evaluation.hooks]
    for i, h in enumerate(m.evaluation.hooks):
        if h.split not in splits:
            out.append(Finding("E_HOOK", f"evaluation.hooks[{i}].split", f"no data artifact in split {h.split!r}"))
        elif h.suite not in {a.digest for a in m.data.artifacts if a.split == h.split}:
            out.append(Finding("E_HOOK", f"evaluation.hooks[{i}].suite",
                               f"the suite digest is not an artifact of split {h.split!r}"))
        if h.split == "train":
            out.append(Finding("E_HOOK", f"evaluation.hooks[{i}].split", "evaluations may not use the training split"))
        if h.every_updates < 1:
            out.append(Finding("E_RANGE", f"evaluation.hooks[{i}].every_updates", "must be at least 1"))
        elif c.every_updates >= 1 and h.every_updates % c.every_updates:
            out.append(Finding("E_HOOK", f"evaluation.hooks[{i}].every_updates",
                               f"{h.every_updates} is not a multiple of checkpoint.every_updates "
                               f"({c.every_updates}): every evaluation is bound to a checkpoint"))
    rule = re.fullmatch(r"(min|max):([\w-]+)\.(\w+)", m.evaluation.selection_rule)
    if rule is None or rule.group(2) not in hook_names:
        out.append(Finding("E_SELECTION_RULE", "evaluation.selection_rule",
                           f"{m.evaluation.selection_rule!r}: write min:<hook>.<metric> or max:<hook>.<metric> "
                           f"naming a hook ({', '.join(hook_names) or 'none defined'}); never the training loss"))
    fut = m.question.futility
    if fut is not None and fut.hook not in hook_names:
        out.append(Finding("E_FUTILITY", "question.futility.hook", f"no evaluation hook named {fut.hook!r}"))
    if not m.authority.approvers:
        out.append(Finding("E_AUTHORITY", "authority.approvers", "name who must approve the experiment"))
    out += _lint(raw if raw is not None else msgspec.to_builtins(m))
    return out
