// Small SVG charts (no library): a step line of memory over actions and a scatter/step of
// overhead over budget. Each returns an element; sizes follow the container's width. Each can
// be saved as an SVG or a PNG file (saveButtons).
"use strict";

Planner.charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const { fmt } = Planner;

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // Round tick steps (1, 2, 5 × 10^k) over [0, max].
  function ticks(max, count) {
    if (!(max > 0)) return [0];
    const raw = max / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
    return out;
  }

  // Byte ticks in powers of two when the range is large enough, so labels read 2 GiB, 4 GiB.
  function byteTicks(max, count) {
    const units = [1, 1024, 1024 ** 2, 1024 ** 3, 1024 ** 4];
    let unit = 1;
    for (const u of units) if (max / u >= 1) unit = u;
    return ticks(max / unit, count).map((v) => v * unit);
  }

  // Keep the shape of a long series within ~2 points per pixel: per bucket its first, min and
  // max values (the peak is never dropped).
  function downsample(points, width) {
    const limit = Math.max(200, Math.floor(width * 2));
    if (points.length <= limit) return points;
    const per = Math.ceil(points.length / (limit / 3));
    const out = [];
    for (let i = 0; i < points.length; i += per) {
      const bucket = points.slice(i, i + per);
      let lo = bucket[0];
      let hi = bucket[0];
      for (const p of bucket) {
        if (p[1] < lo[1]) lo = p;
        if (p[1] > hi[1]) hi = p;
      }
      const picked = [bucket[0], lo, hi].sort((a, b) => a[0] - b[0]);
      for (const p of picked) if (out[out.length - 1] !== p) out.push(p);
    }
    return out;
  }

  function frame(width, height, margin) {
    return {
      width, height, margin,
      x0: margin.left, x1: width - margin.right, y0: height - margin.bottom, y1: margin.top,
    };
  }

  function hline(f, y, cls, color, dash, label, left) {
    const g = svg("g", {});
    g.append(svg("line", { x1: f.x0, x2: f.x1, y1: y, y2: y, stroke: color, "stroke-width": 1.5,
      "stroke-dasharray": dash, class: cls }));
    if (label) {
      // Left labels go under their line: the series starts near the fixed memory.
      g.append(svg("text", { x: left ? f.x0 + 6 : f.x1 - 4, y: left ? y + 13 : y - 4,
        "text-anchor": left ? "start" : "end", class: "label" }, label));
    }
    return g;
  }

  // series: [[x, bytes], ...] drawn as a step line (value holds until the next x).
  // marks: {budget, peak: [x, bytes], fixed}; onHover(x) -> text for the tooltip.
  function memoryStepChart({ series, width, height = 300, marks = {}, xLabel = "action", onHover }) {
    const f = frame(width, height, { left: 72, right: 16, top: 16, bottom: 40 });
    const xs = series.map((p) => p[0]);
    const xMin = xs.length ? xs[0] : 0;
    const xMax = xs.length ? xs[xs.length - 1] + 1 : 1;
    const yMax = Math.max(1, marks.budget || 0, marks.peak ? marks.peak[1] : 0,
      ...series.map((p) => p[1])) * 1.08;
    const sx = (x) => f.x0 + ((x - xMin) / Math.max(1e-9, xMax - xMin)) * (f.x1 - f.x0);
    const sy = (y) => f.y0 - (y / yMax) * (f.y0 - f.y1);
    const root = svg("svg", { class: "chart memory-chart", width, height,
      viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "memory timeline" });
    root.append(svg("rect", { x: 0, y: 0, width, height, fill: "#fff" }));
    for (const t of byteTicks(yMax / 1.08, 5)) {
      root.append(svg("line", { class: "grid", x1: f.x0, x2: f.x1, y1: sy(t), y2: sy(t) }));
      root.append(svg("text", { x: f.x0 - 6, y: sy(t) + 4, "text-anchor": "end" }, fmt.bytes(t)));
    }
    for (const t of ticks(xMax - xMin, 8)) {
      const x = sx(xMin + t);
      root.append(svg("line", { class: "axis", x1: x, x2: x, y1: f.y0, y2: f.y0 + 4 }));
      root.append(svg("text", { x, y: f.y0 + 16, "text-anchor": "middle" }, Math.round(xMin + t)));
    }
    root.append(svg("text", { x: (f.x0 + f.x1) / 2, y: height - 6, "text-anchor": "middle" }, xLabel));
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x1, y1: f.y0, y2: f.y0 }));
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x0, y1: f.y0, y2: f.y1 }));

    const pts = downsample(series, f.x1 - f.x0);
    let d = "";
    pts.forEach((p, i) => {
      const x = sx(p[0]);
      const y = sy(p[1]);
      d += i === 0 ? `M${x.toFixed(1)},${y.toFixed(1)}` : `H${x.toFixed(1)}V${y.toFixed(1)}`;
    });
    if (pts.length) d += `H${sx(xMax).toFixed(1)}`;
    if (pts.length) {
      root.append(svg("path", { d: `${d}V${f.y0}H${sx(pts[0][0]).toFixed(1)}Z`, fill: "#bfdbfe",
        "fill-opacity": 0.55, stroke: "none", class: "area" }));
      root.append(svg("path", { d, fill: "none", stroke: "#2563eb", "stroke-width": 1.6, class: "line" }));
    }
    if (marks.fixed) root.append(hline(f, sy(marks.fixed), "fixed", "#6b7280", "2 3", "fixed " + fmt.bytes(marks.fixed), true));
    if (marks.budget) root.append(hline(f, sy(marks.budget), "budget", "#dc2626", "6 4", "budget " + fmt.bytes(marks.budget)));
    if (marks.peak) {
      const [px, py] = marks.peak;
      // Its value is in the legend: a label here would sit on the budget line.
      root.append(svg("circle", { cx: sx(px), cy: sy(py), r: 4.5, fill: "#f59e0b", stroke: "#92400e", class: "peak" },
        svg("title", {}, "peak " + fmt.bytes(py))));
    }
    if (onHover) attachHover(root, f, sx, xMin, xMax, onHover);
    return root;
  }

  function attachHover(root, f, sx, xMin, xMax, onHover) {
    const cursor = svg("line", { x1: 0, x2: 0, y1: f.y1, y2: f.y0, stroke: "#111827",
      "stroke-width": 0.8, visibility: "hidden" });
    const label = svg("text", { x: f.x0 + 6, y: f.y1 + 12, visibility: "hidden" });
    const overlay = svg("rect", { x: f.x0, y: f.y1, width: f.x1 - f.x0, height: f.y0 - f.y1,
      fill: "transparent" });
    overlay.addEventListener("mousemove", (event) => {
      const box = root.getBoundingClientRect();
      const px = (event.clientX - box.left) * (f.width / box.width);
      const x = Math.floor(xMin + ((px - f.x0) / (f.x1 - f.x0)) * (xMax - xMin));
      const text = onHover(x);
      if (!text) return;
      cursor.setAttribute("x1", sx(x)); cursor.setAttribute("x2", sx(x));
      cursor.setAttribute("visibility", "visible");
      label.textContent = text;
      label.setAttribute("visibility", "visible");
    });
    overlay.addEventListener("mouseleave", () => {
      cursor.setAttribute("visibility", "hidden");
      label.setAttribute("visibility", "hidden");
    });
    root.append(cursor, label, overlay);
  }

  // points: [{budget, overhead, own, id}] sorted by budget; the frontier as a step line, each
  // budget's own plan filled, a budget answered by a smaller budget's plan hollow.
  function paretoChart({ points, width, height = 300, onClick }) {
    const f = frame(width, height, { left: 64, right: 20, top: 16, bottom: 40 });
    const root = svg("svg", { class: "chart pareto-chart", width, height,
      viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "overhead over budget" });
    root.append(svg("rect", { x: 0, y: 0, width, height, fill: "#fff" }));
    const drawn = points.filter((p) => p.overhead !== null && p.overhead !== undefined);
    const bMin = Math.min(...points.map((p) => p.budget));
    const bMax = Math.max(...points.map((p) => p.budget));
    const pad = (bMax - bMin) * 0.05 || bMax * 0.05 || 1;
    const xLo = Math.max(0, bMin - pad);
    const xHi = bMax + pad;
    const yMax = Math.max(1, ...drawn.map((p) => p.overhead)) * 1.15;
    const sx = (x) => f.x0 + ((x - xLo) / (xHi - xLo)) * (f.x1 - f.x0);
    const sy = (y) => f.y0 - (y / yMax) * (f.y0 - f.y1);
    for (const t of ticks(yMax, 5)) {
      root.append(svg("line", { class: "grid", x1: f.x0, x2: f.x1, y1: sy(t), y2: sy(t) }));
      root.append(svg("text", { x: f.x0 - 6, y: sy(t) + 4, "text-anchor": "end" }, Number(t.toPrecision(3)) + " %"));
    }
    for (const p of points) {
      const x = sx(p.budget);
      root.append(svg("line", { class: "axis", x1: x, x2: x, y1: f.y0, y2: f.y0 + 4 }));
      root.append(svg("text", { x, y: f.y0 + 16, "text-anchor": "middle" }, fmt.bytes(p.budget)));
    }
    root.append(svg("text", { x: (f.x0 + f.x1) / 2, y: height - 6, "text-anchor": "middle" },
      "memory budget"));
    root.append(svg("text", { x: 12, y: (f.y0 + f.y1) / 2, "text-anchor": "middle",
      transform: `rotate(-90 12 ${(f.y0 + f.y1) / 2})` }, "compute overhead"));
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x1, y1: f.y0, y2: f.y0 }));
    root.append(svg("line", { class: "axis", x1: f.x0, x2: f.x0, y1: f.y0, y2: f.y1 }));
    if (drawn.length) {
      let d = "";
      drawn.forEach((p, i) => {
        d += i === 0 ? `M${sx(p.budget).toFixed(1)},${sy(p.overhead).toFixed(1)}`
          : `H${sx(p.budget).toFixed(1)}V${sy(p.overhead).toFixed(1)}`;
      });
      root.append(svg("path", { d, fill: "none", stroke: "#2563eb", "stroke-width": 1.6, class: "frontier" }));
    }
    for (const p of points.filter((q) => q.overhead === null || q.overhead === undefined)) {
      const x = sx(p.budget);
      const y = f.y0 - 8;
      root.append(svg("path", { d: `M${x - 5},${y - 5}L${x + 5},${y + 5}M${x - 5},${y + 5}L${x + 5},${y - 5}`,
        stroke: "#dc2626", "stroke-width": 2, class: "no-plan" },
      svg("title", {}, `${fmt.bytes(p.budget)}: ${p.status === "infeasible" ? "no plan fits" : p.status}`)));
    }
    for (const p of drawn) {
      const dot = svg("circle", { cx: sx(p.budget), cy: sy(p.overhead), r: 5,
        fill: p.own ? "#2563eb" : "#fff", stroke: "#2563eb", "stroke-width": 2, class: "point",
        style: onClick ? "cursor: pointer" : null },
      svg("title", {}, `${fmt.bytes(p.budget)}: ${fmt.percent(p.overhead)}` +
        (p.own ? "" : " (a smaller budget's plan)")));
      if (onClick) dot.addEventListener("click", () => onClick(p));
      root.append(dot);
    }
    return root;
  }

  // -- pictures to keep: a chart as a standalone SVG file, or as a PNG drawn from it ----------
  // The page's stylesheet does not travel with the file: the rules the charts use go inside.
  const EXPORT_STYLE = "text { font: 11px system-ui, 'DejaVu Sans', sans-serif; fill: #475569; } " +
    ".grid { stroke: #eef0f3; } .axis { stroke: #94a3b8; }";

  function svgBlob(root) {
    const copy = root.cloneNode(true);
    copy.setAttribute("xmlns", NS);
    copy.prepend(svg("style", {}, EXPORT_STYLE));
    for (const hidden of copy.querySelectorAll("[visibility=hidden]")) hidden.remove();
    const text = '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(copy);
    return new Blob([text], { type: "image/svg+xml" });
  }

  // Twice the chart's size, so that the picture stays sharp on a slide.
  async function pngBlob(root, scale = 2) {
    const url = URL.createObjectURL(svgBlob(root));
    try {
      const image = new Image();
      image.src = url;
      await image.decode();
      const canvas = document.createElement("canvas");
      canvas.width = Number(root.getAttribute("width")) * scale;
      canvas.height = Number(root.getAttribute("height")) * scale;
      const context = canvas.getContext("2d");
      context.scale(scale, scale);
      context.drawImage(image, 0, 0);
      return await new Promise((resolve, reject) => canvas.toBlob(
        (blob) => (blob ? resolve(blob) : reject(new Error("the browser drew no PNG"))), "image/png"));
    } finally {
      URL.revokeObjectURL(url);
    }
  }

  // Buttons that save `root` as name.svg and name.png.
  function saveButtons(root, name) {
    const { el, saveBlob } = Planner;
    const png = el("button", { type: "button", class: "save-png" }, "PNG");
    png.addEventListener("click", async () => {
      png.disabled = true;
      try { saveBlob(await pngBlob(root), name + ".png"); } finally { png.disabled = false; }
    });
    return el("span", { class: "save small muted" }, "Save the picture: ",
      el("button", { type: "button", class: "save-svg", onclick: () => saveBlob(svgBlob(root), name + ".svg") }, "SVG"),
      " ", png);
  }

  return { svg, memoryStepChart, paretoChart, ticks, downsample, svgBlob, pngBlob, saveButtons };
})();
