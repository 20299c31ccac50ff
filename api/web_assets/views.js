// The views of a plan or a sweep, one function each, registered in Planner's view registry.
// To add a view (the offload timeline from timeline.memory_trace, the pipeline schedule grid
// from plan.rank_actions), register one more: Planner.registerView(name, {title, applies, render}).
"use strict";

(() => {
  const { el, fmt, registerView, FINISHED, charts } = Planner;
  const OP_LETTER = { compute: "C", free: "F", offload: "O", prefetch: "P", drop: "D" };

  function figure(label, value, title) {
    return el("div", { class: "figure", title },
      el("div", { class: "label" }, label), el("div", { class: "value" }, value));
  }

  function chartWidth(container) {
    return Math.max(420, Math.floor(container.clientWidth || 860));
  }

  function actionText(action) {
    if (typeof action === "string") return action;
    return (OP_LETTER[action.op] || action.op) + action.node;
  }

  // -- a plan -----------------------------------------------------------------------------
  registerView("summary", {
    title: null,
    applies: (ctx) => Boolean(ctx.job),
    render(box, { job, plan }) {
      const report = job.report || {};
      const predicted = (plan && plan.predicted) || {};
      const peak = predicted.peak_bytes ?? report.peak_bytes;
      const overhead = predicted.overhead ?? (report.overhead_percent === undefined ? undefined : report.overhead_percent / 100);
      const storeAll = report.store_all_peak_bytes;
      const figures = el("div", { class: "figures" },
        figure("status", el("span", { class: "status " + job.status }, job.status)),
        figure("method", plan ? `${plan.method} / ${plan.backend}` : job.method),
        figure("budget", fmt.bytes(job.budget_bytes) + (storeAll ? ` (${Math.round(100 * job.budget_bytes / storeAll)} %)` : ""),
          `${job.budget_bytes} bytes` + (storeAll ? "; % of the store-all peak" : "")),
        storeAll ? figure("store-all peak", fmt.bytes(storeAll), "peak when every output is kept") : null,
        report.smallest_feasible_bytes ? figure("smallest that fits", fmt.bytes(report.smallest_feasible_bytes),
          "the smallest budget that worked for the methods tried") : null,
        figure("peak", peak === undefined ? "–" : fmt.bytes(peak),
          peak === undefined ? null : `${peak} bytes`),
        figure("overhead", overhead === undefined ? "–" : fmt.percent(100 * overhead, 3),
          "extra compute from recomputation"),
        plan && plan.kind ? figure("kind", plan.kind) : null,
        plan && plan.gap !== null && plan.gap !== undefined ? figure("gap", fmt.percent(100 * plan.gap, 3).replace("+", "")) : null,
        figure("solve time", fmt.seconds(job.solve_seconds)),
        plan && plan.actions ? figure("actions", String(plan.actions.length)) : null,
        predicted.makespan_ms !== undefined && predicted.makespan_ms !== null ? figure("step time", fmt.number(predicted.makespan_ms, 2) + " ms") : null,
        predicted.host_peak_bytes ? figure("host peak", fmt.bytes(predicted.host_peak_bytes)) : null,
      );
      box.append(figures);
      if (job.error) box.append(el("p", { class: "error-text" }, job.error));
      // Why nothing fits and the least memory that would, how a partition was chosen, ...
      for (const note of (plan && plan.notes) || report.notes || []) box.append(el("p", { class: "note small" }, note));
      const graphLine = el("p", { class: "muted small" }, "graph ", el("code", {}, job.graph_id),
        " · created ", new Date(job.created_at).toLocaleString(),
        job.cached ? " · answered from the store" : "");
      box.append(graphLine);
    },
  });

  registerView("downloads", {
    title: null,
    applies: (ctx) => Boolean(ctx.plan),
    render(box, { job, plan }) {
      // The plan.json that `planner-cli validate` and `runtime.apply` read, from the view the
      // page already holds (a link to the API could not send the key).
      const blob = new Blob([JSON.stringify(plan, null, 2) + "\n"], { type: "application/json" });
      box.append(el("p", { class: "small" }, "Download ",
        el("a", { href: URL.createObjectURL(blob), download: `plan-${fmt.shortId(job.id)}.json`,
          id: "download-plan" }, "plan.json"),
        el("span", { class: "muted" }, ` (${fmt.bytes(blob.size)})`)));
    },
  });

  registerView("progress", {
    title: "Progress",
    applies: (ctx) => Boolean(ctx.job) && !FINISHED.has(ctx.job.status),
    render(box, { job }) {
      const elapsed = job.started_at ? fmt.since(job.started_at) : 0;
      const fraction = Math.min(1, elapsed / Math.max(1e-9, job.time_limit_s));
      const progress = job.progress || {};
      box.append(
        el("p", {}, job.status === "queued" ? "Waiting for a worker…"
          : `Solving for ${fmt.seconds(elapsed)} of at most ${fmt.seconds(job.time_limit_s)}`),
        el("div", { class: "bar", title: "time used of the time limit" },
          el("div", { style: `width: ${(100 * fraction).toFixed(1)}%` })),
        el("div", { class: "figures" },
          figure("best objective", fmt.number(progress.best_objective)),
          figure("best bound", fmt.number(progress.best_bound)),
          figure("attempt", String(job.attempts))),
      );
    },
  });

  registerView("timeline", {
    title: "Memory over the schedule",
    applies: (ctx) => Boolean(ctx.plan) && (ctx.plan.actions || []).length > 0,
    async render(box, ctx) {
      const { job } = ctx;
      const holder = el("div", { class: "chart-wrap" }, el("p", { class: "muted" }, "simulating…"));
      box.append(holder);
      let data;
      try {
        data = await ctx.timeline();
      } catch (error) {
        holder.replaceChildren(await timelineImage(job, error));
        return;
      }
      const names = data.node_names || {};
      const series = data.points.map((p) => [p[0], p[2]]);
      const chart = charts.memoryStepChart({
        series,
        width: chartWidth(box),
        marks: {
          budget: data.budget_bytes,
          fixed: data.fixed_bytes,
          peak: [data.peak_action_index, data.peak_bytes],
        },
        onHover(x) {
          const p = data.points[Math.max(0, Math.min(data.points.length - 1, x))];
          if (!p) return null;
          const node = Number(p[1].slice(1));
          const name = names[String(node)];
          return `${p[0]}: ${p[1]}${name ? " (" + name + ")" : ""} · ${fmt.bytes(p[2])}`;
        },
      });
      holder.replaceChildren(chart, charts.saveButtons(chart, `memory-${fmt.shortId(job.id)}`),
        el("div", { class: "legend" },
          el("span", { style: "--c: #2563eb" }, "live memory"),
          el("span", { style: "--c: #dc2626" }, "budget"),
          el("span", { style: "--c: #6b7280" }, "fixed (parameters, inputs)"),
          el("span", { style: "--c: #f59e0b" }, `peak ${fmt.bytes(data.peak_bytes)} at action ` +
            `${data.peak_action_index} (${(data.points[data.peak_action_index] || [])[1] || "?"})`)));
    },
  });

  // The server's PNG, when the JSON replay is not available (fetched with the key: an <img
  // src> cannot send it).
  async function timelineImage(job, why) {
    if (!job.timeline_url) return el("p", { class: "error-text" }, String(why.message || why));
    const headers = Planner.api.key() ? { Authorization: "Bearer " + Planner.api.key() } : {};
    const response = await fetch(job.timeline_url.replace(/^\//, ""), { headers });
    if (!response.ok) return el("p", { class: "error-text" }, String(why.message || why));
    const url = URL.createObjectURL(await response.blob());
    return el("img", { src: url, alt: "memory timeline", class: "chart timeline-png" });
  }

  // A pipeline partition: each rank's stages (their layers) and its peak against the device.
  registerView("stages", {
    title: "Pipeline stages",
    applies: (ctx) => Boolean(ctx.plan && ctx.plan.partition),
    render(box, { plan }) {
      const predicted = plan.predicted || {};
      const peaks = predicted.per_rank_peak_bytes || [];
      const device = (plan.resources || {}).device_memory_bytes;
      const details = plan.details || {};
      box.append(el("p", { class: "muted" },
        `${(plan.resources || {}).device_count || "?"} devices of ${fmt.bytes(device)}, ` +
        `${details.microbatches ?? "?"} micro-batches, ${details.schedule || "?"}` +
        (predicted.bubble_fraction !== undefined && predicted.bubble_fraction !== null
          ? ` · bubble ${(100 * predicted.bubble_fraction).toFixed(1)} %` : "") +
        (predicted.makespan_ms ? ` · step ${fmt.number(predicted.makespan_ms, 1)} ms` : "")));
      const rows = plan.partition.stages.map((stage) => {
        const layers = stage.modules.length ? stage.modules : stage.nodes.map(String);
        const peak = peaks[stage.rank];
        return el("tr", { "data-stage": stage.stage_index },
          el("td", { class: "num" }, String(stage.stage_index)),
          el("td", { class: "num" }, String(stage.rank)),
          el("td", { title: layers.join(" ") }, layers.length > 2
            ? `${layers[0]} … ${layers[layers.length - 1]} (${layers.length})` : layers.join(", ")),
          el("td", { class: "num" }, peak === undefined ? "–" : fmt.bytes(peak)));
      });
      box.append(el("table", { class: "stages-table" },
        el("thead", {}, el("tr", {}, el("th", { class: "num" }, "stage"), el("th", { class: "num" }, "rank"),
          el("th", {}, "layers"), el("th", { class: "num" }, "rank peak"))),
        el("tbody", {}, rows)));
    },
  });

  registerView("actions", {
    title: "Actions",
    applies: (ctx) => Boolean(ctx.plan) && ((ctx.plan.actions || []).length > 0 || ctx.plan.rank_actions),
    async render(box, ctx) {
      const { plan } = ctx;
      const copy = el("button", { type: "button" }, "Copy");
      if (plan.rank_actions) {
        const text = plan.rank_actions.map((r, i) => `rank ${i}: ${r.join(" ")}`).join("\n");
        copy.addEventListener("click", () => navigator.clipboard.writeText(text));
        box.append(el("pre", { class: "actions" }, text), copy);
        return;
      }
      const tokens = plan.actions.map(actionText);
      const text = tokens.join(" ");
      copy.addEventListener("click", () => navigator.clipboard.writeText(text));
      const pre = el("pre", { class: "actions", id: "actions-text" }, text);
      box.append(el("p", { class: "muted small" },
        "C compute, F free, O offload, P prefetch, D drop host copy; node ids of the graph. ",
        "The peak action is highlighted."), pre, copy);
      // Highlight the action at the peak once the replay is known (it may take a moment).
      try {
        const data = await ctx.timeline();
        const i = data.peak_action_index;
        if (i >= 0 && i < tokens.length) {
          const before = tokens.slice(0, i).join(" ");
          const after = tokens.slice(i + 1).join(" ");
          pre.replaceChildren(before + (before ? " " : ""),
            el("mark", { title: "peak memory " + fmt.bytes(data.peak_bytes) }, tokens[i]),
            (after ? " " : "") + after);
        }
      } catch (_) { /* the plain text stays */ }
    },
  });

  // -- a sweep ------------------------------------------------------------------------------
  registerView("pareto", {
    title: "Overhead over budget",
    applies: (ctx) => Boolean(ctx.sweep),
    render(box, { sweep, open }) {
      const plans = [...sweep.plans].sort((a, b) => a.budget_bytes - b.budget_bytes);
      const points = plans.map((p) => ({
        budget: p.budget_bytes, overhead: p.overhead_percent, id: p.id, status: p.status,
        own: !p.answered_by || p.answered_by === p.id,
      }));
      const done = plans.filter((p) => FINISHED.has(p.status)).length;
      box.append(el("p", { class: "muted" }, `${sweep.method} on graph `, el("code", {}, sweep.graph_id),
        ` · ${done} of ${plans.length} finished`));
      if (done > 0) {
        const chart = charts.paretoChart({ points, width: chartWidth(box),
          onClick: (p) => open("plan", p.id) });
        box.append(chart, charts.saveButtons(chart, `sweep-${fmt.shortId(sweep.id)}`));
        box.append(el("div", { class: "legend" },
          el("span", { style: "--c: #2563eb" }, "frontier (overhead never rises with the budget)"),
          el("span", { class: "hollow" }, "answered by a smaller budget's plan"),
          el("span", { class: "cross" }, "no plan fits")));
      }
      const rows = plans.map((p) => el("tr", { onclick: () => open("plan", p.id) },
        el("td", { class: "num" }, fmt.bytes(p.budget_bytes)),
        el("td", {}, el("span", { class: "status " + p.status }, p.status)),
        el("td", { class: "num" }, p.peak_bytes === null ? "–" : fmt.bytes(p.peak_bytes)),
        el("td", { class: "num" }, fmt.percent(p.overhead_percent, 3)),
        el("td", { class: "mono" }, p.answered_by && p.answered_by !== p.id ? "← " + fmt.shortId(p.answered_by) : fmt.shortId(p.id))));
      box.append(el("table", { class: "sweep-table" },
        el("thead", {}, el("tr", {}, el("th", { class: "num" }, "budget"), el("th", {}, "status"),
          el("th", { class: "num" }, "peak"), el("th", { class: "num" }, "overhead"), el("th", {}, "plan"))),
        el("tbody", {}, rows)));
    },
  });
})();
