// trainledger serve: the page. Every string from a journal is put into the page as text (textContent), never as
// markup. Tests read window.__trainledger (the charts' data, the state, the version drawn).
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  // the curves every step records, then every metric a logging call reported (by name, "m:" + name)
  const METRICS = ["loss", "grad_norm", "lr", "mfu", "tokens_per_s"];
  // logged metrics charted at most (the others found through the search box)
  const MAX_PANELS = 36;
  // Okabe and Ito's colour-blind-safe eight (the yellow darkened to read on white), then Paul Tol's muted set:
  // sixteen colours that stay apart for every common colour-vision deficiency
  const COLORS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#b8a800",
                  "#332288", "#88ccee", "#44aa99", "#117733", "#999933", "#cc6677", "#882255", "#aa4499"];
  // each curve's axis title with its unit, how its values are shown, and whether a log axis is offered
  const AXES = {loss: {title: "loss (nats)", scale: 1, head: "Loss"},
                grad_norm: {title: "gradient norm (L2)", scale: 1, head: "Gradient norm"},
                lr: {title: "learning rate", scale: 1, head: "Learning rate"},
                mfu: {title: "MFU (%)", scale: 100, head: "MFU"},
                tokens_per_s: {title: "tokens / s", scale: 1, head: "Tokens/s"}};
  const axisOf = key => AXES[key] || {title: key.slice(2), scale: 1, head: key.slice(2)};
  // zoom: null, or the visible x range [lo, hi] in the x axis's units, fetched again at full resolution
  // smoothing on by default (TensorBoard's 0.6), over the raw curve drawn faintly; the y range robust by default
  const VIEW = {smoothing: 0.6, x: "step", zoom: null, robust: true, search: "", log: {}};
  // the logged metrics' names ([name, points]) of the runs shown, and the chart panels made, by key
  const LOGGED = {names: [], leftOut: 0, key: null};
  const PANELS = new Map();
  // colours fixed for the page's life: a run's by its place in the folder's list, a curve's within a run by the
  // order its rank, rung or segment was first drawn (the whole run comes first, so a zoom keeps them)
  const SUBCOLOURS = new Map();
  const X_TITLES = {step: "step", tokens: "tokens processed", time: "wall time (s)"};
  const BODIES = {};
  const LAST = {marks: null};  // the marks the curves were drawn with
  const FETCHED = {};  // each chart's request, as last fetched
  // a folder of runs: the run the panels show (RUN), and the runs the charts overlay (SELECTED), by name
  const RUNS = {list: [], focus: null, selected: new Set(), chosen: false, cursor: null};
  const MARK_COLORS = {anomaly_detected: "#cf222e", spike_suspected: "#fb8500", rewind_decided: "#8250df",
                       run_resumed: "#0969da", checkpoint_saved: "#1a7f37", shards_saved: "#1a7f37",
                       device_changed: "#953800", run_stopped: "#1b1f24", straggler_detected: "#bf8700",
                       weights_restored: "#8250df", replay_difference: "#ff0000"};
  // each chart's cursors, by run, as its last answer gave them; the runs' data versions then; points added since
  const CURSORS = {};
  const T = window.__trainledger = {charts: {}, data: {}, state: null, version: -1, drawn: 0, errors: [], bytes: 0,
                                    first: null, appended: 0};

  function url(path, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {  // a list is the parameter repeated (run=A&run=B)
      if (Array.isArray(v)) for (const x of v) q.append(k, x); else q.set(k, v);
    }
    if (RUNS.focus !== null && !q.has("run") && path !== "api/runs" && path !== "api/stream") q.set("run", RUNS.focus);
    if (token) q.set("token", token);
    const s = q.toString();
    return path + (s ? "?" + s : "");
  }
  async function get(path, params) {
    const r = await fetch(url(path, params), {cache: "no-store"});
    const text = await r.text();
    T.bytes += text.length;  // what the page has fetched (tools/bench_serve.py reads it)
    const body = JSON.parse(text);
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function row(table, cells, head) {
    const tr = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement(head ? "th" : "td");
      if (c instanceof Node) td.appendChild(c); else td.textContent = c === null || c === undefined ? "" : String(c);
      tr.appendChild(td);
    }
    table.appendChild(tr);
    return tr;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(5);
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function axisLabel(v) {
    if (v === null || v === undefined) return "";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toPrecision(3) + "G";
    if (a >= 1e6) return (v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return (v / 1e3).toPrecision(3) + "k";
    if (a > 0 && a < 1e-3) return (+v.toPrecision(3)).toExponential();  // 2e-4, 1.25e-5: short, never 0.0000
    return String(+v.toPrecision(4));
  }
  function logSplits(u, axisIdx, min, max) {
    // ticks a log axis can label without piling up: 1, 2 and 5 times each power of ten where they fit (a label
    // needs about 18 px), else each power of ten, else every k-th; within one decade, each multiple of its power
    const out = [];
    if (!(min > 0) || !(max > 0)) return out;
    const room = Math.max(2, Math.floor(((u && u.bbox ? u.bbox.height / devicePixelRatio : 180)) / 18));
    const e0 = Math.floor(Math.log10(min)), e1 = Math.ceil(Math.log10(max)), decades = Math.max(1, e1 - e0);
    const mults = 3 * decades <= room ? [1, 2, 5] : [1];
    const step = mults.length === 1 ? Math.max(1, Math.ceil(decades / room)) : 1;
    for (let e = e0; e <= e1; e++) {
      if ((e - e0) % step) continue;
      for (const m of mults) { const v = m * Math.pow(10, e); if (v >= min && v <= max) out.push(v); }
    }
    if (out.length < 2) {
      // a range inside one decade: its multiples of the power of ten below, thinned to fit
      out.length = 0;
      const p = Math.pow(10, Math.floor(Math.log10(max - min || max)));
      const n = Math.ceil((max - min) / p) + 1, k = Math.max(1, Math.ceil(n / room));
      for (let v = Math.ceil(min / (p * k)) * p * k; v <= max; v += p * k) out.push(+v.toPrecision(6));
    }
    return out;
  }
  function robustRange(parts, log) {
    // the y range without the outliers: a point far from the median of its 11 neighbours (over 8 times the
    // curve's typical distance from it, and over a quarter of the span of its middle 90%) is left out, unless more
    // than 2% of a curve's points are (then they are the curve, not outliers). A curve's trend (a high start)
    // stays in range; a lone spike does not
    let lo = Infinity, hi = -Infinity, all = Infinity, allHi = -Infinity;
    const tf = log ? (v => v > 0 ? Math.log10(v) : null) : (v => v);
    for (const s of parts) {
      const ys = s.y.map(v => v === null ? null : tf(v)).filter(v => v !== null && isFinite(v));
      for (const v of ys) { if (v < all) all = v; if (v > allHi) allHi = v; }
      const n = ys.length, res = new Array(n);
      for (let i = 0; i < n; i++) {  // the 11 around it (the first or last 11 at the ends)
        const a = Math.max(0, Math.min(i - 5, n - 11));
        const w = ys.slice(a, a + 11).sort((p, q) => p - q);
        res[i] = ys[i] - w[w.length >> 1];
      }
      const mad = res.map(Math.abs).sort((a, b) => a - b)[n >> 1] || 0;
      // and far against the curve's own spread (its 5th to 95th percentile): a ramp's end or a bend is never one
      const sorted = ys.slice().sort((a, b) => a - b);
      const spread = n ? sorted[Math.floor(0.95 * (n - 1))] - sorted[Math.floor(0.05 * (n - 1))] : 0;
      const limit = Math.max(8 * 1.4826 * mad, 0.25 * spread, 1e-300);
      const out = res.filter(r => Math.abs(r) > limit).length;
      for (let i = 0; i < n; i++) {
        if (out <= 0.02 * n && Math.abs(res[i]) > limit) continue;
        if (ys[i] < lo) lo = ys[i]; if (ys[i] > hi) hi = ys[i];
      }
    }
    if (!isFinite(lo)) return null;
    const clipped = lo > all || hi < allHi;
    const pad = 0.05 * (hi - lo || Math.abs(hi) || 1);
    lo -= pad; hi += pad;
    if (!log && all >= 0 && lo < 0) lo = 0;
    return {lo: log ? Math.pow(10, lo) : lo, hi: log ? Math.pow(10, hi) : hi, clipped: clipped};
  }
  function ema(ys, w) {
    // TensorBoard's smoothing: an exponential moving average, debiased at the start; gaps stay gaps
    const out = new Array(ys.length).fill(null);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const v = ys[i];
      if (v === null || v === undefined || !isFinite(v)) continue;
      last = last * w + (1 - w) * v; n += 1;
      out[i] = last / (1 - Math.pow(w, n));
    }
    return out;
  }
  function collapsible(text, limit) {
    // a long value (a fit's parameters, a verdict's JSON) folds into one line the reader opens
    if (text.length <= (limit || 90)) return text;
    const d = document.createElement("details");
    d.appendChild(el("summary", text.slice(0, (limit || 90) - 3) + "..."));
    d.appendChild(el("div", text, "folded"));
    return d;
  }
  function openButton(rank, seq, label) {
    const b = el("button", label || ("seq " + seq), "open");
    b.type = "button";
    b.addEventListener("click", () => openEvent(rank, seq));
    return b;
  }

  function shade(hex, k, count) {
    // the k-th of count shades of a run's colour (its ranks or rungs): from the colour itself to a little over half
    // way to white, evenly, so that each member of the family has its own (past 12, they repeat)
    const m = Math.min(Math.max(count || 1, 1), 12);
    const t = m > 1 ? 0.55 * (k % m) / (m - 1) : 0, n = parseInt(hex.slice(1), 16);
    const c = [n >> 16, (n >> 8) & 255, n & 255].map(v => Math.round(v + (255 - v) * t));
    return "#" + c.map(v => v.toString(16).padStart(2, "0")).join("");
  }

  function runFilter() {
    // the filter box: key=value (a setting or configuration value, "config." optional), /regex/ or text in the name
    const q = document.getElementById("runs-filter").value.trim();
    if (!q) return () => true;
    const eq = q.indexOf("=");
    if (eq > 0 && !q.startsWith("/")) {
      const k = q.slice(0, eq).trim(), v = q.slice(eq + 1).trim();
      return r => { const st = r.settings || {};
                    const got = k in st ? st[k] : st["config." + k];
                    return got !== undefined && (typeof got === "number" ? got === Number(v) : fmt(got) === v); };
    }
    let re = null;
    if (q.length > 2 && q.startsWith("/") && q.endsWith("/")) { try { re = new RegExp(q.slice(1, -1), "i"); } catch (e) { re = null; } }
    return re ? r => re.test(r.name) : r => r.name.toLowerCase().includes(q.toLowerCase());
  }

  function drawCompare(runs) {
    // the runs ticked side by side: what differs between them (settings, configuration), their steps and losses
    const box = document.getElementById("compare-box"), t = document.getElementById("compare");
    const picked = runs.filter(r => !r.fail && RUNS.selected.has(r.name)).slice(0, 8);
    box.hidden = picked.length < 2;
    t.replaceChildren();
    if (picked.length < 2) return;
    document.getElementById("compare-title").textContent = picked.length === 2
      ? "Compare " + picked[0].name + " and " + picked[1].name : "Compare the " + picked.length + " runs ticked";
    const keys = [...new Set(picked.flatMap(r => Object.keys(r.settings || {})))].sort();
    const differ = keys.filter(k => new Set(picked.map(r => JSON.stringify((r.settings || {})[k]))).size > 1);
    row(t, ["", ...picked.map(r => r.name)], true);
    for (const [label, f] of [["steps", r => r.steps], ["final loss", r => fmt(r.final_loss)],
                              ["best loss", r => fmt(r.best_loss)], ["status", r => r.status]]) row(t, [label, ...picked.map(f)]);
    for (const k of differ) {
      const tr = row(t, [k, ...picked.map(r => fmt((r.settings || {})[k]))]);
      tr.querySelectorAll("td").forEach((td, i) => { if (i) td.className = "differs"; });
    }
    if (!differ.length) row(t, ["configuration", "the same in every run ticked"]);
    T.data.compare = {runs: picked.map(r => r.name), differ: differ};
  }

  function drawRuns(runs) {
    // the run table of a folder of runs: a FAIL row is listed and never drawn
    RUNS.list = runs;
    const box = document.getElementById("runs-box");
    box.hidden = runs.length <= 1;
    if (runs.length <= 1) return;
    // the runs the filter keeps: the ones "tick every run" ticks; a run ticked stays ticked while it verifies
    const keep = runFilter();
    const shown = runs.filter(keep);
    const ok = runs.filter(r => !r.fail && keep(r)).map(r => r.name);
    const good = runs.filter(r => !r.fail).map(r => r.name);
    document.getElementById("runs-shown").textContent = shown.length < runs.length
      ? shown.length + " of " + runs.length + " runs match" : runs.length + " runs";
    if (!RUNS.chosen) { RUNS.selected = new Set(ok.slice(0, 8)); }
    for (const n of Array.from(RUNS.selected)) if (!good.includes(n)) RUNS.selected.delete(n);
    if (RUNS.focus === null || !good.includes(RUNS.focus)) RUNS.focus = ok.length ? ok[0] : good.length ? good[0] : null;
    const t = document.getElementById("runs");
    t.replaceChildren();
    const differ = [...new Set(runs.flatMap(r => Object.keys(r.differs || {})))];
    const all = document.createElement("input");
    all.type = "checkbox"; all.title = "tick every run"; all.id = "runs-all";
    all.checked = ok.length > 0 && ok.every(n => RUNS.selected.has(n));
    all.addEventListener("change", () => {
      RUNS.chosen = true;
      RUNS.selected = new Set(all.checked ? ok : []);
      refresh();
    });
    row(t, [all, "run", "run id", "key", "status", "steps", "last seal", "final loss", "best loss"].concat(differ), true);
    for (const r of runs) {
      let tick = "";
      if (!r.fail) {
        tick = document.createElement("input");
        tick.type = "checkbox"; tick.checked = RUNS.selected.has(r.name);
        tick.addEventListener("change", () => {
          RUNS.chosen = true;
          if (tick.checked) RUNS.selected.add(r.name); else RUNS.selected.delete(r.name);
          refresh();
        });
      }
      const name = el("button", r.name, "open run-name" + (r.name === RUNS.focus ? " focus" : ""));
      name.type = "button";
      name.addEventListener("click", () => { if (!r.fail) { RUNS.focus = r.name; refresh(); } });
      const tr = row(t, [tick, name, r.run_id, r.key_id, r.fail ? "FAIL: " + r.fail : r.status, r.steps, r.last_seal,
                         fmt(r.final_loss), fmt(r.best_loss)].concat(differ.map(k => fmt((r.differs || {})[k]))));
      if (r.fail) tr.className = "fail-row";
      if (!keep(r)) tr.classList.add("filtered");
    }
    drawCompare(runs);
  }
  function runColour(run) {
    const i = RUNS.list.findIndex(r => r.name === run);
    return COLORS[(i < 0 ? 0 : i) % COLORS.length];
  }

  async function openEvent(rank, seq, run) {
    const params = {seq: seq};
    if (run !== null && run !== undefined) params.run = run;
    if (rank !== null && rank !== undefined) params.rank = rank;
    const box = document.getElementById("event");
    try {
      const ev = await get("api/event", params);
      document.getElementById("event-title").textContent =
        ev.kind + " at seq " + ev.seq + (ev.rank !== null ? " (rank " + ev.rank + ")" : "");
      document.getElementById("event-hash").textContent = "chain hash " + ev.h + "  in " + ev.file;
      document.getElementById("event-fields").textContent = ev.pretty;
      const a = document.getElementById("event-proof"), why = document.getElementById("event-noproof");
      a.hidden = !ev.provable;
      why.hidden = !!ev.provable;
      why.textContent = ev.provable ? "" : "a format " + ev.format_version + " journal has no tree heads in its seals: " +
        "no inclusion proof (format 1.3 and later have them)";
      a.href = url("api/proof", params);
      a.setAttribute("download", "proof-" + (ev.rank !== null ? "rank" + ev.rank + "-" : "") + "seq" + ev.seq + ".json");
      showPanel(true);
    } catch (e) {
      T.errors.push(String(e));
    }
  }
  function showPanel(open) {
    // the event panel takes its own column: the page narrows beside it (its seq buttons stay in view) and the
    // charts are drawn again at the narrower width
    const box = document.getElementById("event");
    if (box.hidden === !open) return;
    box.hidden = !open;
    document.body.classList.toggle("event-open", open);
    if (T.state && !T.state.fail) refresh();
  }
  document.getElementById("event-close").addEventListener("click", () => showPanel(false));
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") showPanel(false); });

  function showFail(line) {
    const f = document.getElementById("fail");
    f.textContent = line;
    f.hidden = false;
    document.getElementById("board").hidden = true;
    document.getElementById("status").textContent = "does not verify: nothing from it is shown";
    for (const k of Object.keys(T.charts)) { T.charts[k].destroy(); delete T.charts[k]; }
    T.data = {};
  }

  function drawState(s) {
    document.getElementById("path").textContent = s.path;
    if (s.fail) { showFail(s.fail); return; }
    document.getElementById("fail").hidden = true;
    document.getElementById("board").hidden = false;
    const js = document.getElementById("journals");
    js.replaceChildren();
    row(js, ["rank", "run id", "key", "trust", "signed events", "not signed yet", "last seal", "closed"], true);
    let unsigned = 0, signed = 0;
    for (const j of s.journals) {
      unsigned += j.unsigned; signed += j.signed;
      const tr = row(js, [j.rank === null ? "-" : j.rank, j.run_id, j.key_id, j.trust, j.signed,
                          j.unsigned ? j.unsigned + " (not signed yet)" : "0", j.last_seal_seq, j.closed ? "yes" : "no"]);
      if (j.unsigned) tr.className = "unsigned";
    }
    document.getElementById("status").textContent = "verified: " + signed + " signed events in " + s.journals.length +
      " journal(s)" + (unsigned ? "; " + unsigned + " events not signed yet, drawn apart" : "") +
      (s.server_error ? "; " + s.server_error : "");
    const ms = document.getElementById("marks");
    ms.replaceChildren();
    if (!s.marks.length) row(ms, ["nothing marked: no anomaly, checkpoint, resume or rewind"]);
    else row(ms, ["step", "rank", "what", ""], true);
    for (const m of s.marks.slice(-300)) row(ms, [m.step, m.rank === null ? "-" : m.rank, m.label, openButton(m.rank, m.seq)]);
    const ls = document.getElementById("listed");
    ls.replaceChildren();
    row(ls, ["kind", "rank", "rung", "what", ""], true);
    for (const x of s.listed) {
      const f = x.fields || {};
      let what = "";
      if (x.kind === "gate_verdict") what = (f.passed ? "GO" : "NO-GO") + ": " + fmt(f.reason);
      else if (x.kind === "decision_recorded") what = fmt(f.action_chosen);
      else if (x.kind === "scaling_fitted") what = "fit " + fmt(f.params) + (f.choice ? "; choice " + fmt(f.choice) : "");
      else if (x.kind === "run_stopped") what = fmt(f.rule) + ": " + fmt(f.reason);
      else if (x.kind === "straggler_detected") what = "rank " + fmt(f.rank) + " score " + fmt(f.score) +
        " steps " + fmt(f.window_start) + "-" + fmt(f.window_end);
      else what = fmt(f.reason || f.rung || "");
      row(ls, [x.kind, x.rank === null ? "-" : x.rank, fmt(f.rung), collapsible(what), openButton(x.rank, x.seq)]);
    }
    const rp = s.replay || {state: "waiting", detail: ""};
    const rd = document.getElementById("replay");
    rd.textContent = rp.detail;
    rd.className = rp.state === "differences" || rp.state === "failed" ? "fail" : "";
    const dt = document.getElementById("differences");
    dt.replaceChildren();
    if (rp.differences && rp.differences.length) {
      row(dt, ["seq", "rank", "what", "difference", ""], true);
      for (const d of rp.differences) row(dt, [d.seq, d.rank === null || d.rank === undefined ? "-" : d.rank, d.kind,
                                               d.detail, d.seq === null ? "" : openButton(d.rank, d.seq)]);
    }
    const nb = document.getElementById("notes-box"), nl = document.getElementById("notes");
    nl.replaceChildren();
    for (const n of s.notes) nl.appendChild(el("li", n));
    nb.hidden = !s.notes.length;
  }

  function chartData(series) {
    // one x axis, the union of every series' steps; a series has null where it has no point
    const xs = new Set();
    for (const s of series) for (const x of s.x) xs.add(x);
    const x = Array.from(xs).sort((a, b) => a - b);
    const at = new Map(x.map((v, i) => [v, i]));
    const data = [x], seqs = [null];
    for (const s of series) {
      const y = new Array(x.length).fill(null), q = new Array(x.length).fill(null);
      for (let i = 0; i < s.x.length; i++) { const k = at.get(s.x[i]); y[k] = s.y[i]; q[k] = s.seq[i]; }
      data.push(y); seqs.push(q);
    }
    return {data: data, seqs: seqs};
  }

  function colourKey(s, ranks) {
    // a curve's family member within its run: its rank in a run folder, else its rung (a ladder), else its segment
    return ranks > 1 ? "r" + s.rank : (s.rung ? "g" + s.rung : "s" + s.segment);
  }
  function subColour(run, sub) {
    // the index of a run's curve among its run's, in the order first drawn: kept for the page's life
    const k = (run || "") + "|" + sub;
    if (!SUBCOLOURS.has(k)) {
      let n = 0;
      for (const key of SUBCOLOURS.keys()) if (key.startsWith((run || "") + "|")) n += 1;
      SUBCOLOURS.set(k, n);
    }
    return SUBCOLOURS.get(k);
  }

  function drawChart(metric, body, marks) {
    BODIES[metric] = [body, marks];
    const panel = PANELS.get(metric);
    if (!panel) return;
    const box = panel.box;
    const axis = axisOf(metric), log = !!VIEW.log[metric], w = VIEW.smoothing;
    const shown = s => Object.assign({}, s, {y: s.y.map(v => v === null ? null : (log && !(v > 0) ? null : v * axis.scale))});
    const parts = body.series.map(s => Object.assign(shown(s), {unsigned: false}))
      .concat(body.unsigned.map(s => Object.assign(shown(s), {unsigned: true})));
    let rawMax = null;
    for (const s of parts) for (const v of s.y) if (v !== null && (rawMax === null || v > rawMax)) rawMax = v;
    const {data, seqs} = chartData(parts);
    const ranks = [...new Set(parts.map(s => s.rank))].length;
    const runs = [...new Set(parts.map(s => s.run || ""))];
    const many = RUNS.list.length > 1;
    // several runs: a colour family per run (fixed by its place in the folder), its ranks or rungs as shades; one
    // run: a colour per rank, rung or segment, in the order first drawn
    const colour = s => {
      if (s.unsigned) return "#9a6700";
      const k = subColour(s.run, colourKey(s, ranks));
      return many ? shade(runColour(s.run || ""), k, Math.max(k + 1, 4)) : COLORS[k % COLORS.length];
    };
    const name = s => ((runs.length > 1 || many ? (s.run || "") + " " : "") + (s.unsigned ? "not signed yet " : "") +
                       (s.rank !== null && s.rank !== undefined ? "rank " + s.rank + " " : "") +
                       (s.rung ? s.rung : (!s.unsigned && s.segment ? "segment " + s.segment : ""))).trim() || axis.head;
    // smoothing draws the moving average over the raw curve, which stays drawn (thin, faint): a spike is never
    // smoothed away, it stays in the raw band under the average
    const series = [{label: X_TITLES[body.x_axis || "step"]}];
    for (const s of parts) series.push({label: name(s), stroke: colour(s),
      alpha: w > 0 ? 0.3 : 1, dash: s.unsigned ? [4, 4] : undefined, spanGaps: true, width: w > 0 ? 1 : 1.25,
      points: {show: false}});
    if (w > 0) {
      parts.forEach((s, i) => {
        data.push(ema(data[i + 1], w));
        seqs.push(seqs[i + 1]);
        series.push({label: name(s) + " (smoothed)", stroke: colour(s), width: 2, spanGaps: true, points: {show: false}});
      });
    }
    const range = VIEW.robust ? robustRange(parts, log) : null;
    const yScale = Object.assign(log ? {distr: 3, log: 10} : {}, range ? {range: () => [range.lo, range.hi]} : {});
    if (T.first === null && parts.some(s => s.x.length)) T.first = performance.now();  // ms since the page opened
    T.data[metric] = {points: parts.reduce((n, s) => n + s.x.length, 0), series: parts.length,
                      unsigned: body.unsigned.reduce((n, s) => n + s.x.length, 0), smoothing: w, log: log,
                      rawMax: rawMax, title: axis.title, x: body.x_axis || "step", runs: runs.length,
                      zoom: VIEW.zoom ? VIEW.zoom.slice() : null, range: range ? [range.lo, range.hi] : null,
                      clipped: 0, colours: parts.map(s => [name(s), colour(s)])};
    const width = Math.max(300, box.clientWidth || 900);
    const opts = {
      width: width, height: metric === "loss" || metric === "grad_norm" ? 240 : 200,
      // zoomed: the axis shows the range asked for (the server sent every point in it, at most two a pixel)
      scales: {x: VIEW.zoom ? {time: false, range: () => VIEW.zoom.slice()} : {time: false}, y: yScale},
      // a drag selects a range of x: the curves are fetched again for it (no zoom into the coarse overview)
      cursor: {drag: {x: true, y: false, setScale: false}},
      axes: [{label: X_TITLES[body.x_axis || "step"], size: 44, values: (u, vals) => vals.map(axisLabel)},
             Object.assign({label: axis.title, size: 72, values: (u, vals) => vals.map(axisLabel)},
                           log ? {splits: logSplits, filter: (u, splits) => splits} : {})],
      series: series,
      // the values at the cursor are listed under the chart for every curve (hover), not in uPlot's legend
      legend: {show: false},
      hooks: {draw: [u => { drawMarks(u, marks, body.x_axis || "step"); drawClipped(u, parts, metric); }],
              setCursor: [u => hoverValues(u, panel.hover, parts, w > 0, metric)],
              setSelect: [u => {
        if (u.select.width < 3) return;
        const a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
        u.__dragged = true;
        u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
        zoomTo(a, b);
      }]},
    };
    if (T.charts[metric]) { T.charts[metric].destroy(); delete T.charts[metric]; }
    box.replaceChildren();
    panel.hover.replaceChildren();
    // an empty chart is not drawn: its panel is hidden (the loss's says why it is empty)
    panel.section.hidden = !parts.length && metric !== "loss";
    if (!parts.length) {
      box.appendChild(el("p", "nothing to draw yet", "legend"));
      return;
    }
    const u = new uPlot(opts, data, box);
    // the legend: each run's colour and name (several runs), else each curve's
    const lg = el("div", null, "compact-legend");
    const entries = runs.length > 1
      ? runs.map(r => [runColour(r), r + " (" + parts.filter(s => (s.run || "") === r).length + " lines)"])
      : parts.map(s => [colour(s), name(s)]);
    for (const [c, label] of entries.slice(0, 200)) {
      const e = el("span", null, "entry"), sw = el("span", null, "swatch");
      sw.style.background = c;
      e.appendChild(sw); e.appendChild(document.createTextNode(label));
      lg.appendChild(e);
    }
    box.appendChild(lg);
    T.data[metric].legend = parts.length > 24 ? "compact" : "full";
    u.__seqs = seqs; u.__parts = parts; u.__x = body.x_axis || "step";
    // a double-click shows the whole run; a click waits out a double-click's time before it opens an event
    let pending = null;
    u.over.addEventListener("dblclick", () => { clearTimeout(pending); pending = null; zoomTo(null); });
    u.over.addEventListener("click", (e) => {
      if (u.__dragged) { u.__dragged = false; return; }  // the end of a drag is not a click on a point
      if (e.detail > 1) return;
      const at = {left: e.clientX - u.over.getBoundingClientRect().left, idx: u.cursor.idx};
      clearTimeout(pending);
      pending = setTimeout(() => { pending = null; clicked(at); }, 250);
    });
    const clicked = (e) => {
      // a mark within 4 px of the click opens its event; else the nearest point's
      const left = e.left;
      for (const m of u.__x === "step" ? marks : []) {
        if (m.step === null || m.step === undefined || m.seq === undefined) continue;
        if (Math.abs(u.valToPos(m.step, "x") - left) <= 4) { openEvent(m.rank, m.seq, m.run); return; }
      }
      const i = e.idx;
      if (i === null || i === undefined) return;
      let best = null;
      for (let k = 1; k < u.data.length; k++) if (u.data[k][i] !== null && seqs[k][i] !== null) { best = k; break; }
      if (best !== null) { const s = parts[(best - 1) % parts.length]; openEvent(s.rank, seqs[best][i], s.run); }
    };
    T.charts[metric] = u;
  }

  function hoverValues(u, box, parts, smoothed, metric) {
    // the value of every curve at the cursor's x (the raw value, and the average where smoothing is on), largest
    // first; the nearest point of a curve that has none at that x
    const i = u.cursor.idx;
    if (i === null || i === undefined) { box.replaceChildren(); return; }
    const x = u.data[0][i], n = parts.length, rows = [];
    for (let k = 0; k < n; k++) {
      let j = i;
      const ys = u.data[k + 1];
      if (ys[j] === null) {  // the curve's nearest point at most 8 columns away
        j = null;
        for (let d = 1; d <= 8 && j === null; d++) {
          if (i - d >= 0 && ys[i - d] !== null) j = i - d; else if (i + d < ys.length && ys[i + d] !== null) j = i + d;
        }
      }
      if (j === null) continue;
      rows.push([u.series[k + 1].stroke(), u.series[k + 1].label, ys[j], smoothed ? u.data[k + 1 + n][j] : null]);
    }
    rows.sort((a, b) => b[2] - a[2]);
    box.replaceChildren(el("span", X_TITLES[u.__x || "step"] + " " + axisLabel(x)));
    for (const [c, label, v, sm] of rows.slice(0, 40)) {
      const e = el("span"), sw = el("span", null, "swatch");
      sw.style.background = c;
      e.appendChild(sw);
      e.appendChild(document.createTextNode(label + " " + fmt(v) + (sm !== null && sm !== undefined ? " (smoothed " + fmt(sm) + ")" : "")));
      box.appendChild(e);
    }
    if (rows.length > 40) box.appendChild(el("span", "and " + (rows.length - 40) + " more"));
    T.data[metric].hover = rows.length;
  }

  function drawClipped(u, parts, metric) {
    // points outside the robust y range: drawn at the chart's edge as a triangle pointing out, in their colour
    const sc = u.scales.y;
    if (!VIEW.robust || sc.min === undefined || sc.min === null) return;
    const ctx = u.ctx, dpr = devicePixelRatio, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
    let n = 0;
    ctx.save();
    for (let k = 0; k < parts.length; k++) {
      const ys = u.data[k + 1], colour = u.series[k + 1].stroke();
      ctx.fillStyle = colour;
      for (let i = 0; i < ys.length; i++) {
        const v = ys[i];
        if (v === null || (v >= sc.min && v <= sc.max)) continue;
        const px = u.valToPos(u.data[0][i], "x", true);
        if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
        const up = v > sc.max, y = up ? top : bottom, d = 6 * dpr;
        ctx.beginPath();
        ctx.moveTo(px, y + (up ? 0 : 0)); ctx.lineTo(px - d / 2, y + (up ? d : -d)); ctx.lineTo(px + d / 2, y + (up ? d : -d));
        ctx.closePath(); ctx.fill();
        n += 1;
      }
    }
    ctx.restore();
    if (T.data[metric]) T.data[metric].clipped = n;
  }

  function drawMarks(u, marks, xa) {
    if (xa !== "step") return;  // marks are at their step: drawn on the step axis
    const ctx = u.ctx;
    ctx.save();
    for (const m of marks) {
      if (m.step === null || m.step === undefined) continue;
      const x = u.valToPos(m.step, "x", true);
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = MARK_COLORS[m.kind] || "#57606a";
      ctx.globalAlpha = 0.55;
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
    }
    ctx.restore();
  }

  function drawFit(s) {
    // the latest scaling_fitted as a fit: the law's curve (its lowest loss at each training compute C = 6ND, N and D
    // split as the law says is best), each rung's measured held-out loss with its interval (two standard errors of
    // the mean over the eval batches, where the verdict recorded them), the law's value at each rung, the size it
    // chose at its predicted loss and interval, and that run's measured loss once its verdict is in
    const fits = s.listed.filter(x => x.kind === "scaling_fitted");
    const box = document.getElementById("fit-box");
    if (T.charts.fit) { T.charts.fit.destroy(); delete T.charts.fit; }
    if (!fits.length) { box.hidden = true; T.data.fit = {points: 0}; return; }
    const f = fits[fits.length - 1].fields, p = f.params || {};
    const warned = fits[fits.length - 1].warnings || [];
    const wbox = document.getElementById("fit-warnings");
    wbox.hidden = !warned.length;
    wbox.textContent = warned.length ? "FIT WARNING: " + warned.join("; ") : "";
    const num = v => typeof v === "number" && isFinite(v);
    const pts = (f.points || []).filter(q => Array.isArray(q) && q.length >= 3 && q[0] > 0 && q[1] > 0 && num(q[2]));
    const lawOk = ["E", "A", "B", "alpha", "beta"].every(k => num(p[k])) && p.A > 0 && p.B > 0 && p.alpha > 0 && p.beta > 0;
    const law = (n, d) => p.E + p.A / Math.pow(n, p.alpha) + p.B / Math.pow(d, p.beta);
    const verdicts = s.listed.filter(x => x.kind === "gate_verdict").map(x => x.fields || {});
    const verdictAt = q => verdicts.find(g => g.measured && g.measured.n_params === q[0] && g.measured.tokens === q[1]);
    const c = f.choice || {}, cand = c.candidate || {};
    const headline = num(c.predicted_loss) && cand.n_params > 0 && c.tokens > 0 ? {
      x: 6 * cand.n_params * c.tokens, y: c.predicted_loss,
      lo: Array.isArray(c.interval) && num(c.interval[0]) ? c.interval[0] : null,
      hi: Array.isArray(c.interval) && num(c.interval[1]) ? c.interval[1] : null} : null;
    const done = verdicts.filter(g => g.rung === f.rung && g.measured && num(g.measured.eval_loss)).pop();
    const measured = done ? {y: done.measured.eval_loss, se: num(done.measured.eval_loss_se) ? done.measured.eval_loss_se : null} : null;
    const rungs = pts.map(q => { const v = verdictAt(q), se = v && num(v.measured.eval_loss_se) ? v.measured.eval_loss_se : null;
                                 return {x: 6 * q[0] * q[1], y: q[2], lo: se === null ? null : q[2] - 2 * se,
                                         hi: se === null ? null : q[2] + 2 * se, fitted: lawOk ? law(q[0], q[1]) : null}; });
    // the curve: N* = G (C/6)^(beta/(alpha+beta)) with G = (alpha A / (beta B))^(1/(alpha+beta)), D* = C / (6 N*)
    const xsAll = rungs.map(r => r.x).concat(headline ? [headline.x] : []);
    const curve = [];
    if (lawOk && xsAll.length) {
      const c0 = Math.log10(Math.min(...xsAll)) - 0.3, c1 = Math.log10(Math.max(...xsAll)) + 0.3;
      const g = Math.pow(p.alpha * p.A / (p.beta * p.B), 1 / (p.alpha + p.beta));
      for (let k = 0; k <= 96; k++) {
        const C = Math.pow(10, c0 + (c1 - c0) * k / 96);
        const n = g * Math.pow(C / 6, p.beta / (p.alpha + p.beta)), d = C / (6 * n);
        const y = law(n, d);
        if (num(y)) curve.push({x: C, y: y});
      }
    }
    // one x array, the union; each series null where it has no point
    const cols = [curve, rungs, rungs.map(r => ({x: r.x, y: r.fitted})), headline ? [headline] : [],
                  headline && measured ? [{x: headline.x, y: measured.y}] : []];
    const xs = [...new Set(cols.flat().map(r => r.x))].sort((a, b) => a - b);
    const at = new Map(xs.map((v, k) => [v, k]));
    const data = [xs].concat(cols.map(col => { const y = new Array(xs.length).fill(null);
                                                for (const r of col) if (num(r.y)) y[at.get(r.x)] = r.y; return y; }));
    const bars = rungs.filter(r => r.lo !== null).map(r => [r.x, r.lo, r.hi, "#0072b2"])
      .concat(headline && headline.lo !== null ? [[headline.x, headline.lo, headline.hi, "#d55e00"]] : [])
      .concat(measured && measured.se !== null ? [[headline.x, measured.y - 2 * measured.se, measured.y + 2 * measured.se, "#000000"]] : []);
    const ys = data.slice(1).flat().filter(num).concat(bars.flatMap(b => [b[1], b[2]]));
    const ylo = Math.min(...ys), yhi = Math.max(...ys), pad = 0.08 * (yhi - ylo || 1);
    box.hidden = false;
    const el0 = document.getElementById("chart-fit");
    el0.replaceChildren();
    const dots = (size, fill) => ({show: true, size: size, fill: fill});
    T.charts.fit = new uPlot({
      width: Math.max(300, Math.min(900, el0.clientWidth || 700)), height: 260,
      // x: the points and the curve with a margin (not rounded out to the next powers of ten)
      scales: {x: {time: false, distr: 3, log: 10, range: () => [Math.min(...xs) / 1.2, Math.max(...xs) * 1.2]},
               y: {range: () => [ylo - pad, yhi + pad]}},
      legend: {live: false},
      axes: [{label: "training compute 6ND (FLOPs)", splits: logSplits, filter: (u, splits) => splits,
              values: (u, vals) => vals.map(v => v === null ? "" : v.toExponential(0))},
             {label: "held-out loss (nats)", size: 64, values: (u, vals) => vals.map(axisLabel)}],
      series: [{label: "6ND"},
               {label: "the law: lowest loss at each compute", stroke: "#009e73", width: 2, spanGaps: true, points: {show: false}},
               {label: "rungs, measured (2 SE)", stroke: "#0072b2", paths: () => null, points: dots(7, "#0072b2")},
               {label: "the law at each rung", stroke: "#999999", paths: () => null, points: dots(5, "#ffffff")},
               {label: "chosen size, predicted (interval)", stroke: "#d55e00", paths: () => null, points: dots(9, "#d55e00")},
               {label: "chosen size, measured", stroke: "#000000", paths: () => null, points: dots(9, "#000000")}],
      hooks: {draw: [u => {
        // the intervals: a vertical bar with caps at each end
        const ctx = u.ctx;
        ctx.save();
        ctx.lineWidth = 1.5 * devicePixelRatio;
        for (const [x, lo, hi, colour] of bars) {
          const px = u.valToPos(x, "x", true), a = u.valToPos(lo, "y", true), b = u.valToPos(hi, "y", true);
          const cap = 5 * devicePixelRatio;
          ctx.strokeStyle = colour;
          ctx.beginPath();
          ctx.moveTo(px, a); ctx.lineTo(px, b);
          ctx.moveTo(px - cap, a); ctx.lineTo(px + cap, a);
          ctx.moveTo(px - cap, b); ctx.lineTo(px + cap, b);
          ctx.stroke();
        }
        ctx.restore();
      }]},
    }, data, el0);
    const inside = measured && headline && headline.lo !== null ? measured.y >= headline.lo && measured.y <= headline.hi : null;
    T.data.fit = {points: pts.length, chosen: !!headline, warnings: warned.length, curve: curve.length,
                  intervals: bars.length, measured: measured ? measured.y : null, inside: inside};
    document.getElementById("fit-legend").textContent = "L(N, D) = E + A/N^alpha + B/D^beta with E " + fmt(p.E) +
      ", A " + fmt(p.A) + ", B " + fmt(p.B) + ", alpha " + fmt(p.alpha) + ", beta " + fmt(p.beta) +
      (cand.name ? "; chosen " + cand.name + " (" + fmt(cand.n_params) + " params, " + fmt(c.tokens) +
                   " tokens), predicted loss " + fmt(c.predicted_loss) +
                   (headline && headline.lo !== null ? " in [" + fmt(headline.lo) + ", " + fmt(headline.hi) + "]" : "") : "") +
      (measured ? "; measured " + fmt(measured.y) + (inside === null ? "" : inside ? " (inside the interval)" : " (OUTSIDE the interval)")
                : cand.name ? "; not measured yet" : "") +
      "; fitted by " + fmt(f.fitter || "lbfgs") + " over " + pts.length + " rung(s)" +
      (rungs.some(r => r.lo !== null) ? "" : "; the rungs' verdicts record no standard error: no interval on the measured points");
  }

  function drawHeatmap(h) {
    const c = document.getElementById("heatmap");
    const rows = h.ranks.length;
    const divs = h.divergences || [];
    T.data.heatmap = {ranks: h.ranks.slice(), stragglers: h.stragglers.length, cells: h.cells.length,
                      divergences: divs.length};
    const legend = document.getElementById("heatmap-legend");
    if (!rows) { c.hidden = true; legend.textContent = "no step times"; return; }
    c.hidden = false;
    const rowH = Math.max(6, Math.min(24, Math.floor(240 / rows)));
    c.width = Math.min(h.width, 1200); c.height = rows * rowH;
    const ctx = c.getContext("2d");
    ctx.clearRect(0, 0, c.width, c.height);
    let lo = Infinity, hi = -Infinity;
    for (const [, , v] of h.cells) { if (v < lo) lo = v; if (v > hi) hi = v; }
    const sx = c.width / h.width;
    // a pixel bucket covers at least one step: with fewer steps than pixels, a cell is a step wide
    const cellW = Math.max(sx, c.width / Math.max(h.hi - h.lo + 1, 1), 1);
    for (const [rank, px, v] of h.cells) {
      const t = hi > lo ? (v - lo) / (hi - lo) : 0;
      ctx.fillStyle = "rgb(" + Math.round(255 * t) + "," + Math.round(200 * (1 - t)) + "," + Math.round(255 * (1 - t)) + ")";
      ctx.fillRect(px * sx, h.ranks.indexOf(rank) * rowH, Math.ceil(cellW), rowH);
    }
    ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
    const span = Math.max(h.hi - h.lo + 1, 1);
    for (const s of h.stragglers) {
      const r = h.ranks.indexOf(s.rank);
      if (r < 0) continue;
      const x0 = (s.from - h.lo) / span * c.width, x1 = (s.to - h.lo + 1) / span * c.width;
      ctx.strokeRect(x0, r * rowH + 1, Math.max(x1 - x0, 2), rowH - 2);
    }
    // a replica whose state diverged (docs/sdc.md): a cross at its rank and step
    for (const d of divs) {
      for (const rank of d.ranks || []) {
        const r = h.ranks.indexOf(rank);
        if (r < 0) continue;
        const x = (d.step - h.lo + 0.5) / span * c.width, y = (r + 0.5) * rowH, k = Math.max(3, rowH / 2 - 1);
        for (const [w, col] of [[4, "#fff"], [2, "#d00"]]) {
          ctx.lineWidth = w; ctx.strokeStyle = col;
          ctx.beginPath(); ctx.moveTo(x - k, y - k); ctx.lineTo(x + k, y + k);
          ctx.moveTo(x + k, y - k); ctx.lineTo(x - k, y + k); ctx.stroke();
        }
      }
    }
    legend.textContent = "rows: " + (h.ranks.length === 1 && h.ranks[0] < 0 ? "the journal" : "ranks " + h.ranks.join(", ")) + "; colour: step time " + fmt(lo) + " s (blue) to " +
      fmt(hi) + " s (red), steps " + h.lo + " to " + h.hi + "; outlined: stragglers flagged (" + h.stragglers.length + ")" +
      (divs.length ? "; crossed: state divergences (" + divs.length + ")" : "");
  }

  function drawDevices(metric, body) {
    // a reading over time, a line per rank and device; each point opens its device_sampled event
    const box = document.getElementById("chart-" + metric);
    if (T.charts[metric]) { T.charts[metric].destroy(); delete T.charts[metric]; }
    box.replaceChildren();
    T.data[metric] = {points: body.series.reduce((n, s) => n + s.x.length, 0), series: body.series.length};
    if (!body.series.length) { box.appendChild(el("p", "no readings", "legend")); return; }
    const {data, seqs} = chartData(body.series);
    const u = new uPlot({
      width: Math.max(300, box.clientWidth || 600), height: 200, scales: {x: {time: false}},
      axes: [{}, {size: 56, values: (u, vals) => vals.map(axisLabel)}],
      series: [{label: "s"}].concat(body.series.map((s, i) => ({
        label: (s.rank !== null && s.rank !== undefined ? "rank " + s.rank + " " : "") + "device " + s.device,
        stroke: COLORS[i % COLORS.length], spanGaps: true, width: 1.25, points: {show: false}}))),
      legend: {show: body.series.length <= 12},
    }, data, box);
    u.over.addEventListener("click", () => {
      const i = u.cursor.idx;
      if (i === null || i === undefined) return;
      for (let k = 1; k < u.data.length; k++) if (u.data[k][i] !== null && seqs[k][i] !== null) {
        openEvent(body.series[k - 1].rank, seqs[k][i]); break;
      }
    });
    T.charts[metric] = u;
  }

  function drawTelemetry(t) {
    const tb = document.getElementById("telemetry");
    tb.replaceChildren();
    if (!t.rows.length) { row(tb, ["no device readings in this journal"]); return; }
    row(tb, ["rank", "device", "samples", "max temp °C", "max HBM °C", "max power W", "min SM clock MHz", "throttled",
             "uncorrected ECC"], true);
    for (const r of t.rows) row(tb, [r.rank === null ? "-" : r.rank, r.device, r.samples, fmt(r.temp_c_max),
                                     fmt(r.temp_hbm_c_max), fmt(r.power_w_max), fmt(r.sm_clock_mhz_min),
                                     r.throttled ? "yes" : "no", fmt(r.ecc_uncorrected)]);
  }

  function groupOf(key) {
    // the builtin curves are "Training"; a logged metric's group is its name up to the first "/" (train/, eval/)
    if (!key.startsWith("m:")) return "Training";
    const n = key.slice(2), cut = n.indexOf("/");
    return cut > 0 ? n.slice(0, cut) : "logged";
  }
  function searchTest() {
    const q = VIEW.search.trim();
    if (!q) return () => true;
    if (q.length > 2 && q.startsWith("/") && q.endsWith("/")) {
      try { const re = new RegExp(q.slice(1, -1), "i"); return k => re.test(k.startsWith("m:") ? k.slice(2) : k); }
      catch (e) { /* not a regex: the text itself */ }
    }
    const t = q.toLowerCase();
    return k => (k.startsWith("m:") ? k.slice(2) : k + " " + axisOf(k).head).toLowerCase().includes(t);
  }
  function panelKeys() {
    // the charts the page draws: the builtin curves and the logged metrics the search keeps (MAX_PANELS at most)
    const test = searchTest();
    const logged = LOGGED.names.map(x => "m:" + x[0]).filter(test);
    const keys = METRICS.filter(test).concat(logged.slice(0, MAX_PANELS));
    const note = document.getElementById("charts-note");
    const left = logged.length - Math.min(logged.length, MAX_PANELS);
    note.textContent = (left > 0 ? "showing " + MAX_PANELS + " of " + logged.length + " logged metrics: type in the " +
                                   "metrics box to find the others. " : "") +
      (LOGGED.leftOut ? LOGGED.leftOut + " points of metrics past the board's limit of distinct names are not charted." : "");
    T.data.panels = {keys: keys.slice(), logged: logged.length, shown: keys.length};
    return keys;
  }
  function ensurePanels(keys) {
    // a panel per chart, in groups, made once and kept (a chart drawn again keeps its panel and its log box)
    const root = document.getElementById("charts");
    const want = new Set(keys);
    for (const [k, p] of PANELS) if (!want.has(k)) { if (T.charts[k]) { T.charts[k].destroy(); delete T.charts[k]; }
                                                   p.section.remove(); PANELS.delete(k); delete BODIES[k]; delete T.data[k]; }
    const groups = [];
    for (const k of keys) { const g = groupOf(k); if (!groups.includes(g)) groups.push(g); }
    const frag = [];
    for (const g of groups) {
      let h = root.querySelector('h2[data-group="' + CSS.escape(g) + '"]');
      if (!h) { h = el("h2", g === "Training" ? "Training" : g === "logged" ? "Logged" : g + "/"); h.dataset.group = g; }
      frag.push(h);
      for (const k of keys.filter(x => groupOf(x) === g)) {
        let p = PANELS.get(k);
        if (!p) {
          // the loss and the gradient norm across the page, as before; the others two a row
          const section = el("section", null, "panel" + (k === "loss" || k === "grad_norm" ? " wide" : ""));
          const head = el("div", null, "panel-head");
          head.appendChild(el("h3", axisOf(k).head));
          const lab = el("label"), box = document.createElement("input");
          box.type = "checkbox";
          if (!k.startsWith("m:")) box.id = "log-" + k;  // the builtin curves' boxes keep their names
          box.checked = !!VIEW.log[k];
          box.addEventListener("change", () => { VIEW.log[k] = box.checked; if (BODIES[k]) drawChart(k, BODIES[k][0], BODIES[k][1]); });
          lab.appendChild(box); lab.appendChild(document.createTextNode(" log axis"));
          head.appendChild(lab);
          const chart = el("div", null, "chart");
          if (!k.startsWith("m:")) chart.id = "chart-" + k;
          const hover = el("div", null, "hover");
          section.appendChild(head); section.appendChild(chart); section.appendChild(hover);
          p = {section: section, box: chart, hover: hover};
          PANELS.set(k, p);
        }
        frag.push(p.section);
      }
    }
    for (const h of root.querySelectorAll("h2")) if (!frag.includes(h)) h.remove();
    frag.forEach((n, i) => { if (root.children[i] !== n) root.insertBefore(n, root.children[i] || null); });
  }
  function chartWidth(key) {
    const p = PANELS.get(key);
    return Math.max(300, Math.min(2000, (p && p.box.clientWidth) || 1200));
  }

  async function appendTo(k, ask, names, idx, cur, tag) {
    // the runs at idx asked for what is new since their cursors; false when an answer is not an append (the chart
    // is then fetched whole)
    const q = Object.assign({}, ask, {since: idx.map(i => cur.cursor[i] === undefined ? -1 : cur.cursor[i])});
    if (names[0] !== null) q.run = idx.map(i => names[i]);
    const got = (await get("api/curves", q)).runs;
    const body = BODIES[k][0];
    for (let j = 0; j < got.length; j++) {
      const b = got[j], n = names[idx[j]], run = n === null ? undefined : n;
      if (!b.append) return false;
      for (const s of tag(b.series, n)) {
        const have = body.series.find(x => x.run === run && x.rank === s.rank && x.segment === s.segment &&
                                           x.rung === s.rung);
        if (!have) { body.series.push(s); continue; }
        if (s.x.length && have.x.length && s.x[0] < have.x[have.x.length - 1]) return false;  // a step back
        have.x.push(...s.x); have.y.push(...s.y); have.seq.push(...s.seq);
      }
      body.unsigned = body.unsigned.filter(u => u.run !== run).concat(tag(b.unsigned, n));
      const added = b.series.reduce((a, s) => a + s.x.length, 0);
      cur.added += added;
      T.appended += added;
      cur.cursor[idx[j]] = b.cursor;
    }
    return true;
  }

  async function getState() {
    // the state, with the run table as of the page's cursor: only the rows made since come, merged here
    const s = await get("api/state", RUNS.cursor === null ? {} : {runs_since: RUNS.cursor});
    if (s.runs_partial) {
      const by = new Map(RUNS.list.map(r => [r.name, r]));
      for (const r of s.runs) by.set(r.name, r);
      if (!s.runs_names.every(n => by.has(n))) { RUNS.cursor = null; return getState(); }
      s.runs = s.runs_names.map(n => by.get(n));
    }
    RUNS.cursor = s.runs_cursor === undefined ? null : s.runs_cursor;
    return s;
  }

  let busy = false, again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = T.busy = true;
    try {
      do {
        again = false;
        let s = await getState();
        const focus = RUNS.focus;
        drawRuns(s.runs || []);
        // the first look at a folder: the state read is the first run's, the one shown, unless that one failed
        const first = focus === null && (s.runs || []).length > 0 && s.runs[0].name === RUNS.focus && !s.runs[0].fail;
        if (RUNS.focus !== focus && !first) s = await getState();
        T.state = s;
        drawState(s);
        if (!s.fail) {
          const many = RUNS.list.length > 1;
          const names = many ? Array.from(RUNS.selected) : [null];
          const diffs = ((s.replay || {}).differences || []).map(d => ({step: d.step, kind: "replay_difference",
                                                                         rank: d.rank, seq: d.seq}));
          const marks = s.marks.concat(diffs);
          // the curves are fetched again only when what they show may have changed: the runs ticked, the view, the
          // width, or new lines read in one of those runs (a replay ending elsewhere changes none of them)
          const dv = many ? names.map(n => (RUNS.list.find(r => r.name === n) || {}).data_version)
                          : [s.data_version];
          const nkey = JSON.stringify([names, dv]);
          if (nkey !== LOGGED.key) {  // the logged metrics' names: asked again when the runs or their lines changed
            const got = many && !names.length ? {names: [], left_out: 0}
                                              : await get("api/logged", many ? {run: names} : {});
            LOGGED.names = got.names; LOGGED.leftOut = got.left_out; LOGGED.key = nkey;
          }
          const keys = panelKeys();
          ensurePanels(keys);
          const mkey = JSON.stringify(marks);
          // each chart fetched again only when its own request changed, and drawn as soon as it arrives (the loss
          // first: it is asked for first)
          const one = async k => {
            const width = chartWidth(k);
            const fkey = JSON.stringify([names, VIEW.x, VIEW.zoom, width]);
            const ask = k.startsWith("m:") ? {logged: k.slice(2)} : {metric: k};
            Object.assign(ask, {width: width, x: VIEW.x});
            const tag = (arr, n) => arr.map(x => Object.assign(x, {run: n === null ? undefined : n}));
            const cur = FETCHED[k] === fkey && BODIES[k] ? CURSORS[k] : undefined;  // the same curves as drawn
            if (cur) {
              const idx = names.map((n, i) => i).filter(i => cur.dv[i] !== dv[i]);  // the runs with new lines
              // only what is new since each one's cursor, added to what the chart has: on the step axis, the whole
              // run, until that has added a chart's width (an answer that is not an append, a journal rewritten or
              // a step back, draws the chart whole below)
              const append = VIEW.x === "step" && !VIEW.zoom && cur.added < width;
              if (!idx.length || (append && await appendTo(k, ask, names, idx, cur, tag))) {
                idx.forEach(i => { cur.dv[i] = dv[i]; });
                if (idx.length || mkey !== LAST.marks) drawChart(k, BODIES[k][0], marks);
                return;
              }
            }
            if (VIEW.zoom) { ask.lo = VIEW.zoom[0]; ask.hi = VIEW.zoom[1]; }
            if (many) ask.run = names;
            const got = many && !names.length ? [] : (await get("api/curves", ask)).runs;
            FETCHED[k] = fkey;
            CURSORS[k] = {cursor: got.map(b => b.cursor), dv: dv.slice(), added: 0};
            drawChart(k, {series: got.flatMap((b, i) => tag(b.series, names[i])),
                          unsigned: got.flatMap((b, i) => tag(b.unsigned, names[i])), x_axis: ask.x}, marks);
          };
          // the first chart alone, then the others together: the first is drawn without waiting on the rest
          const firstShown = keys.find(k => k.startsWith("m:") || (T.state && T.state.steps && T.state.steps[0]));
          if (firstShown !== undefined) await one(firstShown);
          await Promise.all(keys.filter(k => k !== firstShown).map(one));
          LAST.marks = mkey;
          drawFit(s);
          drawHeatmap(await get("api/heatmap", {width: 600}));
          const tele = await get("api/telemetry");
          drawTelemetry(tele);
          document.getElementById("devices-box").hidden = !tele.rows.length;
          if (tele.rows.length) {
            for (const m of ["temp_c", "power_w"]) drawDevices(m, await get("api/devices", {metric: m, width: 900}));
          }
        }
        T.version = s.version;
        T.drawn += 1;
      } while (again);
    } catch (e) {
      T.errors.push(String(e));
      document.getElementById("status").textContent = "cannot reach the server: " + e;
    } finally {
      busy = T.busy = false;
    }
  }

  function redraw() {
    // the view changed (smoothing, the y range): the curves drawn again from what was fetched
    for (const k of PANELS.keys()) if (BODIES[k]) drawChart(k, BODIES[k][0], BODIES[k][1]);
  }
  const slider = document.getElementById("smoothing");
  slider.addEventListener("input", () => {
    VIEW.smoothing = Math.min(0.999, Math.max(0, Number(slider.value) || 0));
    document.getElementById("smoothing-value").textContent = VIEW.smoothing.toFixed(2);
    redraw();
  });
  function zoomTo(a, b) {
    // a range of x (null: the whole run): every chart fetched again for it, at full resolution
    if (a === null || !isFinite(a) || !isFinite(b) || a === b) VIEW.zoom = null;
    else {
      let lo = Math.min(a, b), hi = Math.max(a, b);
      if (VIEW.x === "step") { lo = Math.floor(lo); hi = Math.ceil(hi); }
      VIEW.zoom = [lo, hi];
    }
    const z = document.getElementById("zoom-reset"), zt = document.getElementById("zoom-range");
    z.hidden = !VIEW.zoom;
    zt.textContent = VIEW.zoom ? X_TITLES[VIEW.x] + " " + axisLabel(VIEW.zoom[0]) + " to " + axisLabel(VIEW.zoom[1]) +
                                 ", every point fetched again (double-click a chart for the whole run)"
                               : "drag across a chart to zoom";
    refresh();
  }
  document.getElementById("zoom-reset").addEventListener("click", () => zoomTo(null));
  T.zoom = zoomTo;  // what a drag does, for tests and tools/bench_serve.py
  const xsel = document.getElementById("x-axis");
  // another axis: fetched again, the whole run (a zoom's range was in the other axis's units)
  xsel.addEventListener("change", () => { VIEW.x = xsel.value; zoomTo(null); });
  const robust = document.getElementById("robust");
  robust.addEventListener("change", () => { VIEW.robust = robust.checked; redraw(); });
  const search = document.getElementById("metric-search");
  search.addEventListener("input", () => { VIEW.search = search.value; refresh(); });
  const runsFilter = document.getElementById("runs-filter");
  runsFilter.addEventListener("input", () => { drawRuns(RUNS.list); });
  VIEW.smoothing = Math.min(0.999, Math.max(0, Number(slider.value) || 0));  // as the page opened (a reload keeps it)
  document.getElementById("smoothing-value").textContent = VIEW.smoothing.toFixed(2);

  refresh();
  const es = new EventSource(url("api/stream"));
  es.onmessage = (m) => {
    const v = JSON.parse(m.data).version;
    if (v !== T.version) refresh();
  };
})();
