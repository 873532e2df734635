// The compare view: GET /runs, GET /compare (per-query differences, as `sira compare`), GET /compare/query.
"use strict";

(() => {
  if (SIRA.view !== "compare") return;
  const {el, add, clear, api, notice, failed, fmt, signed, header, chips} = SIRA;
  const $ = (id) => document.getElementById(id);
  const TIE = 1e-9; // sira.core.metrics.paired_comparison's tie tolerance
  let comparison = null;
  let filter = "all";

  function outcome(delta) {
    return delta > TIE ? "win" : delta < -TIE ? "loss" : "tie";
  }

  function remember(params) {
    history.replaceState(null, "", "/compare?" + new URLSearchParams(params).toString());
  }

  async function loadRuns() {
    let runs;
    try {
      runs = (await api("/runs")).runs;
    } catch (exc) {
      failed(exc);
      return false;
    }
    $("no-runs").hidden = runs.length > 0;
    for (const select of [$("base"), $("run")]) {
      clear(select);
      const groups = new Map();
      for (const r of runs) {
        const key = r.dataset + " / " + r.split;
        if (!groups.has(key)) groups.set(key, select.appendChild(el("optgroup", {label: key})));
        const ndcg = r.metrics && r.metrics["ndcg@10"];
        add(groups.get(key), el("option", {value: r.name}, r.name + (ndcg === undefined ? "" : "  (nDCG@10 " + fmt(ndcg) + ")")));
      }
    }
    const params = new URLSearchParams(location.search);
    const names = runs.map((r) => r.name);
    const base = params.get("base") || (runs.find((r) => r.variant === "bm25") || runs[0] || {}).name;
    const group = runs.find((r) => r.name === base);
    const run = params.get("run") || (runs.find((r) => r.name !== base && r.variant === "sira"
      && group && r.dataset === group.dataset && r.split === group.split) || runs.find((r) => r.name !== base) || {}).name;
    if (names.includes(base)) $("base").value = base;
    if (names.includes(run)) $("run").value = run;
    return runs.length >= 2 || Boolean(params.get("base"));
  }

  function showComparison(c) {
    $("summary-title").textContent = c.dataset + " / " + c.split + ": " + c.run_file + " against " + c.base_run
      + " (" + c.queries + " judged queries, " + c.metric + ")";
    $("wins").textContent = c.wins;
    $("losses").textContent = c.losses;
    $("ties").textContent = c.ties;
    $("means").textContent = c.metric + " " + fmt(c.base) + " \u2192 " + fmt(c.run) + " (\u0394 " + signed(c.delta)
      + ", p = " + fmt(c.p_value) + ", paired randomization test, " + c.permutations + " swaps)";
    const rows = Object.entries(c.per_query).map(([qid, s]) => ({qid, base: s.base, run: s.run, delta: s.run - s.base}));
    rows.sort((a, b) => b.delta - a.delta || (a.qid < b.qid ? -1 : a.qid > b.qid ? 1 : 0));
    const body = clear($("queries").querySelector("tbody"));
    const largest = Math.max(1e-9, ...rows.map((r) => Math.abs(r.delta)));
    for (const r of rows) {
      const kind = outcome(r.delta);
      const row = el("tr", {class: "query " + kind, data: {qid: r.qid, outcome: kind}, tabindex: "0"},
        el("td", null, el("code", null, r.qid), " ", c.texts[r.qid] || ""),
        el("td", {class: "num"}, fmt(r.base, 3)),
        el("td", {class: "num"}, fmt(r.run, 3)),
        el("td", {class: "num delta"}, el("span", {class: "delta-bar " + kind,
          style: {width: (40 * Math.abs(r.delta) / largest) + "px"}}), signed(r.delta, 3)));
      row.addEventListener("click", () => openQuery(r.qid));
      row.addEventListener("keydown", (event) => event.key === "Enter" && openQuery(r.qid));
      add(body, row);
    }
    applyFilter();
    $("summary").hidden = false;
  }

  function applyFilter() {
    for (const row of $("queries").querySelectorAll("tbody tr")) {
      row.hidden = filter !== "all" && row.dataset.outcome !== filter;
    }
    for (const b of $("filters").querySelectorAll("button")) {
      b.setAttribute("aria-pressed", String(b.dataset.filter === filter));
    }
  }

  function relevance(hit) {
    if (hit.relevance === null || hit.relevance === undefined) return el("span", {class: "rel unjudged", title: "not judged"}, "\u00b7");
    if (hit.relevance > 0) return el("span", {class: "rel relevant", title: "judged relevant (" + hit.relevance + ")"}, "\u2713" + hit.relevance);
    return el("span", {class: "rel irrelevant", title: "judged not relevant"}, "\u2717");
  }

  function program(p) {
    if (!p) return el("p", {class: "muted small"}, "no program recorded");
    const kept = p.expansions.filter((e) => e.kept);
    const dropped = p.expansions.filter((e) => !e.kept);
    return el("div", {class: "mini-program small"},
      el("div", null, el("span", {class: "label"}, "original "), chips(p.original_terms, "original")),
      p.expansions.length ? el("div", null, el("span", {class: "label"}, "expansion (w " + fmt(p.w, 2) + ") "),
        chips(kept.map((e) => e.phrase), "expansion"),
        dropped.map((e) => el("span", {class: "chip dropped", title: "dropped: " + e.reason}, el("s", null, e.phrase),
          el("small", null, " " + e.reason))))
        : el("div", {class: "muted"}, "no expansion"));
  }

  function side(box, title, s, score, other) {
    const theirs = new Set(other.hits.map((h) => h.doc_id));
    clear(box,
      el("h4", null, title + ": " + s.name, el("span", {class: "muted"}, " (" + (s.variant || "?") + ", " + comparison.metric
        + " " + fmt(score, 3) + ")")),
      program(s.program),
      el("ol", {class: "ranking"}, s.hits.map((h) => el("li", {class: h.relevance > 0 ? "relevant" : "", data: {docId: h.doc_id}},
        el("span", {class: "rank"}, String(h.rank)), relevance(h), el("span", {class: "title", title: h.title}, h.title || "(no title)"),
        theirs.has(h.doc_id) ? null : el("span", {class: "only", title: "not in the other top list"}, "only here"),
        el("code", {class: "doc-id"}, h.doc_id), el("span", {class: "score"}, fmt(h.score, 3))))),
      s.hits.length ? null : el("p", {class: "muted"}, "no hits"));
  }

  async function openQuery(qid) {
    const base = $("base").value, run = $("run").value;
    try {
      const d = await api("/compare/query?" + new URLSearchParams({base, run, qid}).toString());
      notice("");
      $("detail-title").textContent = d.qid + ": " + d.query;
      clear($("detail-judged"), "judged: ", d.judged.map((j) => el("span",
        {class: "chip" + (j.relevance > 0 ? " relevant" : "")}, j.doc_id + " (" + j.relevance + ") " + j.title)));
      const scores = comparison.per_query[qid] || {};
      side($("side-base"), "base", d.base, scores.base, d.run);
      side($("side-run"), "run", d.run, scores.run, d.base);
      $("detail").hidden = false;
      $("detail-hint").hidden = true;
      for (const row of $("queries").querySelectorAll("tbody tr")) {
        row.classList.toggle("selected", row.dataset.qid === qid);
      }
      remember({base, run, qid});
    } catch (exc) {
      failed(exc);
    }
  }

  async function compare(qid) {
    const base = $("base").value, run = $("run").value;
    if (!base || !run) return;
    $("compare").disabled = true;
    try {
      comparison = await api("/compare?" + new URLSearchParams({base, run}).toString());
      notice("");
      $("detail").hidden = true;
      $("detail-hint").hidden = false;
      showComparison(comparison);
      remember({base, run});
      if (qid && comparison.per_query[qid]) await openQuery(qid);
    } catch (exc) {
      failed(exc);
    } finally {
      $("compare").disabled = false;
    }
  }

  async function start() {
    if (await loadRuns()) await compare(new URLSearchParams(location.search).get("qid"));
  }

  $("compare-form").addEventListener("submit", (event) => {
    event.preventDefault();
    compare(null);
  });
  $("filters").addEventListener("click", (event) => {
    if (event.target.dataset.filter) {
      filter = event.target.dataset.filter;
      applyFilter();
    }
  });
  header(start).then(start);
})();
