// trainledger serve: the page. Every string from a journal is put into the page as text (textContent), never as
// markup. Tests read window.__trainledger (the charts' data, the state, the version drawn).
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const METRICS = ["loss", "grad_norm", "mfu", "tokens_per_s"];
  // Okabe and Ito's colour-blind-safe eight (the yellow darkened to read on white), then Paul Tol's muted set:
  // sixteen colours that stay apart for every common colour-vision deficiency
  const COLORS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#b8a800",
                  "#332288", "#88ccee", "#44aa99", "#117733", "#999933", "#cc6677", "#882255", "#aa4499"];
  // each curve's axis title with its unit, how its values are shown, and whether a log axis is offered
  const AXES = {loss: {title: "loss (nats)", scale: 1}, grad_norm: {title: "gradient norm (L2)", scale: 1},
                mfu: {title: "MFU (%)", scale: 100}, tokens_per_s: {title: "tokens / s", scale: 1}};
  // zoom: null, or the visible x range [lo, hi] in the x axis's units, fetched again at full resolution
  const VIEW = {smoothing: 0, x: "step", zoom: null,
                log: {loss: false, grad_norm: false, mfu: false, tokens_per_s: false}};
  const X_TITLES = {step: "step", tokens: "tokens processed", time: "wall time (s)"};
  const BODIES = {};
  const LAST = {curves: null, marks: null};  // what the curves drawn were fetched for
  // a folder of runs: the run the panels show (RUN), and the runs the charts overlay (SELECTED), by name
  const RUNS = {list: [], focus: null, selected: new Set(), chosen: false};
  const MARK_COLORS = {anomaly_detected: "#cf222e", spike_suspected: "#fb8500", rewind_decided: "#8250df",
                       run_resumed: "#0969da", checkpoint_saved: "#1a7f37", shards_saved: "#1a7f37",
                       device_changed: "#953800", run_stopped: "#1b1f24", straggler_detected: "#bf8700",
                       weights_restored: "#8250df", replay_difference: "#ff0000"};
  const T = window.__trainledger = {charts: {}, data: {}, state: null, version: -1, drawn: 0, errors: []};

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
    const body = await r.json();
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
    return String(+v.toPrecision(4));
  }
  function logSplits(u, axisIdx, min, max) {
    // 1, 2 and 5 times each power of ten in range: enough labelled ticks on a log axis
    const out = [];
    if (!(min > 0) || !(max > 0)) return out;
    for (let e = Math.floor(Math.log10(min)); e <= Math.ceil(Math.log10(max)); e++) {
      for (const m of [1, 2, 5]) { const v = m * Math.pow(10, e); if (v >= min && v <= max) out.push(v); }
    }
    return out;
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

  function drawRuns(runs) {
    // the run table of a folder of runs: a FAIL row is listed and never drawn
    RUNS.list = runs;
    const box = document.getElementById("runs-box");
    box.hidden = runs.length <= 1;
    if (runs.length <= 1) return;
    const ok = runs.filter(r => !r.fail).map(r => r.name);
    if (!RUNS.chosen) { RUNS.selected = new Set(ok.slice(0, 8)); }
    for (const n of Array.from(RUNS.selected)) if (!ok.includes(n)) RUNS.selected.delete(n);
    if (RUNS.focus === null || !ok.includes(RUNS.focus)) RUNS.focus = ok.length ? ok[0] : null;
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
    }
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

  function drawChart(metric, body, marks) {
    BODIES[metric] = [body, marks];
    const box = document.getElementById("chart-" + metric);
    const axis = AXES[metric], log = VIEW.log[metric], w = VIEW.smoothing;
    const shown = s => Object.assign({}, s, {y: s.y.map(v => v === null ? null : (log && !(v > 0) ? null : v * axis.scale))});
    const parts = body.series.map(s => Object.assign(shown(s), {unsigned: false}))
      .concat(body.unsigned.map(s => Object.assign(shown(s), {unsigned: true})));
    let rawMax = null;
    for (const s of parts) for (const v of s.y) if (v !== null && (rawMax === null || v > rawMax)) rawMax = v;
    T.data[metric] = {points: parts.reduce((n, s) => n + s.x.length, 0), series: parts.length,
                      unsigned: body.unsigned.reduce((n, s) => n + s.x.length, 0), smoothing: w, log: log,
                      rawMax: rawMax, title: axis.title, x: body.x_axis || "step", runs: [...new Set(parts.map(s => s.run || ""))].length,
                      zoom: VIEW.zoom ? VIEW.zoom.slice() : null};
    const {data, seqs} = chartData(parts);
    const ranks = [...new Set(parts.map(s => s.rank))];
    const runs = [...new Set(parts.map(s => s.run || ""))];
    // colour by rank in a run folder, else by rung (a ladder), else by segment; several runs: a colour family per
    // run, its ranks or rungs as shades
    const subOf = s => ranks.length > 1 ? "r" + s.rank : (s.rung ? "g" + s.rung : "s" + s.segment);
    const keyOf = s => (s.run || "") + "|" + subOf(s);
    const keys = [...new Set(parts.filter(s => !s.unsigned).map(keyOf))];
    const subs = {};
    for (const k of keys) { const r = k.split("|")[0]; (subs[r] = subs[r] || []).push(k); }
    const colour = s => s.unsigned ? "#9a6700" : runs.length > 1
      ? shade(COLORS[runs.indexOf(s.run || "") % COLORS.length], (subs[s.run || ""] || []).indexOf(keyOf(s)),
              (subs[s.run || ""] || []).length)
      : COLORS[keys.indexOf(keyOf(s)) % COLORS.length];
    const name = s => ((runs.length > 1 ? s.run + " " : "") + (s.unsigned ? "not signed yet " : "") +
                       (s.rank !== null && s.rank !== undefined ? "rank " + s.rank + " " : "") +
                       (s.rung ? s.rung : (!s.unsigned && s.segment ? "segment " + s.segment : ""))).trim() || metric;
    // smoothing draws the moving average over the raw curve, which stays drawn (thin, lighter): a spike is never
    // smoothed away, it stays in the raw band under the average
    const series = [{label: "step"}];
    for (const s of parts) series.push({label: name(s), stroke: colour(s),
      alpha: w > 0 ? 0.35 : 1, dash: s.unsigned ? [4, 4] : undefined, spanGaps: true, width: w > 0 ? 1 : 1.25,
      points: {show: false}});
    if (w > 0) {
      parts.forEach((s, i) => {
        data.push(ema(data[i + 1], w));
        seqs.push(seqs[i + 1]);
        series.push({label: name(s) + " (smoothed)", stroke: colour(s), width: 2, spanGaps: true, points: {show: false}});
      });
    }
    const yScale = log ? {distr: 3, log: 10} : {};
    const opts = {
      width: Math.max(300, box.clientWidth || 900), height: 220,
      // zoomed: the axis shows the range asked for (the server sent every point in it, at most two a pixel)
      scales: {x: VIEW.zoom ? {time: false, range: () => VIEW.zoom.slice()} : {time: false}, y: yScale},
      // a drag selects a range of x: the curves are fetched again for it (no zoom into the coarse overview)
      cursor: {drag: {x: true, y: false, setScale: false}},
      axes: [{label: X_TITLES[body.x_axis || "step"], size: 44}, Object.assign({label: axis.title, size: 72, values: (u, vals) => vals.map(axisLabel)},
                                                     log ? {splits: logSplits, filter: (u, splits) => splits} : {})],
      series: series,
      // one entry per curve and no per-point values once there are many; past 24 curves, a compact legend instead
      // (below): a run's colour and name, or each curve's colour and name in small type
      legend: {show: parts.length <= 24, live: series.length <= 8},
      hooks: {draw: [u => drawMarks(u, marks, body.x_axis || "step")], setSelect: [u => {
        if (u.select.width < 3) return;
        const a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
        u.__dragged = true;
        u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
        zoomTo(a, b);
      }]},
    };
    if (T.charts[metric]) { T.charts[metric].destroy(); delete T.charts[metric]; }
    box.replaceChildren();
    if (!parts.length) {
      box.appendChild(el("p", metric === "mfu" ? "no MFU: no run_configured with the model's size and the devices' peak"
                                             : "nothing to draw yet", "legend"));
      return;
    }
    const u = new uPlot(opts, data, box);
    if (parts.length > 24) {
      const lg = el("div", null, "compact-legend");
      const entries = runs.length > 1
        ? runs.map(r => [COLORS[runs.indexOf(r) % COLORS.length], r + " (" + parts.filter(s => (s.run || "") === r).length + " lines)"])
        : parts.map(s => [colour(s), name(s)]);
      for (const [c, label] of entries) {
        const e = el("span", null, "entry"), sw = el("span", null, "swatch");
        sw.style.background = c;
        e.appendChild(sw); e.appendChild(document.createTextNode(label));
        lg.appendChild(e);
      }
      box.appendChild(lg);
    }
    T.data[metric].legend = parts.length > 24 ? "compact" : "full";
    // the averages share their curve's colour: the legend lists each curve once
    const rows = u.root.querySelectorAll(".u-legend .u-series"), averages = w > 0 ? parts.length : 0;
    rows.forEach((tr, k) => { if (k >= rows.length - averages) tr.style.display = "none"; });
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
    T.data.heatmap = {ranks: h.ranks.slice(), stragglers: h.stragglers.length, cells: h.cells.length};
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
    legend.textContent = "rows: " + (h.ranks.length === 1 && h.ranks[0] < 0 ? "the journal" : "ranks " + h.ranks.join(", ")) + "; colour: step time " + fmt(lo) + " s (blue) to " +
      fmt(hi) + " s (red), steps " + h.lo + " to " + h.hi + "; outlined: stragglers flagged (" + h.stragglers.length + ")";
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

  let busy = false, again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = T.busy = true;
    try {
      do {
        again = false;
        let s = await get("api/state");
        const focus = RUNS.focus;
        drawRuns(s.runs || []);
        // the first look at a folder: the state read is the first run's, the one shown, unless that one failed
        const first = focus === null && (s.runs || []).length > 0 && s.runs[0].name === RUNS.focus && !s.runs[0].fail;
        if (RUNS.focus !== focus && !first) s = await get("api/state");
        T.state = s;
        drawState(s);
        if (!s.fail) {
          const width = Math.max(300, Math.min(2000, document.getElementById("chart-loss").clientWidth || 1200));
          const many = RUNS.list.length > 1;
          const names = many ? Array.from(RUNS.selected) : [null];
          const diffs = ((s.replay || {}).differences || []).map(d => ({step: d.step, kind: "replay_difference",
                                                                         rank: d.rank, seq: d.seq}));
          const marks = s.marks.concat(diffs);
          // the curves are fetched again only when what they show may have changed: the runs ticked, the view, the
          // width, or new lines read in one of those runs (a replay ending elsewhere changes none of them)
          const dv = many ? names.map(n => (RUNS.list.find(r => r.name === n) || {}).data_version)
                          : [s.data_version];
          const key = JSON.stringify([names, VIEW.x, VIEW.zoom, width, dv]), mkey = JSON.stringify(marks);
          if (key !== LAST.curves || !BODIES.loss) {
            const bodies = await Promise.all(METRICS.map(async m => {
              // one request a curve, every run ticked in it
              const ask = {metric: m, width: width, x: VIEW.x};
              if (VIEW.zoom) { ask.lo = VIEW.zoom[0]; ask.hi = VIEW.zoom[1]; }
              if (many) ask.run = names;
              const got = many && !names.length ? [] : (await get("api/curves", ask)).runs;
              const tag = (arr, n) => arr.map(x => Object.assign(x, {run: n === null ? undefined : n}));
              return {series: got.flatMap((b, i) => tag(b.series, names[i])),
                      unsigned: got.flatMap((b, i) => tag(b.unsigned, names[i])), x_axis: ask.x};
            }));
            METRICS.forEach((m, i) => drawChart(m, bodies[i], marks));
            LAST.curves = key; LAST.marks = mkey;
          } else if (mkey !== LAST.marks) {
            METRICS.forEach(m => drawChart(m, BODIES[m][0], marks));
            LAST.marks = mkey;
          }
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
    // the view changed (smoothing, a log axis): the curves drawn again from what was fetched
    for (const m of METRICS) if (BODIES[m]) drawChart(m, BODIES[m][0], BODIES[m][1]);
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
  for (const m of METRICS) {
    const box = document.getElementById("log-" + m);
    if (box) box.addEventListener("change", () => { VIEW.log[m] = box.checked; redraw(); });
  }

  refresh();
  const es = new EventSource(url("api/stream"));
  es.onmessage = (m) => {
    const v = JSON.parse(m.data).version;
    if (v !== T.version) refresh();
  };
})();
