// What both views share: building elements (text always goes in as text nodes, never as markup), calls to the
// JSON API with the bearer token the user typed (kept in sessionStorage, for this tab only), the header.
"use strict";

const SIRA = (() => {
  const TOKEN_KEY = "sira-token";
  // One page, two views: /compare shows the compare view, every other path the search view.
  const view = location.pathname.replace(/\/+$/, "") === "/compare" ? "compare" : "search";
  document.getElementById(view + "-view").hidden = false;
  document.getElementById("nav-" + view).setAttribute("aria-current", "page");
  document.title = view === "compare" ? "SIRA: compare runs" : "SIRA: search";

  // el("li", {class: "x", title: "y", data: {docId: "d1"}}, "text", childNode, ...): strings become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "data") Object.assign(node.dataset, value);
      else if (key === "style") Object.assign(node.style, value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    return add(node, ...children);
  }

  // Appends children to `node`: nested arrays flattened, null / undefined / false skipped, strings as text.
  function add(node, ...children) {
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // Replaces the children of `node` (with `children`, as add() takes them).
  function clear(node, ...children) {
    node.replaceChildren();
    return add(node, ...children);
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // GET (no body) or POST (a JSON body) to this server; the answer's JSON, or an ApiError with its "error".
  async function api(path, body) {
    const headers = {Accept: "application/json"};
    if (token()) headers.Authorization = "Bearer " + token();
    const init = {headers, cache: "no-store"};
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (exc) {
      throw new ApiError(0, "the server does not answer (" + exc.message + ")");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (exc) {
      data = null;
    }
    if (!response.ok) {
      throw new ApiError(response.status, (data && data.error) || response.statusText);
    }
    return data;
  }

  function notice(message) {
    const box = document.getElementById("notice");
    box.textContent = message || "";
    box.hidden = !message;
  }

  // A failed call, said on the page; a 401 points at the token field.
  function failed(exc) {
    if (exc.status === 401) {
      notice("This server needs its API token (" + exc.message + "): type it in the field at the top right.");
      document.getElementById("token").focus();
    } else {
      notice((exc.status ? "HTTP " + exc.status + ": " : "") + exc.message);
    }
  }

  function fmt(x, digits) {
    return typeof x === "number" ? x.toFixed(digits === undefined ? 4 : digits) : "";
  }

  function signed(x, digits) {
    return (x > 0 ? "+" : x < 0 ? "\u2212" : "\u00b1") + Math.abs(x).toFixed(digits === undefined ? 4 : digits);
  }

  // The header: what the server serves (GET /health needs no token) and the token field; `onToken` runs after a
  // token is set (to retry what failed).
  async function header(onToken) {
    const field = document.getElementById("token");
    field.value = token();
    document.getElementById("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      if (field.value.trim()) sessionStorage.setItem(TOKEN_KEY, field.value.trim());
      else sessionStorage.removeItem(TOKEN_KEY);
      notice("");
      if (onToken) onToken();
    });
    let health = null;
    try {
      health = await api("/health");
    } catch (exc) {
      health = null;
    }
    const server = document.getElementById("server");
    if (health) {
      const expansion = health.expansion ? "expansion " + health.expansion.model : "no expansion backend";
      server.textContent = "index v" + health.index_version + " \u00b7 " + health.preset
        + (health.enriched ? " (enriched)" : "") + " \u00b7 " + health.num_docs + " docs \u00b7 " + expansion;
    }
    return health;
  }

  // Chips of terms: <span class="chip">term</span> ...
  function chips(terms, cls) {
    return terms.map((t) => el("span", {class: "chip" + (cls ? " " + cls : "")}, t));
  }

  return {view, el, add, clear, api, notice, failed, fmt, signed, header, chips, ApiError};
})();
