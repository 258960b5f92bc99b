// ctxkit ui: each panel of the page over one JSON route of `ctxkit ui` (ctxkit/inference/ui.py).
// Plain browser JavaScript: no framework, no build step, nothing fetched from elsewhere.
"use strict";

// What went wrong in the page itself (uncaught errors, rejected promises), and what the last
// generation received: the browser tests (tests/test_ui_browser.py) read both.
window.__ui = { errors: [], generation: null };
window.addEventListener("error", (event) => window.__ui.errors.push(String(event.message || event)));
window.addEventListener("unhandledrejection", (event) => window.__ui.errors.push(String(event.reason)));

const $ = (root, selector) => root.querySelector(selector);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined).map((c) => (c instanceof Node ? c : String(c))));
  return node;
}

// FastAPI's error bodies: {"detail": "..."} or {"detail": [{"loc": [...], "msg": "..."}]}
function detailOf(data) {
  if (!data || !data.detail) return "";
  if (typeof data.detail === "string") return data.detail;
  return data.detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
}

async function postJSON(url, body, signal) {
  const response = await fetch(url, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
  });
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    throw new Error(detailOf(data) || `${response.status} ${response.statusText}`);
  }
  return response;
}

const post = async (url, body) => (await postJSON(url, body)).json();

const fixed = (x, digits = 2) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(digits));

// ------------------------------------------------------------------ colours

// matplotlib's viridis at five stops, interpolated: attention weights (0..1)
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function viridis(t) {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}

// white to dark blue: cosine similarities
function blues(t) {
  const x = Math.min(1, Math.max(0, t));
  return [247, 251, 255].map((c, k) => Math.round(c + x * ([8, 48, 107][k] - c)));
}

function hue(label) {
  let h = 0;
  for (const ch of label) h = (h * 31 + ch.charCodeAt(0)) % 360;
  return `hsl(${h}, 80%, 82%)`;
}

// ------------------------------------------------------------------ retail or river bank?

function exampleLines(words, word) {
  const lines = [];
  for (const [sense, sentences] of Object.entries(words[word])) {
    for (const sentence of sentences) lines.push(`${sense} | ${sentence}`);
  }
  return lines.join("\n");
}

function matrixTable(title, labels, matrix, sentences) {
  const values = matrix.flat();
  const low = Math.min(0, ...values);
  const table = el("table", { class: "sim" }, el("caption", {}, title));
  const head = el("tr", {}, el("th"));
  labels.forEach((label) => head.append(el("th", {}, label)));
  table.append(el("thead", {}, head));
  const body = el("tbody");
  matrix.forEach((row, i) => {
    const tr = el("tr", {}, el("th", {}, labels[i]));
    row.forEach((value, j) => {
      const t = (value - low) / (1 - low || 1);
      const [r, g, b] = blues(t);
      tr.append(el("td", {
        title: `${sentences[i]}\n${sentences[j]}`,
        style: { background: `rgb(${r}, ${g}, ${b})`, color: t > 0.55 ? "#fff" : "#1d2330" },
      }, fixed(value)));
    });
    body.append(tr);
  });
  table.append(body);
  return table;
}

function senseSummary(kind, means, senses) {
  const names = [...new Set(senses)];
  if (names.length !== 2) {
    return el("p", { class: "summary" }, `${kind}: ` + Object.entries(means).map(([k, v]) => `${k} ${fixed(v, 3)}`).join(", "));
  }
  const [a, b] = names;
  const across = means[`${a}-vs-${b}`], withinA = means[`${a}-vs-${a}`], withinB = means[`${b}-vs-${b}`];
  const known = [withinA, withinB].filter((v) => v !== null);
  const separated = known.length > 0 && across < Math.min(...known);
  return el("p", { class: "summary" }, `${kind}: ${a}-vs-${b} ${fixed(across, 3)}, within ${a} ${fixed(withinA, 3)}, `
    + `within ${b} ${fixed(withinB, 3)} \u2192 `,
  el("b", { class: separated ? "yes" : "no" }, separated ? "the senses separate" : "the senses do not separate"));
}

async function similarity(section, form) {
  const parsed = form.sentences.value.split("\n").map((line) => line.trim()).filter(Boolean).map((line) => {
    const bar = line.indexOf("|");
    return bar < 0 ? [null, line] : [line.slice(0, bar).trim(), line.slice(bar + 1).trim()];
  });
  const senses = parsed.length && parsed.every(([sense]) => sense) ? parsed.map(([sense]) => sense) : null;
  const sentences = parsed.map(([, sentence]) => sentence);
  const data = await post("api/similarity", { word: form.word.value.trim(), sentences, senses });
  const texts = data.sentence.map((i) => sentences[i]);
  const result = $(section, ".result");
  result.replaceChildren(el("div", { class: "matrices" },
    matrixTable("contextual (last layer)", data.labels, data.contextual, texts),
    matrixTable("static (input embedding)", data.labels, data.static, texts)));
  if (data.mean_contextual) {
    result.append(senseSummary("contextual", data.mean_contextual, data.senses),
      senseSummary("static", data.mean_static, data.senses));
  }
}

// ------------------------------------------------------------------ attention

function thumbnail(matrix) {
  const n = matrix.length;
  const canvas = el("canvas", { width: n, height: n });
  const context = canvas.getContext("2d");
  const image = context.createImageData(n, n);
  const top = Math.max(...matrix.flat()) || 1;
  matrix.forEach((row, i) => row.forEach((value, j) => {
    const [r, g, b] = viridis(value / top);
    image.data.set([r, g, b, 255], 4 * (i * n + j));
  }));
  context.putImageData(image, 0, 0);
  return canvas;
}

function zoom(section, data, layer, head) {
  section.querySelectorAll(".heads canvas").forEach((c) => c.classList.toggle("on", +c.dataset.layer === layer && +c.dataset.head === head));
  const figure = $(section, ".zoom");
  const canvas = $(figure, "canvas");
  const tokens = data.tokens, n = tokens.length, matrix = data.weights[layer][head];
  const cell = Math.max(12, Math.min(30, Math.floor(440 / n)));
  const scale = window.devicePixelRatio || 1;
  const context = canvas.getContext("2d");
  context.font = "11px system-ui, sans-serif";
  const margin = Math.ceil(Math.max(...tokens.map((t) => context.measureText(t).width))) + 10;
  const size = margin + n * cell;
  canvas.width = size * scale;
  canvas.height = size * scale;
  canvas.style.width = `${size}px`;
  canvas.style.height = `${size}px`;
  context.scale(scale, scale);
  context.font = "11px system-ui, sans-serif";
  context.fillStyle = "#1d2330";
  context.textBaseline = "middle";
  context.textAlign = "right";
  tokens.forEach((token, i) => context.fillText(token, margin - 5, margin + (i + 0.5) * cell));
  context.save();
  context.rotate(-Math.PI / 2);
  context.textAlign = "left";
  tokens.forEach((token, j) => context.fillText(token, -(margin - 5), margin + (j + 0.5) * cell));
  context.restore();
  const top = Math.max(...matrix.flat()) || 1;
  matrix.forEach((row, i) => row.forEach((value, j) => {
    const [r, g, b] = viridis(value / top);
    context.fillStyle = `rgb(${r}, ${g}, ${b})`;
    context.fillRect(margin + j * cell, margin + i * cell, cell - 1, cell - 1);
  }));
  $(figure, "figcaption").textContent = `Layer ${layer}, head ${head}: rows attend to columns (brightest: ${fixed(top)})`;
  figure.hidden = false;
}

async function attention(section, form) {
  const data = await post("api/attention", { text: form.text.value });
  const heads = $(section, ".heads");
  heads.replaceChildren();
  heads.style.gridTemplateColumns = `auto repeat(${data.heads}, minmax(0, 56px))`;
  heads.append(el("span"));
  for (let h = 0; h < data.heads; h++) heads.append(el("span", {}, `H${h}`));
  for (let l = 0; l < data.layers; l++) {
    heads.append(el("span", {}, `L${l}`));
    for (let h = 0; h < data.heads; h++) {
      const canvas = thumbnail(data.weights[l][h]);
      canvas.title = `layer ${l}, head ${h}`;
      canvas.dataset.layer = l;
      canvas.dataset.head = h;
      canvas.addEventListener("click", () => zoom(section, data, l, h));
      heads.append(canvas);
    }
  }
  zoom(section, data, data.layers - 1, 0);
}

// ------------------------------------------------------------------ fill-mask, QA, NER

async function fillMask(section, form) {
  const data = await post("api/fill-mask", { text: form.text.value, top_k: +form.top_k.value || 5 });
  const list = el("ol", { class: "candidates" });
  for (const c of data.candidates) {
    list.append(el("li", {}, el("span", { class: "word" }, c.token_str.trim()),
      el("span", { class: "bar", style: { width: `${Math.max(2, Math.round(c.score * 220))}px` } }),
      el("span", { class: "score" }, `${fixed(100 * c.score, 1)}%`)));
  }
  const best = data.candidates.length ? el("p", { class: "summary" }, `Best: ${data.candidates[0].sequence}`) : null;
  $(section, ".result").replaceChildren(list, best || "");
}

function highlighted(text, spans) {
  const out = el("p", { class: "highlighted" });
  let at = 0;
  for (const span of spans) {
    if (span.start < at) continue;  // an overlapping span: the first one stands
    out.append(text.slice(at, span.start));
    const mark = el("mark", { class: span.label ? "ent" : "", title: span.title || "" }, text.slice(span.start, span.end));
    if (span.label) {
      mark.style.background = hue(span.label);
      mark.append(el("span", { class: "tag" }, span.label));
    }
    out.append(mark);
    at = span.end;
  }
  out.append(text.slice(at));
  return out;
}

async function questionAnswering(section, form) {
  const context = form.context.value;
  const data = await post("api/qa", { question: form.question.value, context });
  $(section, ".result").replaceChildren(
    el("p", { class: "summary" }, "Answer: ", el("b", {}, data.answer || "(none)"), ` (score ${fixed(data.score)})`),
    highlighted(context, [{ start: data.start, end: data.end, title: `score ${fixed(data.score)}` }]));
}

async function entities(section, form) {
  const text = form.text.value;
  const data = await post("api/ner", { text });
  const spans = data.entities.map((e) => ({ start: e.start, end: e.end, label: e.entity_group || e.entity,
    title: `${e.entity_group || e.entity} ${fixed(e.score)}` })).sort((a, b) => a.start - b.start);
  $(section, ".result").replaceChildren(highlighted(text, spans),
    el("p", { class: "summary" }, spans.length ? `${spans.length} entities` : "No entities found."));
}

// ------------------------------------------------------------------ generation, streamed

let stopGeneration = null;

async function generation(section, form) {
  const out = $(section, ".generated"), stats = $(section, ".stats");
  const body = { prompt: form.prompt.value, max_new_tokens: +form.max_new_tokens.value, temperature: +form.temperature.value,
    top_k: +form.top_k.value, top_p: +form.top_p.value };
  if (form.seed.value !== "") body.seed = +form.seed.value;
  out.replaceChildren(el("span", { class: "prompt" }, body.prompt));
  stats.textContent = "";
  const record = { chunks: 0, events: 0, text: "", times: [], done: null };
  window.__ui.generation = record;
  const controller = new AbortController();
  stopGeneration = () => controller.abort();
  form.stop.disabled = false;
  $(form, "button[type=submit]").disabled = true;
  const started = performance.now();
  try {
    const response = await postJSON("api/generate", body, controller.signal);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      record.chunks += 1;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).split("\n").find((l) => l.startsWith("data: "));
        buffer = buffer.slice(cut + 2);
        if (!line || line === "data: [DONE]") continue;
        const data = JSON.parse(line.slice(6));
        if (data.error) throw new Error(data.error);
        if (data.done) {
          record.done = data;
          continue;
        }
        record.events += 1;
        record.text += data.text;
        record.times.push(performance.now() - started);
        const last = $(out, ".tok.new");
        if (last) last.classList.remove("new");
        out.append(el("span", { class: "tok new" }, data.text));
        stats.textContent = `${record.events} tokens so far`;
      }
    }
    const seconds = (performance.now() - started) / 1000;
    if (record.done) {
      stats.textContent = `${record.done.completion_tokens} tokens in ${fixed(seconds)} s `
        + `(${fixed(record.done.completion_tokens / seconds, 1)} tokens/s), finish: ${record.done.finish_reason}`;
    }
  } catch (err) {
    if (err.name !== "AbortError") throw err;
    stats.textContent = `stopped after ${record.events} tokens`;
  } finally {
    stopGeneration = null;
    form.stop.disabled = true;
    $(form, "button[type=submit]").disabled = false;
  }
}

// ------------------------------------------------------------------ the page

function setup(info, panel, handler) {
  const section = document.getElementById(`panel-${panel}`);
  const state = info.panels[panel];
  const form = $(section, "form");
  if (!state.available) {
    const box = $(section, ".unavailable");
    box.textContent = state.message;
    box.hidden = false;
    form.hidden = true;
    section.dataset.state = "unavailable";
    return;
  }
  $(section, ".model").textContent = `model: ${state.model}`;
  section.dataset.state = "ready";
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = $(section, ".error");
    error.hidden = true;
    section.dataset.state = "busy";
    try {
      await handler(section, form);
      section.dataset.state = "done";
    } catch (err) {  // the server's reason, in the panel (not an error of the page)
      error.textContent = err.message;
      error.hidden = false;
      section.dataset.state = "error";
    }
  });
}

async function init() {
  const status = document.getElementById("status");
  let info;
  try {
    const response = await fetch("api/info");
    info = await response.json();
  } catch (err) {
    status.textContent = `The server did not answer: ${err.message}`;
    status.dataset.state = "error";
    return;
  }
  const names = {};
  for (const [panel, state] of Object.entries(info.panels)) {
    if (state.available) (names[state.model] = names[state.model] || []).push(panel);
  }
  status.textContent = Object.keys(names).length
    ? Object.entries(names).map(([model, panels]) => `${model}: ${panels.join(", ")}`).join(" \u00b7 ")
    : "No models: every panel says how to add one.";
  status.dataset.state = "ready";

  const sim = $(document, "#panel-similarity form");
  for (const word of Object.keys(info.demo_words)) sim.example.append(el("option", { value: word }, word));
  sim.example.addEventListener("change", () => {
    sim.word.value = sim.example.value;
    sim.sentences.value = exampleLines(info.demo_words, sim.example.value);
  });
  if (info.demo_words.bank) sim.sentences.value = exampleLines(info.demo_words, "bank");

  const gen = $(document, "#panel-generate form");
  gen.max_new_tokens.max = info.limits.max_new_tokens;
  for (const range of gen.querySelectorAll("input[type=range]")) {
    range.addEventListener("input", () => { range.nextElementSibling.textContent = range.value; });
  }
  gen.stop.addEventListener("click", () => stopGeneration && stopGeneration());

  setup(info, "similarity", similarity);
  setup(info, "attention", attention);
  setup(info, "fill-mask", fillMask);
  setup(info, "qa", questionAnswering);
  setup(info, "ner", entities);
  setup(info, "generate", generation);
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", init);
