// The page's forms: a plan or a sweep (optionally on a machine named by preset, with host memory
// for offloading) and a pipeline partition; the choices they offer come from the API
// (/v1/methods, /v1/resources/presets). app.js installs them with what they need from it.
"use strict";

Planner.forms = (() => {
  const { api, el, fmt, parseSize } = Planner;
  const $ = (id) => document.getElementById(id);

  function budgetValue(text) {
    const t = text.trim();
    if (/^\d+$/.test(t)) return Number(t);
    if (/^\d*\.\d+$/.test(t)) return Number(t);
    return t;
  }

  async function graphPart() {
    const source = $("graph-source").value;
    if (source === "id") return { graph_id: $("graph-id").value.trim() };
    if (source === "file") {
      const file = $("graph-file").files[0];
      if (!file) throw new Error("choose a graph.json file first");
      try { return { graph: JSON.parse(await file.text()) }; } catch (e) {
        throw new Error(`${file.name}: not JSON (${e.message})`);
      }
    }
    const response = await fetch("web/examples/resnet24.json");
    return { graph: await response.json() };
  }

  // The machine: none (one device of the budget), or a preset with host memory overriding it.
  function resourcesPart() {
    const preset = $("resources-preset").value;
    const host = $("host-memory").value.trim();
    if (!preset) {
      if (host) throw new Error("host memory: pick a machine first (host memory is part of one)");
      return {};
    }
    return { resources: host ? { preset, host_memory_bytes: parseSize(host, "host memory") } : preset };
  }

  // Disables a form's buttons while `work` runs, and says how it went in `message`.
  async function sending(form, message, explain, work) {
    message.className = "muted";
    message.textContent = "sending…";
    for (const b of form.querySelectorAll("button")) b.disabled = true;
    try {
      message.textContent = await work();
    } catch (error) {
      if (!explain(error)) {
        message.className = "error-text";
        message.textContent = error.message;
      } else {
        message.textContent = "";
      }
    } finally {
      for (const b of form.querySelectorAll("button")) b.disabled = false;
    }
  }

  function submit(kind, page) {
    return sending($("submit-form"), $("submit-message"), page.explain, async () => {
      const body = { ...(await graphPart()), ...resourcesPart(), method: $("method").value };
      const limit = Number($("time-limit").value);
      if (limit > 0) body.time_limit = limit;
      if (kind === "plan") {
        const budget = $("budget").value.trim();
        if (budget || !body.resources) body.budget = budgetValue(budget);
        const { data } = await api.post("v1/plans", body);
        page.opened("plan", data);
        return data.status === "done" ? `plan ${fmt.shortId(data.id)}: answered from the store`
          : `plan ${fmt.shortId(data.id)} sent`;
      }
      const budgets = $("sweep-budgets").value.split(",").map((s) => s.trim()).filter(Boolean);
      if (!budgets.length) throw new Error("list the sweep's budgets, e.g. 0.5, 0.7, 0.9");
      body.budgets = budgets.map(budgetValue);
      const { data } = await api.post("v1/sweeps", body);
      page.opened("sweep", data);
      return `sweep ${fmt.shortId(data.id)} of ${data.plans.length} budgets sent`;
    });
  }

  // POST /v1/partitions with the graph chosen in the plan form; the answer is a plan job.
  function submitPartition(page) {
    return sending($("partition-form"), $("partition-message"), page.explain, async () => {
      const graph = await graphPart();
      if (!graph.graph) throw new Error("a partition needs the graph itself: pick the example or a file");
      const memory = $("pp-device-memory").value.trim();
      const body = {
        graph: graph.graph,
        devices: Number($("pp-devices").value),
        device_memory: /^\d+$/.test(memory) ? Number(memory) : memory,
        microbatches: Number($("pp-microbatches").value),
        schedule: $("pp-schedule").value,
        method: $("pp-method").value,
      };
      const { data } = await api.post("v1/partitions", body);
      page.opened("plan", data);
      return `partition ${fmt.shortId(data.id)} sent`;
    });
  }

  async function loadMethods(explain) {
    try {
      const methods = await api.get("v1/methods");
      // The plan form plans for one device; pipeline partitioners are the partition form's.
      const oneDevice = methods.filter((m) => !(m.plan_kinds || []).includes("pipeline"));
      $("method").replaceChildren(...oneDevice.map((m) => el("option", {
        value: m.name, selected: m.name === "auto",
        title: (m.summary || m.plugin || "") + (m.needs_host_tier ? " (needs a machine with host memory)" : ""),
      }, m.name + (m.needs_host_tier ? " (host)" : ""))));
      const pipeline = methods.filter((m) => (m.plan_kinds || []).includes("pipeline"));
      $("pp-method").replaceChildren(...pipeline.map((m) => {
        const short = m.name.replace(/^pipeline-/, "");
        return el("option", { value: short, selected: short === "dp", title: m.summary || "" }, short);
      }));
    } catch (error) { explain(error); }
  }

  async function loadPresets(explain) {
    try {
      const presets = await api.get("v1/resources/presets");
      $("resources-preset").replaceChildren(
        el("option", { value: "" }, "none: one device of the budget"),
        ...presets.map((p) => el("option", { value: p.name, title: p.summary },
          `${p.name} (${fmt.bytes(p.device_memory_bytes)})`)));
    } catch (error) {
      if (!(error instanceof Planner.ApiFailure && error.status === 404)) explain(error);
    }
  }

  // page: {explain(error) -> handled?, opened(kind, answer)}.
  function install(page) {
    $("submit-form").addEventListener("submit", (event) => { event.preventDefault(); submit("plan", page); });
    $("submit-sweep").addEventListener("click", () => submit("sweep", page));
    $("partition-form").addEventListener("submit", (event) => { event.preventDefault(); submitPartition(page); });
    $("graph-source").addEventListener("change", () => {
      $("graph-file").hidden = $("graph-source").value !== "file";
      $("graph-id").hidden = $("graph-source").value !== "id";
    });
    return { reload: () => Promise.all([loadMethods(page.explain), loadPresets(page.explain)]) };
  }

  return { install };
})();
