// The page's shared pieces: the API client (Bearer key from localStorage), DOM and number
// helpers, the locally tracked job ids, and the view registry that views.js fills.
"use strict";

const Planner = (() => {
  const KEY_STORAGE = "planner.apiKey";
  const TRACKED_STORAGE = "planner.trackedJobs";
  const MAX_TRACKED = 50;

  class ApiFailure extends Error {
    constructor(status, message, body) {
      super(message);
      this.status = status;
      this.body = body;
    }
  }

  const api = {
    key() { return localStorage.getItem(KEY_STORAGE) || ""; },
    setKey(key) {
      if (key) localStorage.setItem(KEY_STORAGE, key);
      else localStorage.removeItem(KEY_STORAGE);
    },
    // Relative paths ("v1/plans"): the page works under any prefix the server is mounted at.
    async call(method, path, body) {
      const headers = { Accept: "application/json" };
      const key = api.key();
      if (key) headers.Authorization = "Bearer " + key;
      const init = { method, headers };
      if (body !== undefined) {
        headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
      const response = await fetch(path, init);
      let data = null;
      try { data = await response.json(); } catch (_) { data = null; }
      if (!response.ok) {
        const message = (data && data.error && data.error.message) || response.statusText;
        throw new ApiFailure(response.status, message, data);
      }
      return { status: response.status, data };
    },
    get(path) { return api.call("GET", path).then((r) => r.data); },
    post(path, body) { return api.call("POST", path, body); },
  };

  // Ids this browser submitted or opened: listed with the server's newest (which may have
  // scrolled past them), and the lists themselves when the server has no list endpoints.
  const tracked = {
    all() {
      try { return JSON.parse(localStorage.getItem(TRACKED_STORAGE) || "[]"); } catch (_) { return []; }
    },
    add(kind, id) {
      const rest = tracked.all().filter((t) => t.id !== id);
      rest.unshift({ kind, id, added: Date.now() });
      localStorage.setItem(TRACKED_STORAGE, JSON.stringify(rest.slice(0, MAX_TRACKED)));
    },
    remove(id) {
      localStorage.setItem(TRACKED_STORAGE, JSON.stringify(tracked.all().filter((t) => t.id !== id)));
    },
  };

  // el("td", {class: "num"}, "text", childNode): text is always set as text, never as HTML
  // (node names and error messages come from user input).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const fmt = {
    bytes(n) {
      if (n === null || n === undefined) return "–";
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let v = Number(n);
      let u = 0;
      while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
      const text = u === 0 ? String(v) : String(v >= 100 ? Number(v.toFixed(1)) : Number(v.toPrecision(3)));
      return text + " " + units[u];
    },
    percent(x, digits = 2) {
      if (x === null || x === undefined) return "–";
      return (x >= 0 ? "+" : "") + Number(x).toFixed(digits) + " %";
    },
    number(x, digits = 3) {
      if (x === null || x === undefined) return "–";
      const v = Number(x);
      return Math.abs(v) >= 1e6 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(digits) : v.toFixed(digits);
    },
    seconds(s) {
      if (s === null || s === undefined) return "–";
      return s < 60 ? s.toFixed(s < 10 ? 2 : 1) + " s" : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    },
    shortId(id) { return String(id).slice(0, 8); },
    since(iso) {
      if (!iso) return null;
      return (Date.now() - Date.parse(iso)) / 1000;
    },
  };

  // "64GiB", "900 MB", "1e9", "12000000000" -> bytes (the budget grammar's units); Error else.
  const SIZE_UNITS = { B: 1, KB: 1e3, MB: 1e6, GB: 1e9, TB: 1e12,
    KIB: 2 ** 10, MIB: 2 ** 20, GIB: 2 ** 30, TIB: 2 ** 40 };
  function parseSize(text, what) {
    const match = /^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)\s*$/i.exec(text || "");
    const unit = match && (match[2] ? SIZE_UNITS[match[2].toUpperCase()] : 1);
    if (!unit) throw new Error(`${what}: ${JSON.stringify(text)} is not a size; write e.g. 64GiB or 900MB`);
    return Math.round(Number(match[1]) * unit);
  }

  // Hands a Blob to the browser as a download named `name`.
  function saveBlob(blob, name) {
    const link = el("a", { href: URL.createObjectURL(blob), download: name, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  }

  // A view is one function per kind of thing drawn: {title, applies(ctx), render(container, ctx)}.
  // ctx = {job, plan, sweep, timeline (a promise of the simulator's replay)}.
  const views = [];
  function registerView(name, view) {
    views.push({ name, order: views.length, ...view });
  }
  function viewsFor(ctx) {
    return views.filter((v) => v.applies(ctx));
  }

  const FINISHED = new Set(["done", "infeasible", "failed", "cancelled"]);

  return { api, ApiFailure, tracked, el, fmt, parseSize, saveBlob, registerView, viewsFor, views,
    FINISHED };
})();
