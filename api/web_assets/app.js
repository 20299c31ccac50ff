// The page: the key field, the job and sweep lists (the server's newest, polled while anything
// runs) and the detail pane (a plan's or a sweep's views from the registry), routed by the URL's
// #hash. The submit forms are forms.js.
"use strict";

(() => {
  const { api, ApiFailure, tracked, el, fmt, FINISHED, viewsFor } = Planner;
  const POLL_BUSY_MS = 1000;
  const POLL_IDLE_MS = 5000;
  const $ = (id) => document.getElementById(id);

  const state = {
    config: { auth_required: false },
    listEndpoint: null, // null: not tried yet; false: the server has none (use tracked ids)
    sweepListEndpoint: null,
    jobs: new Map(), // id -> job view (finished ones never change)
    sweeps: new Map(), // id -> sweep view (with its plans)
    sweepList: new Map(), // id -> the server's list item (counts only)
    timelines: new Map(), // id -> promise of the replay
    detailKey: null,
    detailStatus: null,
  };

  function banner(text, isError) {
    const box = $("banner");
    if (!text) { box.hidden = true; return; }
    box.hidden = false;
    box.className = isError ? "error" : "";
    box.textContent = text;
  }

  function explain(error) {
    if (error instanceof ApiFailure && (error.status === 401 || error.status === 403)) {
      banner(error.status === 401
        ? "This server needs an API key: type it in the field at the top right and press Save."
        : "The API key is not valid for this server: " + error.message, true);
      $("api-key").focus();
      return true;
    }
    return false;
  }

  // -- the job lists --------------------------------------------------------------------------
  async function loadJobList() {
    if (state.listEndpoint === false) return [];
    try {
      const data = await api.get("v1/plans?limit=50");
      const items = Array.isArray(data) ? data : (data.plans || data.items || []);
      state.listEndpoint = true;
      for (const job of items) {
        const known = state.jobs.get(job.id);
        // List items leave out the plan: keep a full finished view when we have one, and mark
        // a merged entry as not full, so that opening it fetches the job with its plan.
        if (!known || !FINISHED.has(known.status) || known.status !== job.status) {
          state.jobs.set(job.id, { ...known, ...job, full: false });
        }
      }
      return items.map((j) => j.id);
    } catch (error) {
      if (error instanceof ApiFailure && [404, 405].includes(error.status)) {
        state.listEndpoint = false;
        return [];
      }
      throw error;
    }
  }

  async function loadSweepList() {
    if (state.sweepListEndpoint === false) return [];
    try {
      const items = (await api.get("v1/sweeps?limit=50")).sweeps || [];
      state.sweepListEndpoint = true;
      state.sweepList = new Map(items.map((item) => [item.id, item]));
      return items.map((s) => s.id);
    } catch (error) {
      if (error instanceof ApiFailure && [404, 405].includes(error.status)) {
        state.sweepListEndpoint = false;
        return [];
      }
      throw error;
    }
  }

  // A sweep's row: the server's list item, or counted from its view (opened, or an old server).
  function sweepRow(id) {
    const item = state.sweepList.get(id);
    const view = state.sweeps.get(id);
    if (item && (item.finished !== undefined && item.finished !== null || !view)) {
      return { id, method: item.method, created_at: item.created_at, plans: item.plans, finished: item.finished };
    }
    if (!view) return null;
    return { id, method: view.method, created_at: (item || {}).created_at, plans: view.plans.length,
      finished: view.plans.filter((p) => FINISHED.has(p.status)).length };
  }

  async function refreshJob(id) {
    const known = state.jobs.get(id);
    if (known && FINISHED.has(known.status) && known.full) return known;
    const job = { ...(await api.get(`v1/plans/${encodeURIComponent(id)}`)), full: true };
    state.jobs.set(id, job);
    return job;
  }

  async function refreshSweep(id) {
    const known = state.sweeps.get(id);
    if (known && known.plans.every((p) => FINISHED.has(p.status))) return known;
    const sweep = await api.get(`v1/sweeps/${encodeURIComponent(id)}`);
    state.sweeps.set(id, sweep);
    return sweep;
  }

  async function refreshLists() {
    const [listed, sweepsListed] = await Promise.all([loadJobList(), loadSweepList()]);
    const mine = tracked.all();
    const planIds = [...new Set([...listed, ...mine.filter((t) => t.kind === "plan").map((t) => t.id)])];
    await Promise.all(mine.filter((t) => t.kind === "plan").map((t) => refreshJob(t.id).catch((e) => {
      if (e instanceof ApiFailure && e.status === 404) tracked.remove(t.id);
      else throw e;
    })));
    // Tracked sweeps the server's list leaves out (older ones opened here) are fetched whole.
    const mySweeps = mine.filter((t) => t.kind === "sweep" && !state.sweepList.has(t.id)).map((t) => t.id);
    await Promise.all(mySweeps.map((id) => refreshSweep(id).catch((e) => {
      if (e instanceof ApiFailure && e.status === 404) tracked.remove(id);
      else throw e;
    })));
    $("jobs-source").textContent = state.listEndpoint
      ? "The server's newest jobs and sweeps, with those opened here."
      : "Jobs submitted or opened in this browser.";
    drawJobs(planIds.map((id) => state.jobs.get(id)).filter(Boolean));
    drawSweeps([...new Set([...sweepsListed, ...mySweeps])].map(sweepRow).filter(Boolean));
  }

  function progressCell(job) {
    if (job.status === "running") {
      const elapsed = fmt.since(job.started_at) || 0;
      const fraction = Math.min(1, elapsed / Math.max(1e-9, job.time_limit_s || 1));
      const best = job.progress && job.progress.best_objective;
      return el("div", { title: `${fmt.seconds(elapsed)} of ${fmt.seconds(job.time_limit_s)}` },
        el("div", { class: "bar" }, el("div", { style: `width: ${(100 * fraction).toFixed(1)}%` })),
        best !== null && best !== undefined ? el("span", { class: "small muted" }, "best " + fmt.number(best)) : null);
    }
    if (job.status === "done") {
      // List items carry the figures; a full view (opened, or an old server) has its report.
      const report = job.report || {};
      const overhead = job.overhead_percent ?? report.overhead_percent;
      const peak = job.peak_bytes ?? report.peak_bytes;
      return el("span", { title: "extra compute; peak device memory" },
        el("span", { class: "overhead" }, overhead === undefined || overhead === null ? "" : fmt.percent(overhead)),
        peak === undefined || peak === null ? null : el("div", { class: "peak small muted" }, "peak " + fmt.bytes(peak)));
    }
    if (job.status === "infeasible") return "no plan fits";
    if (job.status === "queued") return "waiting";
    return el("span", { class: "small error-text", title: job.error || "" }, (job.error || "").slice(0, 40));
  }

  function drawJobs(jobs) {
    jobs.sort((a, b) => (b.created_at || "").localeCompare(a.created_at || ""));
    const rows = jobs.map((job) => el("tr", {
      "data-id": job.id, "data-status": job.status,
      class: state.detailKey === "plan/" + job.id ? "selected" : null,
      onclick: () => open("plan", job.id),
    },
    el("td", { class: "mono", title: job.id }, fmt.shortId(job.id)),
    el("td", {}, el("span", { class: "status " + job.status }, job.status)),
    el("td", { class: "method", title: job.method }, job.method),
    el("td", { class: "num" }, fmt.bytes(job.budget_bytes)),
    el("td", { class: "progress" }, progressCell(job))));
    $("jobs").tBodies[0].replaceChildren(...(rows.length ? rows
      : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "no jobs yet"))]));
  }

  function drawSweeps(sweeps) {
    sweeps.sort((a, b) => (b.created_at || "").localeCompare(a.created_at || ""));
    const rows = sweeps.map((s) => el("tr", {
      "data-id": s.id, class: state.detailKey === "sweep/" + s.id ? "selected" : null,
      onclick: () => open("sweep", s.id),
    },
    el("td", { class: "mono", title: s.id }, fmt.shortId(s.id)),
    el("td", {}, s.method),
    el("td", { class: "num" }, String(s.plans)),
    el("td", { class: "num" }, s.finished === undefined || s.finished === null ? "–" : String(s.finished))));
    $("sweeps").tBodies[0].replaceChildren(...(rows.length ? rows
      : [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no sweeps yet"))]));
  }

  // -- the detail pane ------------------------------------------------------------------------
  function open(kind, id) {
    tracked.add(kind, id);
    if (location.hash !== `#${kind}/${id}`) location.hash = `#${kind}/${id}`; // -> hashchange
    else showDetail(true);
    setTimeout(() => tick(true), 0); // the lists show it at once
  }

  function timelineOf(id) {
    if (!state.timelines.has(id)) {
      const promise = api.get(`web/plans/${encodeURIComponent(id)}/timeline.json`);
      promise.catch(() => state.timelines.delete(id)); // ask again next time
      state.timelines.set(id, promise);
    }
    return state.timelines.get(id);
  }

  let generation = 0; // a newer call of showDetail abandons an older one still drawing

  async function showDetail(force) {
    const match = /^#(plan|sweep)\/([\w:-]+)$/.exec(location.hash);
    const pane = $("detail");
    if (!match) {
      state.detailKey = null;
      generation += 1;
      delete pane.dataset.ready;
      return;
    }
    const [, kind, id] = match;
    const key = `${kind}/${id}`;
    let ctx;
    let status;
    try {
      if (kind === "plan") {
        const job = await refreshJob(id);
        ctx = { job, plan: job.plan, timeline: () => timelineOf(id), open };
        status = job.status;
      } else {
        const sweep = await refreshSweep(id);
        ctx = { sweep, open };
        status = sweep.plans.map((p) => p.status).join(",");
      }
    } catch (error) {
      if (!explain(error)) pane.replaceChildren(el("h2", {}, key), el("p", { class: "error-text" }, error.message));
      return;
    }
    const unfinished = ctx.job ? !FINISHED.has(ctx.job.status) : !ctx.sweep.plans.every((p) => FINISHED.has(p.status));
    // Finished views never change: draw them once (the chart keeps its hover state).
    if (!force && key === state.detailKey && status === state.detailStatus && !unfinished) return;
    const mine = ++generation;
    state.detailKey = key;
    state.detailStatus = status;
    delete pane.dataset.ready;
    const title = el("h2", {}, kind === "plan" ? "Plan " : "Sweep ", el("code", { title: id }, fmt.shortId(id)));
    const body = [title];
    for (const view of viewsFor(ctx)) {
      const box = el("section", { class: "view", "data-view": view.name });
      if (view.title) box.append(el("h3", {}, view.title));
      body.push(box);
    }
    pane.replaceChildren(...body);
    for (const view of viewsFor(ctx)) {
      const box = pane.querySelector(`[data-view="${view.name}"]`);
      try {
        await view.render(box, ctx);
      } catch (error) {
        box.append(el("p", { class: "error-text" }, `${view.name}: ${error.message}`));
      }
      if (mine !== generation) return;
    }
    pane.dataset.ready = key; // tests and scripts wait for this
  }

  // -- submitting (forms.js) ------------------------------------------------------------------
  function opened(kind, answer) {
    if (kind === "plan" && answer.plan !== undefined) state.jobs.set(answer.id, { ...answer, full: true });
    if (kind === "sweep") state.sweeps.set(answer.id, answer);
    open(kind, answer.id);
    tick(true);
  }

  async function openById(id) {
    id = id.trim();
    if (!id) return;
    try {
      await refreshJob(id);
      open("plan", id);
    } catch (error) {
      if (!(error instanceof ApiFailure && error.status === 404)) { explain(error) || banner(error.message, true); return; }
      try {
        await refreshSweep(id);
        open("sweep", id);
      } catch (again) {
        if (!explain(again)) banner(`${id}: no plan or sweep with this id`, true);
      }
    }
  }

  // -- polling --------------------------------------------------------------------------------
  let timer = null;
  let busy = false;

  function anythingRunning() {
    for (const job of state.jobs.values()) if (!FINISHED.has(job.status)) return true;
    for (const s of state.sweeps.values()) if (s.plans.some((p) => !FINISHED.has(p.status))) return true;
    for (const s of state.sweepList.values()) if (s.finished !== null && s.finished < s.plans) return true;
    return false;
  }

  async function tick(now) {
    if (busy) return;
    clearTimeout(timer);
    busy = true;
    try {
      await refreshLists();
      await showDetail(false);
      if (!$("banner").classList.contains("error")) banner(null);
    } catch (error) {
      if (!explain(error)) banner("cannot reach the server: " + error.message, true);
    } finally {
      busy = false;
      const delay = anythingRunning() && !document.hidden ? POLL_BUSY_MS : POLL_IDLE_MS;
      timer = setTimeout(tick, now === true ? POLL_BUSY_MS : delay);
    }
  }

  async function serverStatus() {
    try {
      const ready = await fetch("readyz").then((r) => r.json());
      $("server-status").textContent = ready.status === "ready"
        ? `${ready.database} · ${ready.workers} workers · ${ready.running} running`
        : "not ready";
    } catch (_) {
      $("server-status").textContent = "server unreachable";
    }
  }

  let forms = null;

  async function init() {
    forms = Planner.forms.install({ explain, opened });
    try {
      state.config = await fetch("web/config.json").then((r) => r.json());
    } catch (_) { /* defaults */ }
    $("docs-link").href = (state.config.docs_url || "/docs").replace(/^\//, "");
    $("api-key").value = api.key();
    if (state.config.auth_required && !api.key()) {
      banner("This server needs an API key: type it in the field at the top right and press Save.", true);
    }
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      api.setKey($("api-key").value.trim());
      banner(null);
      state.listEndpoint = null;
      state.sweepListEndpoint = null;
      forms.reload();
      tick(true);
    });
    $("key-forget").addEventListener("click", () => { api.setKey(""); $("api-key").value = ""; });
    $("open-form").addEventListener("submit", (event) => { event.preventDefault(); openById($("open-id").value); });
    window.addEventListener("hashchange", () => showDetail(true));
    document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(true); });
    serverStatus();
    setInterval(serverStatus, 10000);
    await forms.reload();
    tick(true);
  }

  init();
})();
