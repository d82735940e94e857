// graphattn attention-pattern viewer. Reads the metadata and the compressed typed arrays that
// graphattn/viz/html.py embeds in this page; draws [global ; long] queries (rows) by keys
// (columns) on a canvas, one screen pixel at a time, so zoom level never changes the cost:
// zoomed out it samples the embedded block summary, zoomed in the pairs themselves, read from
// the stored pieces (a dense instance) or derived from the compact form (compactCode, the same
// rules as graphattn/compact.py).
"use strict";
(function () {
  const meta = JSON.parse(document.getElementById("graphattn-meta").textContent);
  const G = meta.G, L = meta.L, N = G + L, R = meta.radius, W = 2 * R + 1;
  const MARGIN = { left: 170, top: 130, right: 72, bottom: 34 };
  const TOKEN_SCALE = 2; // pixels per position from which every pair is drawn as its own cell
  const SAMPLE_BLOCK = 6; // pixels per summary block from which each pixel shows the pair at its center instead
  const TICK_GAP = 16; // pixels between tick labels at least
  const NAME_SCALE = 11; // pixels per position from which every tick carries the token's name
  const GRID_SCALE = 8; // pixels per position from which white lines separate cells
  const MAX_SCALE = 80;
  const BACKGROUND = [255, 255, 255];
  const PIECES = [["g2g", 0, G, 0, G], ["g2l", 0, G, G, N], ["l2g", G, N, 0, G], ["l2l", G, N, G, N]];

  const canvas = document.getElementById("plot");
  const ctx = canvas.getContext("2d");
  const tooltip = document.getElementById("tooltip");
  const status = document.getElementById("status");
  const api = { ready: false, error: null };
  window.graphattnViewer = api;

  let data = null;
  let blockColors = null;
  const view = { x: 0, y: 0, scale: 1 }; // key position at the plot's left edge, query at its top, px per position
  const plot = { x: MARGIN.left, y: MARGIN.top, w: 1, h: 1 };
  let drawPending = false;
  let lastMode = "";

  // -- data -------------------------------------------------------------------------------
  const TYPED = { uint8: Uint8Array, uint16: Uint16Array, int16: Int16Array, int32: Int32Array, float64: Float64Array };

  async function inflate(text) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot inflate the embedded data (needs DecompressionStream: Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    const raw = atob(text.trim());
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  function views(buffer) {
    const out = {};
    for (const [name, spec] of Object.entries(meta.arrays)) {
      out[name] = new TYPED[spec.dtype](buffer, spec.offset, spec.length);
    }
    return out;
  }

  function rgb(hex) {
    return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  }

  function packed(c) {
    // canvas ImageData is RGBA in memory; a little-endian Uint32 view reads it as ABGR
    return ((255 << 24) | (c[2] << 16) | (c[1] << 8) | c[0]) >>> 0;
  }

  const labelRGB = meta.colors.map(rgb);
  const BG = packed(BACKGROUND);
  const codeColors = new Uint32Array(labelRGB.length + 1); // index = label + 1, 0 = masked
  codeColors[0] = BG;
  labelRGB.forEach((c, i) => { codeColors[i + 1] = packed(c); });

  function shadeBlocks() {
    // same blend as palette.shade: at least shadeFloor of the label color where any pair has it
    const drawn = data.blockDrawn, share = data.blockShare, floor = meta.shadeFloor;
    const out = new Uint32Array(drawn.length);
    for (let i = 0; i < drawn.length; i++) {
      if (share[i] === 0 || drawn[i] < 0) { out[i] = BG; continue; }
      const s = share[i] / 255, a = floor + (1 - floor) * s, c = labelRGB[drawn[i]];
      out[i] = packed(c.map((v, j) => Math.round(BACKGROUND[j] * (1 - a) + v * a)));
    }
    return out;
  }

  // label + 1 of query q, key k over [global ; long]; 0 = masked
  function code(q, k) {
    return meta.form === "compact" ? compactCode(q, k) : storedCode(q, k);
  }

  function storedCode(q, k) {
    if (q < G) return k < G ? data.g2g[q * G + k] : data.g2l[q * L + (k - G)];
    const i = q - G;
    if (k < G) return data.l2g[i * G + k];
    const c = k - G - i + R;
    return c < 0 || c >= W ? 0 : data.band[i * W + c];
  }

  // -- the compact form: labels derived as graphattn/compact.py derives the dense tensors ---
  const K = meta.maxDistance;

  function distanceId(d) {
    const c = Math.max(-K, Math.min(K, d));
    return c >= 0 ? c : K - c;
  }

  function findLabel(keys, labels, key) {
    let lo = 0, hi = keys.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1, v = keys[mid];
      if (v === key) return labels[mid];
      if (v < key) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
  }

  function crossCode(i, g, hardRow) {
    // l2g (i, g) and g2l (g, i): a link's label, else belongs where g owns i, else
    // does_not_belong within one document for a row the hard mask leaves free
    const link = findLabel(data.linkKey, data.linkLabel, i * G + g);
    if (link >= 0) return link + 1;
    const owners = data.compactOwners || data.owners, levels = owners.length / L;
    for (let lv = 0; lv < levels; lv++) if (owners[lv * L + i] === g) return meta.belongs + 1;
    return hardRow || data.longDoc[i] !== data.globalDoc[g] ? 0 : meta.doesNotBelong + 1;
  }

  function compactCode(q, k) {
    if (q < G && k < G) {
      if (data.globalDoc[q] !== data.globalDoc[k]) return 0;
      const cross = data.globalSegment[q] !== data.globalSegment[k];
      if (cross && data.globalBlockable[q] && data.globalBlockable[k]) return 0;
      const edge = findLabel(data.edgeKey, data.edgeLabel, q * G + k);
      if (edge >= 0) return edge + 1;
      return (cross && meta.crossLabel >= 0 ? meta.crossLabel : distanceId(k - q)) + 1;
    }
    if (q < G) return crossCode(k - G, q, data.globalHard[q]);
    const i = q - G;
    if (k < G) return crossCode(i, k, data.longHard[i]);
    const j = k - G;
    if (Math.abs(j - i) > R || data.longSegment[i] !== data.longSegment[j]) return 0;
    return distanceId(j - i) + 1;
  }

  function blockIndex(starts, p) {
    // starts holds every block's first position plus the end; binary search for p's block
    let lo = 0, hi = starts.length - 2;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (starts[mid] <= p) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  // -- names ------------------------------------------------------------------------------
  function globalName(g) {
    const node = meta.globals[g];
    return `${node.type}:${node.id}`;
  }

  function positionName(p) {
    return p < G ? `G${p} ${globalName(p)}` : `L${p - G} ${JSON.stringify(meta.tokens[p - G])}`;
  }

  function shortName(p) {
    return p < G ? `G${p}` : `L${p - G}`;
  }

  function nodesBehind(p) {
    if (p < G) return `${globalName(p)} (itself)`;
    const i = p - G, names = [];
    meta.levels.forEach((level, lv) => {
      const g = data.owners[lv * L + i];
      if (g >= 0) names.push(`${globalName(g)} (G${g})`);
    });
    const doc = meta.docIds[data.docIndex[i]];
    return (names.length ? names.join(", ") : "no owning node") + (doc !== undefined ? `; document ${doc}` : "");
  }

  function cut(text, n) {
    return text.length > n ? text.slice(0, n - 1) + "\u2026" : text;
  }

  // -- drawing ----------------------------------------------------------------------------
  function mode() {
    // blocks when the embedded summary is finer than the screen; once its blocks grow past a few
    // pixels, each pixel shows the pair at its center (sampled); from TOKEN_SCALE every pair
    if (view.scale >= TOKEN_SCALE || meta.blockSize === 1) return "tokens";
    return meta.blockSize * view.scale >= SAMPLE_BLOCK ? "sampled" : "blocks";
  }

  function layout() {
    const stage = canvas.parentElement;
    const w = Math.max(200, stage.clientWidth), h = Math.max(200, stage.clientHeight);
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    plot.w = Math.max(10, w - MARGIN.left - MARGIN.right);
    plot.h = Math.max(10, h - MARGIN.top - MARGIN.bottom);
  }

  function sx(k) { return plot.x + (k - view.x) * view.scale; }
  function sy(q) { return plot.y + (q - view.y) * view.scale; }
  // first pixel column (row) that drawCells paints with key k (query q): lines drawn through it
  // sit exactly on cell edges, with no sliver of the neighbouring cell beside them
  function edgeX(k) { return plot.x + Math.ceil((k - view.x) * view.scale - 0.5) + 0.5; }
  function edgeY(q) { return plot.y + Math.ceil((q - view.y) * view.scale - 0.5) + 0.5; }

  function drawCells() {
    const img = ctx.createImageData(plot.w, plot.h);
    const px = new Uint32Array(img.data.buffer);
    const keyAt = new Int32Array(plot.w), queryAt = new Int32Array(plot.h);
    for (let x = 0; x < plot.w; x++) {
      const k = Math.floor(view.x + (x + 0.5) / view.scale);
      keyAt[x] = k >= 0 && k < N ? k : -1;
    }
    for (let y = 0; y < plot.h; y++) {
      const q = Math.floor(view.y + (y + 0.5) / view.scale);
      queryAt[y] = q >= 0 && q < N ? q : -1;
    }
    px.fill(BG);
    if (mode() !== "blocks") {
      for (let y = 0; y < plot.h; y++) {
        const q = queryAt[y];
        if (q < 0) continue;
        const row = y * plot.w;
        for (let x = 0; x < plot.w; x++) {
          const k = keyAt[x];
          if (k >= 0) px[row + x] = codeColors[code(q, k)];
        }
      }
    } else {
      const nk = data.kStarts.length - 1;
      const keyBlock = keyAt.map((k) => (k < 0 ? -1 : blockIndex(data.kStarts, k)));
      for (let y = 0; y < plot.h; y++) {
        const q = queryAt[y];
        if (q < 0) continue;
        const base = blockIndex(data.qStarts, q) * nk, row = y * plot.w;
        for (let x = 0; x < plot.w; x++) {
          const kb = keyBlock[x];
          if (kb >= 0) px[row + x] = blockColors[base + kb];
        }
      }
    }
    ctx.putImageData(img, plot.x, plot.y);
  }

  function visibleRange(start, extent) {
    return [Math.max(0, Math.floor(start)), Math.min(N, Math.ceil(start + extent / view.scale))];
  }

  function drawGrid() {
    if (view.scale < GRID_SCALE) return;
    const [k0, k1] = visibleRange(view.x, plot.w), [q0, q1] = visibleRange(view.y, plot.h);
    ctx.strokeStyle = "#ffffff";
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (let k = k0; k <= k1; k++) { const x = edgeX(k); ctx.moveTo(x, sy(q0)); ctx.lineTo(x, sy(q1)); }
    for (let q = q0; q <= q1; q++) { const y = edgeY(q); ctx.moveTo(sx(k0), y); ctx.lineTo(sx(k1), y); }
    ctx.stroke();
  }

  function drawFrames() {
    ctx.strokeStyle = "#000";
    ctx.lineWidth = 1;
    for (const [, q0, q1, k0, k1] of PIECES) {
      if (q1 <= q0 || k1 <= k0) continue;
      const x0 = edgeX(k0), x1 = edgeX(k1), y0 = edgeY(q0), y1 = edgeY(q1);
      ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
    }
  }

  function drawPieceNames() {
    // in the margins, never over a cell: under each column part its pieces (top to bottom),
    // right of each row part its pieces (left to right); as in the PNG (picture.py)
    const parts = [["g", 0, G], ["l", G, N]];
    const seen = (lo, hi, v0, extent) => [Math.max(lo, v0), Math.min(hi, v0 + extent / view.scale)];
    const rows = parts.filter(([, lo, hi]) => { const [a, b] = seen(lo, hi, view.y, plot.h); return b > a; });
    const cols = parts.filter(([, lo, hi]) => { const [a, b] = seen(lo, hi, view.x, plot.w); return b > a; });
    ctx.font = "bold 11px sans-serif";
    ctx.fillStyle = "#000";
    ctx.textBaseline = "top";
    ctx.textAlign = "center";
    for (const [c, lo, hi] of cols) {
      const [a, b] = seen(lo, hi, view.x, plot.w), x = (sx(a) + sx(b)) / 2;
      const bottom = Math.min(plot.y + plot.h, sy(N));
      rows.forEach(([r], i) => ctx.fillText(`${r}2${c}`, x, bottom + 4 + 13 * i));
    }
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    for (const [r, lo, hi] of rows) {
      const [a, b] = seen(lo, hi, view.y, plot.h);
      const right = Math.min(plot.x + plot.w, sx(N));
      ctx.fillText(cols.map(([c]) => `${r}2${c}`).join("  "), right + 6, (sy(a) + sy(b)) / 2);
    }
  }

  function niceStep(raw) {
    const magnitude = Math.pow(10, Math.max(0, Math.floor(Math.log10(Math.max(raw, 1)))));
    for (const m of [1, 2, 5, 10]) if (m * magnitude >= raw) return m * magnitude;
    return 10 * magnitude;
  }

  function tickPositions(start, extent) {
    // part starts first (long, then global), then round steps; a tick closer than TICK_GAP
    // pixels to one already kept is left out, so labels never overlap (as picture.py does)
    const [p0, p1] = visibleRange(start, extent);
    if (view.scale >= NAME_SCALE) return Array.from({ length: p1 - p0 }, (_, i) => p0 + i);
    const step = niceStep(60 / view.scale), starts = [], steps = [];
    for (const [lo, hi, origin] of [[Math.max(p0, G), p1, G], [p0, Math.min(p1, G), 0]]) {
      if (hi <= lo) continue;
      if (lo === origin) starts.push(lo);
      for (let p = origin + Math.ceil((lo - origin) / step) * step; p < hi; p += step) steps.push(p);
    }
    const kept = [];
    for (const p of [...starts, ...steps]) {
      if (kept.every((other) => Math.abs(p - other) * view.scale >= TICK_GAP)) kept.push(p);
    }
    return kept.sort((a, b) => a - b);
  }

  function drawTicks() {
    const named = view.scale >= NAME_SCALE;
    const size = named ? Math.min(12, Math.floor(view.scale * 0.85)) : 11;
    ctx.font = `${size}px sans-serif`;
    ctx.fillStyle = "#222";
    const label = (p) => (named ? cut(positionName(p), 24) : shortName(p));
    const offset = named ? 0.5 : 0;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const q of tickPositions(view.y, plot.h)) {
      const y = sy(q + offset);
      if (y < plot.y - 1 || y > plot.y + plot.h + 1) continue;
      ctx.fillText(label(q), plot.x - 5, y);
      if (!named) ctx.fillRect(plot.x - 3, Math.round(y), 3, 1);
    }
    for (const k of tickPositions(view.x, plot.w)) {
      const x = sx(k + offset);
      if (x < plot.x - 1 || x > plot.x + plot.w + 1) continue;
      ctx.save();
      ctx.translate(x, plot.y - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(label(k), 0, 0);
      ctx.restore();
      if (!named) ctx.fillRect(Math.round(x), plot.y - 3, 1, 3);
    }
  }

  function draw() {
    drawPending = false;
    layout();
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    drawCells();
    ctx.save();
    ctx.beginPath();
    ctx.rect(plot.x - 0.5, plot.y - 0.5, plot.w + 1, plot.h + 1);
    ctx.clip();
    drawGrid();
    drawFrames();
    ctx.restore();
    drawTicks();
    drawPieceNames();
    lastMode = mode();
    const [k0, k1] = visibleRange(view.x, plot.w), [q0, q1] = visibleRange(view.y, plot.h);
    const how = {
      tokens: "one cell per pair",
      sampled: "each pixel shows the pair at its center (zoom in for every pair)",
      blocks: `blocks of up to ${meta.blockSize} tokens (color: the structure label if any pair has one, else the most ` +
        "common label; shade: its share of the block)",
    }[lastMode];
    status.title = status.textContent = `queries ${shortName(q0)}\u2013${shortName(Math.max(q0, q1 - 1))}, keys ${shortName(k0)}\u2013${shortName(Math.max(k0, k1 - 1))}: ${how}`;
  }

  function requestDraw() {
    if (!drawPending) { drawPending = true; requestAnimationFrame(draw); }
  }

  // -- interaction ------------------------------------------------------------------------
  function fitScale() { return Math.min(plot.w, plot.h) / N; }

  function clampView() {
    view.scale = Math.min(MAX_SCALE, Math.max(fitScale() * 0.5, view.scale));
    const spanX = plot.w / view.scale, spanY = plot.h / view.scale;
    view.x = Math.min(Math.max(view.x, -spanX / 2), N - spanX / 2);
    view.y = Math.min(Math.max(view.y, -spanY / 2), N - spanY / 2);
  }

  function fit() { layout(); view.scale = fitScale(); view.x = 0; view.y = 0; draw(); }

  function zoomAt(mx, my, factor) {
    const k = view.x + (mx - plot.x) / view.scale, q = view.y + (my - plot.y) / view.scale;
    view.scale *= factor;
    clampView();
    view.x = k - (mx - plot.x) / view.scale;
    view.y = q - (my - plot.y) / view.scale;
    clampView();
    requestDraw();
  }

  function canvasPoint(clientX, clientY) {
    // client (CSS) pixels to canvas pixels, should the canvas ever be stretched
    const box = canvas.getBoundingClientRect();
    return [(clientX - box.left) * (canvas.width / box.width), (clientY - box.top) * (canvas.height / box.height)];
  }

  function cellUnder(clientX, clientY) {
    const [mx, my] = canvasPoint(clientX, clientY);
    if (mx < plot.x || my < plot.y || mx >= plot.x + plot.w || my >= plot.y + plot.h) return null;
    const k = Math.floor(view.x + (mx - plot.x) / view.scale), q = Math.floor(view.y + (my - plot.y) / view.scale);
    return q >= 0 && q < N && k >= 0 && k < N ? { q, k } : null;
  }

  function describe(q, k) {
    const c = code(q, k);
    const lines = [
      `query  ${positionName(q)}`,
      `key    ${positionName(k)}`,
      `piece  ${q < G ? "g" : "l"}2${k < G ? "g" : "l"}`,
      `label  ${c === 0 ? "(masked: may not attend)" : meta.labels[c - 1]}`,
      `query nodes  ${nodesBehind(q)}`,
      `key nodes    ${nodesBehind(k)}`,
    ];
    if (lastMode === "blocks") {
      const qb = blockIndex(data.qStarts, q), kb = blockIndex(data.kStarts, k), i = qb * (data.kStarts.length - 1) + kb;
      const range = (s, b) => `${shortName(s[b])}\u2013${shortName(s[b + 1] - 1)}`;
      const share = Math.round((data.blockShare[i] / 255) * 100);
      const shown = data.blockDrawn[i] >= 0 ? `${share}% ${meta.labels[data.blockDrawn[i]]}` : "every pair masked";
      lines.push(`block  queries ${range(data.qStarts, qb)} \u00d7 keys ${range(data.kStarts, kb)}: ${shown}`);
    }
    return lines.join("\n");
  }

  function showTooltip(event) {
    const cell = data && cellUnder(event.clientX, event.clientY);
    if (!cell) { tooltip.style.display = "none"; return; }
    tooltip.textContent = describe(cell.q, cell.k);
    tooltip.style.display = "block";
    const x = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 4);
    const y = Math.min(event.clientY + 14, window.innerHeight - tooltip.offsetHeight - 4);
    tooltip.style.left = `${Math.max(0, x)}px`;
    tooltip.style.top = `${Math.max(0, y)}px`;
  }

  function listen() {
    let drag = null;
    canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      zoomAt(...canvasPoint(e.clientX, e.clientY), Math.exp(-e.deltaY * 0.0015));
    }, { passive: false });
    canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y }; });
    window.addEventListener("mouseup", () => { drag = null; });
    canvas.addEventListener("mousemove", (e) => {
      if (drag) {
        view.x = drag.vx - (e.clientX - drag.x) / view.scale;
        view.y = drag.vy - (e.clientY - drag.y) / view.scale;
        clampView();
        requestDraw();
      }
      showTooltip(e);
    });
    canvas.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
    canvas.addEventListener("dblclick", (e) => zoomAt(...canvasPoint(e.clientX, e.clientY), e.shiftKey ? 0.5 : 2));
    const center = () => [plot.x + plot.w / 2, plot.y + plot.h / 2];
    document.getElementById("zoom-in").onclick = () => zoomAt(...center(), 2);
    document.getElementById("zoom-out").onclick = () => zoomAt(...center(), 0.5);
    document.getElementById("fit").onclick = fit;
    window.addEventListener("keydown", (e) => {
      const step = 60 / view.scale;
      const moves = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, -step], ArrowDown: [0, step] };
      if (e.key === "+" || e.key === "=") zoomAt(...center(), 1.5);
      else if (e.key === "-") zoomAt(...center(), 1 / 1.5);
      else if (e.key === "0") fit();
      else if (moves[e.key]) { view.x += moves[e.key][0]; view.y += moves[e.key][1]; clampView(); requestDraw(); }
    });
    new ResizeObserver(() => draw()).observe(canvas.parentElement);
  }

  function buildLegend() {
    // the labels present in legend order (palette.legend_order), then what white means
    const legend = document.getElementById("legend");
    const entry = (name, color) => {
      const row = document.createElement("div");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = color;
      row.append(swatch, document.createTextNode(name));
      row.dataset.label = name;
      legend.append(row);
    };
    for (const label of meta.present) entry(meta.labels[label], meta.colors[label]);
    entry(meta.maskedName, "#ffffff");
  }

  // -- test and scripting hooks ------------------------------------------------------------
  api.cellCenter = (q, k) => {
    const box = canvas.getBoundingClientRect();
    return { x: box.left + sx(k + 0.5) * (box.width / canvas.width), y: box.top + sy(q + 0.5) * (box.height / canvas.height) };
  };
  api.zoomTo = (q0, q1, k0, k1) => {
    layout();
    view.scale = Math.min(MAX_SCALE, plot.w / (k1 - k0), plot.h / (q1 - q0));
    view.x = k0;
    view.y = q0;
    draw();
  };
  api.mode = () => lastMode;
  api.describe = describe;
  api.code = (q, k) => code(q, k); // label + 1 of a pair (0: masked), for tests

  inflate(document.getElementById("graphattn-data").textContent)
    .then((buffer) => {
      data = views(buffer);
      blockColors = shadeBlocks();
      buildLegend();
      listen();
      if (meta.initial && (meta.initial[0] > 0 || meta.initial[1] < N || meta.initial[2] > 0 || meta.initial[3] < N)) {
        api.zoomTo(...meta.initial);
      } else {
        fit();
      }
      api.ready = true;
    })
    .catch((err) => {
      api.error = String(err && err.message ? err.message : err);
      const box = document.getElementById("error");
      box.textContent = `graphattn viewer: ${api.error}`;
      box.style.display = "block";
    });
})();
