
"use strict";
(function () {
  const t0 = performance.now();
  const DATA = JSON.parse(document.getElementById("catalog-data").textContent);
  const tParsed = performance.now();
  const C = {};
  DATA.columns.forEach((name, i) => { C[name] = i; });
  const ROWS = DATA.rows;
  const BY_LOCATION = new Map();
  ROWS.forEach((r, i) => { if (!BY_LOCATION.has(r[C.location])) BY_LOCATION.set(r[C.location], i); });
  const KEYS = ["experiment", "pair", "stage", "state", "from", "to", "hash", "q", "open", "into"];
  const SELECTS = ["experiment", "pair", "stage", "state"];
  const TEXTS = ["from", "to", "hash", "q"];
  const PAGE = DATA.page;
  const body = document.body;
  let state = {}, matched = [], shown = PAGE, hay = null, typing = null;

  // --- helpers: every value from a manifest goes in as text or an attribute
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = String(v);
      else e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }
  const val = (r, k) => r[C[k]];
  function look(st) { return DATA.looks[st] || [String(st || "?").toLowerCase(), DATA.failure_colour]; }
  function colour(e, st) { e.style.setProperty("--c", look(st)[1]); return e; }
  function when(created) { return created ? String(created).slice(0, 16).replace("T", " ") : "–"; }
  // A job of a rule in its own layout as Snakemake names it (rule[name=value, ...]); a stage as stage[/instance].
  function stageName(r) {
    const w = val(r, "wildcards");
    if (w) { const named = Object.entries(w).map(([k, v]) => k + "=" + v); return val(r, "stage") + (named.length ? "[" + named.join(", ") + "]" : ""); }
    return val(r, "stage") + (val(r, "instance") ? "/" + val(r, "instance") : "");
  }
  // Where a row's stage runs: its pair; none for a job of a rule in its own layout.
  function pairText(r) { return val(r, "wildcards") ? null : (r[C.pair] === DATA.all_pairs ? "all pairs" : r[C.pair]); }
  function stageDir(r) {
    const loc = val(r, "location"), archive = val(r, "archive");
    if (val(r, "archived")) {
      if (archive && loc.endsWith("/" + archive)) return loc.slice(0, loc.length - archive.length - 1);
      const at = loc.lastIndexOf("/.attempts/");
      if (at >= 0) return loc.slice(0, at);
    }
    return loc;
  }
  function openHref(loc) { return "#" + toHash(Object.assign({}, state, {open: loc})); }

  // --- the URL hash holds the state
  function fromHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ""));
    const s = {};
    for (const k of KEYS) { const v = p.get(k); if (v) s[k] = v; }
    return s;
  }
  function toHash(s) {
    const p = new URLSearchParams();
    for (const k of KEYS) if (s[k]) p.set(k, s[k]);
    return p.toString();
  }
  function saveHash() {
    const h = toHash(state);
    if (location.hash.replace(/^#/, "") === h) return;
    try { history.replaceState(null, "", "#" + h); } catch (err) { location.hash = h; }
  }

  // --- filters
  function distinct(key) {
    const counts = new Map();
    for (const r of ROWS) { const v = val(r, key); if (v !== null && v !== undefined) counts.set(v, (counts.get(v) || 0) + 1); }
    return counts;
  }
  function fillSelects() {
    for (const key of SELECTS) {
      const select = document.getElementById("f-" + key);
      const counts = distinct(key);
      let names = Array.from(counts.keys());
      if (key === "stage") names = DATA.stages.filter((s) => counts.has(s)).concat(names.filter((s) => !DATA.stages.includes(s)));
      else names.sort();
      select.append(el("option", {value: "", text: "any"}));
      for (const n of names) select.append(el("option", {value: n, text: n + " (" + counts.get(n) + ")"}));
    }
  }
  function showFilters() {
    for (const key of SELECTS) {
      const select = document.getElementById("f-" + key);
      const v = state[key] || "";
      if (v && !Array.from(select.options).some((o) => o.value === v)) select.append(el("option", {value: v, text: v + " (0)"}));
      select.value = v;
    }
    for (const key of TEXTS) document.getElementById("f-" + key).value = state[key] || "";
  }
  function haystack() {
    if (!hay) hay = ROWS.map((r) => [r[C.location], r[C.experiment], r[C.pair], r[C.stage], r[C.instance], r[C.state],
                                   r[C.code_version], r[C.config_hash], r[C.reused_from], (r[C.differs] || []).join(" ")]
                                   .filter((x) => x !== null && x !== undefined).join("\n").toLowerCase());
    return hay;
  }
  function filter() {
    const s = state, out = [];
    const q = s.q ? s.q.toLowerCase() : "", H = q ? haystack() : null;
    const exp = s.experiment, pair = s.pair, stage = s.stage, st = s.state, hash = s.hash, from = s.from, to = s.to;
    for (let i = 0; i < ROWS.length; i++) {
      const r = ROWS[i];
      if (stage && r[C.stage] !== stage) continue;
      if (pair && r[C.pair] !== pair) continue;
      if (exp && r[C.experiment] !== exp) continue;
      if (st && r[C.state] !== st) continue;
      if (hash && !String(r[C.config_hash] || "").startsWith(hash)) continue;
      const created = r[C.created] || "";
      if (from && created.slice(0, from.length) < from) continue;
      if (to && created.slice(0, to.length) > to) continue;
      if (q && H[i].indexOf(q) < 0) continue;
      out.push(i);
    }
    return out;
  }

  // --- the candidates, grouped by stage and pair (the rows come in that order, newest first)
  function differsLine(r) {
    const d = val(r, "differs"), against = val(r, "compared_with");
    if (d === null || d === undefined) return el("div", {class: "differs muted", text: "not compared (stage or pair not in the current config)"});
    if (!d.length) return el("div", {class: "differs same", text: "same settings as the current config (" + against + ")"});
    const box = el("div", {class: "differs", "data-count": d.length}, "differs from the current config (" + against + "): ");
    d.forEach((line, n) => { if (n) box.append("; "); box.append(el("span", {class: "setting", text: line})); });
    return box;
  }
  function inputsList(r) {
    const ins = val(r, "inputs") || [];
    if (!ins.length) return null;
    const ul = el("ul", {class: "inputs"});
    for (const [link, path, st] of ins) {
      if (typeof link === "number") {
        const src = ROWS[link];
        ul.append(el("li", {class: "input", "data-location": src[C.location]},
                     stageDir(src) + "/" + path, el("span", {class: "muted", text: " (" + look(st)[0] + ")"})));
      } else {
        ul.append(el("li", {class: "input missing", "data-manifest": link},
                     String(path), el("span", {text: link ? " (its manifest is not in the catalog)" : " (no manifest: placed by hand)"})));
      }
    }
    return ul;
  }
  function candidate(i) {
    const r = ROWS[i];
    const marks = [];
    if (val(r, "archived")) marks.push(el("span", {class: "mark archived", text: "archived " + (val(r, "archive") || "")}));
    if (val(r, "reused_from")) marks.push(el("span", {class: "mark reused", text: "reused" + (val(r, "source_created") ? " (made " + when(val(r, "source_created")) + ")" : "")}));
    if (val(r, "adopted")) marks.push(el("span", {class: "mark adopted", text: "adopted"}));
    if (val(r, "provisional")) marks.push(el("span", {class: "mark provisional", text: "provisional"}));
    const a = el("article", {class: "candidate" + (state.open === r[C.location] ? " open" : ""), tabindex: 0,
                             "data-index": i, "data-location": r[C.location], "data-experiment": val(r, "experiment"),
                             "data-pair": val(r, "pair"), "data-stage": val(r, "stage"), "data-state": val(r, "state"),
                             "data-instance": val(r, "instance"), "data-archived": val(r, "archived") ? "true" : null,
                             "data-reused": val(r, "reused_from") ? "true" : null},
      el("div", {class: "head"},
         el("span", {class: "state", text: look(val(r, "state"))[0]}),
         el("span", {class: "experiment", text: val(r, "experiment")}),
         el("span", {class: "stage", text: stageName(r)}),
         el("span", {class: "created", text: when(val(r, "created"))}),
         el("span", {class: "attempts", text: "×" + (val(r, "attempts") || 0) + " attempt(s)"}),
         el("span", {class: "code", text: "code " + (val(r, "code_version") || "–")}),
         el("span", {class: "hash", text: "config " + String(val(r, "config_hash") || "–").slice(0, 8)}),
         ...marks),
      el("div", {class: "path location", text: r[C.location]}),
      val(r, "reused_from") ? el("div", {class: "path muted", text: "reused from " + val(r, "reused_from")}) : null,
      differsLine(r), inputsList(r));
    return colour(a, val(r, "state"));
  }
  function renderList() {
    const t = performance.now();
    const list = document.getElementById("results");
    list.replaceChildren();
    const totals = new Map();
    for (const i of matched) { const k = ROWS[i][C.stage] + "\u0000" + ROWS[i][C.pair]; totals.set(k, (totals.get(k) || 0) + 1); }
    let group = null, key = null;
    const end = Math.min(shown, matched.length);
    for (let n = 0; n < end; n++) {
      const r = ROWS[matched[n]], k = r[C.stage] + "\u0000" + r[C.pair];
      if (k !== key) {
        key = k;
        const pair = pairText(r);
        group = el("section", {class: "group", "data-stage": r[C.stage], "data-pair": r[C.pair], "data-count": totals.get(k)},
                   el("h2", {}, el("span", {class: "title", text: r[C.stage] + (pair ? " · " + pair : "")}), " ",
                      el("span", {class: "count", text: totals.get(k) + " candidate(s)"})));
        list.append(group);
      }
      group.append(candidate(matched[n]));
    }
    if (matched.length > end) {
      list.append(el("button", {type: "button", class: "more", id: "more",
                                text: "show " + Math.min(PAGE, matched.length - end) + " more (" + end + " of " + matched.length + " shown)"}));
    }
    document.getElementById("summary").textContent = matched.length + " of " + ROWS.length + " stage(s) match" +
      (matched.length > end ? "; showing the first " + end : "") + "; grouped by stage and pair, newest first";
    body.dataset.matches = matched.length;
    body.dataset.shown = end;
    body.dataset.renderMs = (performance.now() - t).toFixed(2);
  }
  function refilter() {
    const t = performance.now();
    matched = filter();
    body.dataset.filterMs = (performance.now() - t).toFixed(2);
    shown = PAGE;
    renderList();
  }

  // --- lineage and the reuse pointer
  function nodeLabel(r, i) {
    return colour(el("span", {class: "label"},
      el("span", {class: "state", text: look(r[C.state])[0]}), " ",
      el("a", {href: openHref(r[C.location]), "data-open": r[C.location], text: stageName(r)}),
      (pairText(r) ? " · " + pairText(r) : "") + " · " + r[C.experiment] + " · " + when(r[C.created]),
      r[C.archived] ? el("span", {class: "mark archived", text: "archived " + (r[C.archive] || "")}) : null,
      " ", el("span", {class: "path muted", text: r[C.location]})), r[C.state]);
  }
  function lineage(i, depth, seen) {
    const r = ROWS[i];
    const li = el("li", {class: "node", "data-location": r[C.location], "data-stage": r[C.stage], "data-pair": r[C.pair],
                         "data-experiment": r[C.experiment], "data-state": r[C.state], "data-depth": depth}, nodeLabel(r, i));
    if (seen.has(i)) { li.classList.add("repeat"); li.append(el("span", {class: "muted", text: " (its lineage is shown above)"})); return li; }
    seen.add(i);
    const ul = el("ul");
    if (r[C.reused_from]) {
      if (typeof r[C.source] === "number") {
        const copy = lineage(r[C.source], depth + 1, seen);
        copy.prepend(el("span", {class: "muted", text: "copy of "}));
        ul.append(copy);
      } else {
        ul.append(el("li", {class: "node missing", "data-location": r[C.reused_from], "data-depth": depth + 1,
                            text: "copy of " + r[C.reused_from] + ": missing (not in the catalog)"}));
      }
    }
    for (const [link, path, st] of r[C.inputs] || []) {
      if (typeof link === "number") ul.append(lineage(link, depth + 1, seen));
      else if (link) ul.append(el("li", {class: "node missing", "data-manifest": link, "data-depth": depth + 1,
                                         text: "missing: " + link + " (not in the catalog; input " + path + ")"}));
      else ul.append(el("li", {class: "node missing", "data-depth": depth + 1,
                               text: "no manifest: " + path + " (placed by hand)"}));
    }
    if (ul.childNodes.length) li.append(ul);
    return li;
  }
  const PLAIN = /^[A-Za-z0-9_./-][A-Za-z0-9_./:@+-]*$/;
  const SPECIAL = /^(true|false|yes|no|on|off|y|n|null|~|[-+.0-9].*)$/i;
  function yamlScalar(s) { s = String(s); return PLAIN.test(s) && !SPECIAL.test(s) && !s.includes(": ") ? s : JSON.stringify(s); }
  function shellWord(s) { s = String(s); return /^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\"'\"'") + "'"; }
  function ancestors(stage) {
    const seen = new Set(), todo = [stage];
    while (todo.length) for (const p of DATA.parents[todo.pop()] || []) if (!seen.has(p)) { seen.add(p); todo.push(p); }
    return seen;
  }
  function pointer(i, into) {
    const r = ROWS[i], S = r[C.stage], P = r[C.pair], E = r[C.experiment], notes = [];
    const home = r[C.root] === DATA.root, archived = r[C.archived];
    let dir = stageDir(r);
    if (r[C.instance] && dir.endsWith("/" + r[C.instance])) dir = dir.slice(0, dir.length - r[C.instance].length - 1);
    // An archived run is taken from its archive (per instance: {instance} filled in by each instance).
    const archive = r[C.archive] || r[C.location].slice(stageDir(r).length + 1);
    const source = archived ? (r[C.instance] ? dir + "/{instance}/" + archive : r[C.location]) : home ? E : dir;
    const perPair = P !== DATA.all_pairs;
    const yaml = "experiments:\n  " + yamlScalar(into) + ":\n    reuse:\n      " + yamlScalar(S) + ":" +
      (perPair ? "\n        " + yamlScalar(P) + ": " + yamlScalar(source) : " " + yamlScalar(source)) + "\n";
    if (r[C.state] !== "SUCCESS") notes.push("this stage is " + look(r[C.state])[0] + ", not done: a reuse takes finished SUCCESS stages only");
    if (r[C.provisional]) notes.push("this stage is provisional (it ran over failed parents): a reuse refuses it");
    if (archived && r[C.instance]) notes.push("an archived run: each instance is taken from its own " + archive + " (one that lacks it can't be reused)");
    else if (r[C.instance]) notes.push("a reuse takes the whole stage " + S + " (every instance), not instance " + r[C.instance] + " alone");
    if (home && !archived && into === E) notes.push("an experiment can't reuse its own stage: choose another experiment");
    const pairs = DATA.experiments[into];
    if (pairs && perPair && !pairs.includes(P)) notes.push("pair " + P + " is not in experiment " + into + "'s pairs: add it first");
    if (!pairs) notes.push("experiment " + into + " is not in the config: add experiments." + into + " (with its pairs) first");
    // `waypost reuse` takes everything upstream of a stage: the child of S with the fewest other ancestors.
    const mine = ancestors(S);
    let best = null, extra = null;
    for (const child of Object.keys(DATA.parents)) {
      const up = ancestors(child);
      if (!up.has(S)) continue;
      const more = Array.from(up).filter((s) => s !== S && !mine.has(s));
      if (best === null || more.length < extra.length) { best = child; extra = more; }
    }
    let command = null;
    if (archived) {
      notes.push("`waypost reuse` takes current stages only: use the pointer for an archived run");
    } else if (best !== null) {
      const words = ["waypost", "reuse", "--into", into, "--from", E, "--upstream-of", best];
      if (perPair) words.push("--pairs", P);
      if (!home) words.push("--from-root", r[C.root]);
      command = words.map(shellWord).join(" ");
      const taken = [S].concat(Array.from(mine)).concat(extra);
      notes.push("the command takes every stage upstream of " + best + ": " + taken.length + " stage(s) (" +
                 DATA.stages.filter((s) => taken.includes(s)).concat(taken.filter((s) => !DATA.stages.includes(s))).join(", ") + ")");
    } else {
      notes.push(Object.keys(DATA.parents).length ? "no stage takes inputs from " + S + ": no `waypost reuse` command takes it; use the pointer"
                                                  : "the stage graph is unknown here (no parse of the workflow): use the pointer");
    }
    return {yaml, command, notes};
  }
  function copyButton(target) {
    return el("button", {type: "button", class: "copy", "data-copy": target, text: "copy"});
  }
  function defaultInto(r) {
    const names = Object.keys(DATA.experiments);
    const against = r[C.compared_with];
    if (against && against !== r[C.experiment] && names.includes(against)) return against;
    return names.find((n) => n !== r[C.experiment]) || "NEW";
  }
  function renderPanel() {
    const panel = document.getElementById("lineage");
    const main = document.querySelector("main");
    panel.replaceChildren();
    document.querySelectorAll(".candidate.open").forEach((e) => e.classList.remove("open"));
    if (!state.open) { main.classList.add("closed"); panel.removeAttribute("data-location"); return; }
    main.classList.remove("closed");
    panel.dataset.location = state.open;
    const i = BY_LOCATION.get(state.open);
    const close = el("button", {type: "button", id: "close", text: "close"});
    if (i === undefined) {
      panel.append(close, el("h2", {text: "not in the catalog"}), el("p", {class: "missing", text: state.open}));
      return;
    }
    document.querySelectorAll(".candidate").forEach((e) => { if (e.dataset.location === state.open) e.classList.add("open"); });
    const r = ROWS[i];
    const fields = el("table", {class: "fields"});
    const add = (k, v) => { if (v !== null && v !== undefined && v !== "") fields.append(el("tr", {"data-field": k}, el("td", {text: k}), el("td", {text: v}))); };
    add("location", r[C.location]); add("root", r[C.root]); add("experiment", r[C.experiment]);
    add("pair", r[C.pair]); add("stage", stageName(r)); add("state", look(r[C.state])[0] + " (" + r[C.state] + ")");
    add("created", r[C.created]); add("attempts", r[C.attempts]); add("code version", r[C.code_version]);
    add("config hash", r[C.config_hash]); add("reused from", r[C.reused_from]); add("source made", r[C.source_created]);
    add("archived", r[C.archived] ? (r[C.archive] || "yes") : null);
    panel.append(close, el("h2", {text: "lineage of " + stageName(r) + " · " + r[C.pair] + " · " + r[C.experiment]}), fields,
                 differsLine(r),
                 el("h3", {text: "made from"}), el("ul", {class: "tree", id: "tree"}, lineage(i, 0, new Set())));
    const into = state.into || defaultInto(r);
    const select = el("select", {id: "into"});
    const names = Object.keys(DATA.experiments);
    if (!names.includes(into)) names.push(into);
    for (const n of names) select.append(el("option", {value: n, text: n}));
    select.value = into;
    const p = pointer(i, into);
    const reuse = el("section", {id: "reuse", "data-into": into},
      el("h3", {text: "reuse it"}),
      el("label", {}, "into experiment ", select),
      el("p", {class: "muted", text: "in the config, or a file under reuse/ beside it (experiments." + into + ".reuse):"}),
      el("pre", {class: "copy", id: "reuse-yaml", text: p.yaml}), copyButton("reuse-yaml"));
    if (p.command) reuse.append(el("p", {class: "muted", text: "or let waypost write it (it checks the sources first):"}),
                                el("pre", {class: "copy", id: "reuse-command", text: p.command}), copyButton("reuse-command"));
    for (const n of p.notes) reuse.append(el("p", {class: "note", text: n}));
    panel.append(reuse);
  }
  function copy(id) {
    const pre = document.getElementById(id);
    const text = pre.textContent;
    const selectIt = () => { const range = document.createRange(); range.selectNodeContents(pre);
                             const s = getSelection(); s.removeAllRanges(); s.addRange(range);
                             try { document.execCommand("copy"); } catch (err) { /* selected: copy by hand */ } };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).catch(selectIt); else selectIt();
  }

  // --- wiring
  function apply(next) {
    const filtersChanged = KEYS.some((k) => k !== "open" && k !== "into" && (state[k] || "") !== (next[k] || ""));
    state = next;
    showFilters();
    if (filtersChanged || !matched.length) refilter();
    renderPanel();
  }
  function fromForm() {
    const next = Object.assign({}, state);
    for (const key of SELECTS.concat(TEXTS)) { const v = document.getElementById("f-" + key).value.trim(); if (v) next[key] = v; else delete next[key]; }
    return next;
  }
  function bench() {
    // #bench: time filtering the whole array and rendering the first page, per filter, into data-bench.
    const stages = DATA.stages.slice(0, 4), pairs = Array.from(distinct("pair").keys()).slice(0, 3);
    const cases = [{}, {stage: stages[0]}, {stage: stages[stages.length - 1], pair: pairs[pairs.length - 1]},
                   {q: String(pairs[0] || "x")}, {q: String(pairs[1] || "y")}, {state: "FAILED"}, {from: "2000-01-01", to: "2999-12-31"}];
    const out = [];
    for (const c of cases) {
      const t = performance.now();
      state = c; showFilters(); refilter();
      out.push({filter: toHash(c), ms: +(performance.now() - t).toFixed(2), filterMs: +body.dataset.filterMs, matches: matched.length});
    }
    body.dataset.bench = JSON.stringify(out);
  }

  fillSelects();
  document.getElementById("filters").addEventListener("input", (e) => {
    if (e.target.id === "f-q" || e.target.id === "f-hash") { clearTimeout(typing); typing = setTimeout(() => { apply(fromForm()); saveHash(); }, 150); }
    else { apply(fromForm()); saveHash(); }
  });
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  document.getElementById("reset").addEventListener("click", () => { apply({}); saveHash(); });
  document.getElementById("results").addEventListener("click", (e) => {
    if (e.target.id === "more") { shown += PAGE; renderList(); return; }
    const c = e.target.closest(".candidate");
    if (c) { apply(Object.assign({}, state, {open: c.dataset.location, into: undefined})); saveHash(); }
  });
  document.getElementById("results").addEventListener("keydown", (e) => {
    const c = e.target.closest(".candidate");
    if (c && e.key === "Enter") { apply(Object.assign({}, state, {open: c.dataset.location, into: undefined})); saveHash(); }
  });
  document.getElementById("lineage").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-open]");
    if (a) { e.preventDefault(); apply(Object.assign({}, state, {open: a.dataset.open})); saveHash(); return; }
    if (e.target.id === "close") { apply(Object.assign({}, state, {open: undefined, into: undefined})); saveHash(); return; }
    if (e.target.dataset.copy) copy(e.target.dataset.copy);
  });
  document.getElementById("lineage").addEventListener("change", (e) => {
    if (e.target.id === "into") { apply(Object.assign({}, state, {into: e.target.value})); saveHash(); }
  });
  window.addEventListener("hashchange", () => apply(fromHash()));

  // No hash: the view the command line asked for (`find --stage S --html F`).
  state = location.hash.replace(/^#/, "") ? fromHash() : Object.assign({}, DATA.initial || {});
  showFilters();
  refilter();
  renderPanel();
  body.dataset.total = ROWS.length;
  body.dataset.parseMs = (tParsed - t0).toFixed(2);
  body.dataset.loadMs = (performance.now() - t0).toFixed(2);
  if (/(^|[#&])bench(=|&|$)/.test(location.hash)) bench();
  body.dataset.ready = "true";
})();
