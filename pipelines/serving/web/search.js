// The search view: POST /search with explain, then the retrieval program and each hit's contributions.
"use strict";

(() => {
  if (SIRA.view !== "search") return;
  const {el, add, clear, api, notice, failed, fmt, header, chips} = SIRA;
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  let shown = false; // a result is on the page: changing an option searches again

  function listOf(text) {
    return text.split(",").map((s) => s.trim()).filter(Boolean);
  }

  function request() {
    const body = {query: $("query").value, k: Number($("k").value) || 10, expand: $("expand").checked, explain: true};
    if ($("w").value !== "") body.w = Number($("w").value);
    const must = listOf($("must").value), exclude = listOf($("exclude").value);
    if (must.length) body.must = must;
    if (exclude.length) body.exclude = exclude;
    return body;
  }

  // The address bar holds the search, so that it can be shared or reloaded.
  function remember(body) {
    const params = new URLSearchParams({q: body.query});
    if (body.expand) params.set("expand", "1");
    if (body.w !== undefined) params.set("w", String(body.w));
    if (body.k !== 10) params.set("k", String(body.k));
    if (body.must) params.set("must", body.must.join(", "));
    if (body.exclude) params.set("exclude", body.exclude.join(", "));
    history.replaceState(null, "", "/?" + params.toString());
  }

  function restore() {
    const params = new URLSearchParams(location.search);
    $("query").value = params.get("q") || "";
    $("expand").checked = params.get("expand") === "1" && !$("expand").disabled;
    $("w").value = params.get("w") || "";
    $("k").value = params.get("k") || "10";
    $("must").value = params.get("must") || "";
    $("exclude").value = params.get("exclude") || "";
    return Boolean(params.get("q"));
  }

  // Why the query-side DF filter kept or dropped a phrase (sira.core.dfstats.query_side_filter).
  function why(e, filter) {
    const limit = filter ? "\u03c4\u00b7|C| = " + fmt(filter.tau, 2) + " \u00d7 " + filter.num_docs + " = "
      + fmt(filter.max_df, 2) : "\u03c4\u00b7|C|";
    switch (e.reason) {
      case "kept": {
        const rare = e.terms.filter((_, i) => e.dfs[i] > 0 && (!filter || e.dfs[i] <= filter.max_df));
        return "rare enough: " + rare.map((t) => "\u201c" + t + "\u201d").join(", ")
          + (rare.length > 1 ? " have" : " has") + " 0 < DF \u2264 " + limit;
      }
      case "unseen": return "absent from the index: no term of it is in any document";
      case "too common": return "too common: its terms in the index have DF > " + limit;
      case "duplicate": return "duplicate: the same index terms as an earlier phrase";
      case "no terms": return "no index terms (stopwords or punctuation only)";
      default: return e.reason;
    }
  }

  function showProgram(data) {
    const p = data.program;
    $("program-query").textContent = p.query;
    clear($("original-terms"), chips(p.original_terms, "original"));
    const constraints = [...p.must.map((t) => "must: " + t), ...p.exclude.map((t) => "exclude: " + t)];
    $("constraints-row").hidden = !constraints.length;
    clear($("constraints"), chips(constraints));
    const summary = clear($("expansion-summary"));
    const body = clear($("expansions").querySelector("tbody"));
    $("expansions").hidden = !p.expansions.length;
    if (!data.proposer) {
      add(summary, "off (tick \u201cexpand the query\u201d to ask the proposer)");
    } else {
      const kept = p.expansions.filter((e) => e.kept).length;
      add(summary,
        el("b", null, kept + " of " + p.expansions.length), " proposed phrases kept, weight w = " + fmt(p.w, 2)
        + ", from " + data.proposer.backend + " " + data.proposer.model
        + (data.expansion ? " (" + data.expansion.source + ")" : ""),
        data.expansion && data.expansion.error ? el("span", {class: "error"}, " \u2014 the proposer failed: "
          + data.expansion.error + "; the plain query was searched") : null);
    }
    for (const e of p.expansions) {
      const terms = e.terms.map((t, i) => el("span", {class: "chip" + (e.kept ? " expansion" : "")}, t,
        el("small", null, " " + (e.dfs[i] === undefined ? "" : e.dfs[i]))));
      add(body, el("tr", {class: e.kept ? "kept" : "dropped"},
        el("td", {class: "phrase"}, e.phrase),
        el("td", null, terms),
        el("td", null, el("span", {class: "decision " + (e.kept ? "kept" : "dropped")}, e.kept ? "kept" : "dropped")),
        el("td", {class: "why"}, why(e, data.df_filter)),
        el("td", {class: "num"}, e.kept ? (e.weight === 1 ? fmt(p.w, 2) : fmt(p.w, 2) + " \u00d7 " + fmt(e.weight, 2)
          + " = " + fmt(p.w * e.weight, 3)) : "\u2014")));
    }
  }

  function bar(hit, top) {
    const segments = [];
    for (const c of hit.contributions || []) {
      for (const [part, value] of [["original", c.original], ["expansion", c.expansion]]) {
        if (value <= 0) continue;
        segments.push(el("span", {
          class: "seg " + part + (c.enrichment_only ? " enrichment" : ""),
          style: {width: (100 * value / hit.score) + "%"},
          title: c.term + ": " + fmt(value) + " (" + part + (c.enrichment_only ? ", only through enrichment" : "") + ")",
        }));
      }
    }
    return el("div", {class: "bar", style: {width: (100 * hit.score / top) + "%"}}, segments);
  }

  function terms(hit) {
    return el("ul", {class: "terms"}, (hit.contributions || []).map((c) => {
      const kind = c.original > 0 && c.expansion > 0 ? "both" : c.expansion > 0 ? "expansion" : "original";
      return el("li", {class: "term " + kind + (c.enrichment_only ? " enrichment" : ""), data: {term: c.term}},
        el("span", {class: "term-name"}, c.term), " ", el("b", null, fmt(c.score, 3)),
        c.expansions.length ? el("small", null, " from " + c.expansions.map((p) => "\u201c" + p + "\u201d").join(", ")) : null,
        c.enrichment_only ? el("span", {class: "badge"}, "enrichment only") : null,
        c.enrichment_only && c.injected.length
          ? el("small", null, " injected " + c.injected.map((p) => "\u201c" + p + "\u201d").join(", ")) : null);
    }));
  }

  function showHits(data) {
    const list = clear($("hits"));
    $("no-hits").hidden = data.hits.length > 0;
    const top = data.hits.length ? data.hits[0].score : 1;
    data.hits.forEach((hit, i) => {
      const snippet = el("p", {class: "snippet"},
        (hit.snippet || []).map((s) => (s.match ? el("mark", null, s.text) : s.text)));
      add(list, el("li", {class: "hit", data: {docId: hit.doc_id}},
        el("div", {class: "hit-head"},
          el("span", {class: "rank"}, String(i + 1)),
          el("span", {class: "title"}, hit.title || "(no title)"),
          el("code", {class: "doc-id"}, hit.doc_id),
          el("span", {class: "score"}, fmt(hit.score))),
        snippet,
        el("div", {class: "bar-track"}, bar(hit, top)),
        terms(hit),
        hit.injected && hit.injected.length
          ? el("p", {class: "injected small"}, "injected by enrichment: ",
            hit.injected.map((p) => el("span", {class: "chip enrichment"}, p))) : null));
    });
  }

  function showMeta(data) {
    const t = data.timing_ms;
    $("meta").textContent = "index v" + data.index_version + " \u00b7 " + data.preset
      + (data.enriched ? " (enriched)" : "") + " \u00b7 proposer "
      + (data.proposer ? data.proposer.backend + " " + data.proposer.model + " (prompt " + data.program.prompt_version + ")"
        : "none") + " \u00b7 " + data.hits.length + " hits \u00b7 "
      + Object.entries(t).map(([k, v]) => k + " " + fmt(v, 1) + " ms").join(", ");
  }

  async function search() {
    if (!$("query").value.trim()) return;
    const body = request();
    remember(body);
    $("go").disabled = true;
    try {
      const data = await api("/search", body);
      notice("");
      showMeta(data);
      showProgram(data);
      showHits(data);
      $("result").hidden = false;
      shown = true;
    } catch (exc) {
      failed(exc);
    } finally {
      $("go").disabled = false;
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    search();
  });
  for (const id of ["expand", "k", "w"]) {
    $(id).addEventListener("change", () => shown && search());
  }

  header(() => shown || $("query").value.trim() ? search() : null).then((health) => {
    if (health && !health.expansion) {
      $("expand").disabled = true;
      $("expand").parentElement.title = "this server has no expansion backend (sira serve --backend ...)";
    }
    if (restore()) search();
  });
})();
