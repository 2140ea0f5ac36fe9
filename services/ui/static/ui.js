// Reel UI: progressive enhancement of the server-rendered pages (they work without this file).
// Both pages follow one live feed per browser (liveFeed: SSE /live shared through a SharedWorker, else
// polling /heads), stopped while the page is hidden. Runs page: rows replaced/inserted as runs move
// (/runs/<id>/row). Run page: lazy blob viewers paged by byte range, the live commit log
// (/runs/<id>/commits), the body's changed fragments (/runs/<id>/delta) and the streamed tokens of the attempts
// in flight. Text is set with textContent only, never parsed as HTML, except row/body/conversation fragments the
// server rendered (and escaped).
"use strict";

const POLL_MS = 2000;  // how often a page without a shared feed polls /heads

// The live feed: onMoved([run ids]) when runs get commits, onReady(mode, tokenRuns) when the feed (re)starts (the
// page catches up then; tokenRuns: the runs whose streamed tokens it forwards), onTokens(chunks) with what the
// model attempts of the run tokens() names (null: none) stream. Shared by every tab through one SharedWorker
// (static/live-worker.js: one SSE connection per browser); where there is none, polling /heads (no tokens).
// Returns {stop(), rejoin()}: rejoin asks again for tokens() (when the page's run has ended: none).
function liveFeed(onMoved, onReady, tokens, onTokens) {
  if (typeof SharedWorker === "function") {
    try {
      const w = new SharedWorker("/static/live-worker.js");
      w.port.onmessage = (ev) => {
        if (ev.data.type === "moved") onMoved(ev.data.run_ids);
        else if (ev.data.type === "ready") onReady("shared", ev.data.tokens || []);
        else if (ev.data.type === "tokens") onTokens(ev.data.chunks);
      };
      w.port.start();
      const hello = () => w.port.postMessage({ type: "hello", tokens: tokens() });
      hello();
      return { stop: () => { w.port.postMessage("bye"); w.port.close(); }, rejoin: hello };
    } catch (err) { /* not allowed here: poll */ }
  }
  // each poll asks only for the runs with a commit above the stream sequence the last answer covered
  let last = null, timer = null, stopped = false;
  const poll = async () => {
    try {
      const r = await fetch(last === null ? "/heads?after=-1&limit=0" : `/heads?after=${last}`);
      const covered = r.ok ? Number(r.headers.get("X-Reel-Applied")) : NaN;
      if (r.ok && Number.isFinite(covered)) {
        const moved = Object.keys(await r.json());
        if (last === null) onReady("polling", []);
        else if (moved.length) onMoved(moved);
        last = Math.max(last ?? covered, covered);
      }
    } catch (err) { /* the server is away: try again */ }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  };
  poll();
  return { stop: () => { stopped = true; clearTimeout(timer); }, rejoin: () => {} };
}

// Follow the feed while the page is shown: stopped on pagehide (a page in the back/forward cache holds no
// connection), restarted on pageshow when the page comes back from that cache. Returns rejoin().
// Returns rejoin(), whose .stop() leaves the feed for good (the page's run has ended).
function follow(onMoved, onReady, tokens = () => null, onTokens = () => {}) {
  let feed = liveFeed(onMoved, onReady, tokens, onTokens);
  let done = false;
  window.addEventListener("pagehide", () => { if (feed) feed.stop(); feed = null; });
  window.addEventListener("pageshow", (ev) => {
    if (ev.persisted && !feed && !done) feed = liveFeed(onMoved, onReady, tokens, onTokens);
  });
  const rejoin = () => { if (feed) feed.rejoin(); };
  rejoin.stop = () => { done = true; if (feed) feed.stop(); feed = null; };
  return rejoin;
}

// A run at rest for good: its page follows nothing (no live connection is held for it). A rewind or a late
// verdict shows on reload.
const ENDED = new Set(["completed", "cancelled"]);
function ended(state, status) {
  state.textContent = `${status} · ended: this page no longer follows the run (reload to see a rewind)`;
  state.dataset.live = "0";
  state.dataset.ended = "1";
}

function liveBadge(el, mode) { el.textContent = mode === "shared" ? "live" : "live (polling)"; el.dataset.live = "1";
                               el.dataset.feed = mode; }

function ages() {
  const now = Date.now();
  for (const el of document.querySelectorAll("tr[data-created-ms] .age")) {
    const ms = Number(el.closest("tr").dataset.createdMs);
    if (ms) el.textContent = span(now - ms, true);
  }
  for (const el of document.querySelectorAll(".dur.running[data-from-ms]")) {
    el.textContent = `${span(now - Number(el.dataset.fromMs))}…`;
  }
}

// A span of ms as the server writes it (pages.duration); short: the runs page's age (pages.age).
function span(ms, short) {
  ms = Math.max(0, ms);
  const s = Math.floor(ms / 1000), pad = (n) => String(n).padStart(2, "0");
  if (short) return s >= 86400 ? `${Math.floor(s / 86400)} d` : s >= 3600 ? `${Math.floor(s / 3600)} h`
    : s >= 60 ? `${Math.floor(s / 60)} min` : `${s} s`;
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${pad(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${pad(Math.floor(s % 3600 / 60))} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor(s % 86400 / 3600)} h`;
}

// <time datetime> in local time (YYYY-MM-DD HH:MM:SS), UTC kept on hover (the title the server wrote).
function localTimes(root) {
  const pad = (n) => String(n).padStart(2, "0");
  for (const t of root.querySelectorAll("time.ts[datetime]:not([data-local])")) {
    const d = new Date(t.getAttribute("datetime"));
    t.textContent = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
      + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    t.dataset.local = "1";
  }
}

// Copy buttons (button.copy[data-copy]): the value to the clipboard; the button says so for a moment.
function copyButtons(root) {
  root.addEventListener("click", async (ev) => {
    const b = ev.target.closest && ev.target.closest("button.copy[data-copy]");
    if (!b) return;
    ev.preventDefault();
    const value = b.dataset.copy;
    let ok = false;
    try { await navigator.clipboard.writeText(value); ok = true; } catch (err) {
      const ta = document.createElement("textarea");  // no clipboard API here (not a secure context): the old way
      ta.value = value; ta.setAttribute("readonly", ""); ta.style.position = "fixed"; ta.style.opacity = "0";
      document.body.append(ta); ta.select();
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      ta.remove();
    }
    b.dataset.copied = ok ? "1" : "0";
    b.title = ok ? "copied" : "could not copy";
    setTimeout(() => { delete b.dataset.copied; }, 2000);
  });
}

function runsPage(table) {
  const body = table.tBodies[0];
  const live = document.getElementById("live-runs");
  const rowOf = (id) => body.querySelector(`tr[data-run="${CSS.escape(id)}"]`);
  const filter = table.dataset.filter;
  const upper = table.dataset.upper;  // a page of older runs: newer ones are not its to show
  const size = Number(table.dataset.pageSize) || 100;
  async function update(rid) {
    const r = await fetch(`/runs/${encodeURIComponent(rid)}/row?${filter}${upper ? `&upper=${upper}` : ""}`);
    if (!r.ok) return;
    const m = await r.json();
    const old = rowOf(m.run_id);
    if (m.remove) { if (old) old.remove(); return; }
    const tpl = document.createElement("template");
    tpl.innerHTML = m.html.trim();
    const row = tpl.content.firstElementChild;
    localTimes(tpl.content);
    if (old) old.replaceWith(row);
    else {  // newest first by key: in its place, unless it belongs to a later page
      const next = [...body.rows].find((tr) => Number(tr.dataset.key) < m.key);
      if (next) body.insertBefore(row, next);
      else if (body.rows.length < size) body.append(row);
      else return;
      while (body.rows.length > size) body.rows[body.rows.length - 1].remove();
    }
    document.getElementById("empty").hidden = true;
  }
  let started = false;
  window.addEventListener("pagehide", () => { live.dataset.live = "0"; });
  follow((ids) => { for (const rid of ids) update(rid); }, async (mode) => {
    liveBadge(live, mode);
    if (!started) { started = true; return; }
    // back from the cache or reconnected: rows may have moved meanwhile — take the page's rows afresh
    const r = await fetch(location.href);
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    const fresh = doc.querySelector("#runs tbody");
    if (fresh) { localTimes(fresh); body.replaceChildren(...fresh.children); }
  });
}

async function loadPage(viewer) {
  const pre = viewer.querySelector("pre.blob-text");
  const more = viewer.querySelector("button.more");
  const progress = viewer.querySelector(".progress");
  const offset = Number(viewer.dataset.next || 0);
  more.disabled = true;
  try {
    const r = await fetch(`${viewer.dataset.blob}?format=json&offset=${offset}&length=${viewer.dataset.pageBytes}`);
    const page = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(page.error || `HTTP ${r.status}`);
    pre.append(document.createTextNode(page.text));
    viewer.dataset.next = String(page.end);
    viewer.dataset.loaded = "1";
    more.hidden = page.end >= page.total;
    progress.textContent = `${page.end} of ${page.total} bytes`;
  } catch (err) {
    progress.textContent = `could not load: ${err.message}`;
    viewer.dataset.failed = "1";
  } finally {
    more.disabled = false;
  }
}

// A fragment the server rendered (escaped) into a pane of an opened <details>, once: a prompt or output as a
// conversation (data-chat: <data-blob>?format=chat&fragment=1, with &role=… for a text body shown as one message;
// its raw bytes page in the nested "raw bytes" details), or a collapsed partition's items in full (its "open as a
// page" link &fragment=1). Resolves r.ok.
async function loadFragment(el, url, pane) {
  if (el.dataset.fragmentLoaded || el.dataset.fragmentLoading) return true;
  el.dataset.fragmentLoading = "1";
  try {
    const r = await fetch(url);
    pane.innerHTML = await r.text();
    el.dataset.fragmentLoaded = r.ok ? "1" : "none";
    return r.ok;
  } catch (err) {
    pane.textContent = `could not load: ${err.message}`;
    return false;
  } finally {
    delete el.dataset.fragmentLoading;
  }
}

async function loadChat(viewer) {
  const role = viewer.dataset.chat === "1" ? "" : `&role=${encodeURIComponent(viewer.dataset.chat)}`;
  const ok = await loadFragment(viewer, `${viewer.dataset.blob}?format=chat&fragment=1${role}`,
                                viewer.querySelector(".chat-pane"));
  if (!ok) viewer.querySelector("details.raw-bytes").open = true;  // not a conversation: the bytes instead
}

function viewers(root) {
  const page = (v) => {
    if (v.dataset.loaded || v.dataset.loading) return;
    v.dataset.loading = "1";
    loadPage(v).finally(() => { delete v.dataset.loading; });
  };
  root.addEventListener("toggle", (ev) => {
    const v = ev.target;
    if (!v.matches || !v.open) return;
    if (v.matches("details.viewer") && v.dataset.chat) loadChat(v);
    else if (v.matches("details.viewer")) page(v);
    else if (v.matches("details.raw-bytes")) page(v.closest("details.viewer"));
    else if (v.matches("details.all-items")) {
      loadFragment(v, `${v.querySelector("a.as-page").getAttribute("href")}&fragment=1`, v.querySelector(".fragment-pane"));
    }
  }, true);
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest && ev.target.closest("button.more");
    if (b) loadPage(b.closest("details.viewer"));
  });
}

// An operator's half-filled action form (reel ui --allow-actions) is never swapped away under their hands: while
// one holds typed text or the focus, the body waits.
function editing(root) {
  for (const f of root.querySelectorAll("form.act input[type=text], form.act textarea")) {
    if (f.value !== f.defaultValue || f === document.activeElement) return true;
  }
  return false;
}

// The run body's fragments by key, as services/ui/fragments.py keys them: a container's (the body's, or the
// timeline's) child elements by id, or "~N" for the N-th child without one.
function fragmentsOf(container) {
  const map = new Map();
  let n = 0;
  for (const el of container.children) map.set(el.id || `~${n++}`, el);
  return map;
}

// Apply a /runs/<id>/delta answer to the body: remove, then replace or insert each changed fragment (HTML the
// server rendered and escaped). False if the page does not hold what the delta refers to (take the whole body).
function applyDelta(body, m) {
  const parentOf = (c) => (c ? body.querySelector(`#${CSS.escape(c)}`) : body);
  const maps = new Map();
  for (const [c] of [...m.removed, ...m.changes]) {
    if (maps.has(c)) continue;
    const parent = parentOf(c);
    if (!parent) return false;
    maps.set(c, fragmentsOf(parent));
  }
  for (const [c, k] of m.removed) { const el = maps.get(c).get(k); if (el) el.remove(); maps.get(c).delete(k); }
  for (const [c, k, after, html] of m.changes) {
    const map = maps.get(c);
    const tpl = document.createElement("template");
    tpl.innerHTML = html;
    const el = tpl.content.firstElementChild;
    const old = map.get(k);
    if (old) old.replaceWith(el);
    else if (after === null) parentOf(c).prepend(el);
    else if (map.get(after)) map.get(after).after(el);
    else return false;
    map.set(k, el);
  }
  return true;
}

function runPage(run) {
  const id = run.dataset.run;
  const branch = run.dataset.branch;
  const body = document.getElementById("run-body");
  const log = document.getElementById("live-log");
  const state = document.getElementById("live-state");
  let shown = Number(run.dataset.head);  // the head LSN the body shows
  let head = shown;
  let busy = false;

  async function refresh() {  // the body at the new head: only the fragments that changed (/runs/<id>/delta)
    if (busy || head <= shown) return;
    if (editing(body)) { setTimeout(refresh, 500); return; }
    busy = true;
    try {
      const q = new URLSearchParams({ since: String(shown) });
      if (branch) q.set("branch", branch);
      const r = await fetch(`/runs/${encodeURIComponent(id)}/delta?${q}`);
      if (!r.ok) return;
      const m = await r.json();
      const kept = new Map();  // open viewers keep their text and place
      for (const v of body.querySelectorAll("details.viewer[open]")) {
        kept.set(v.dataset.key, { text: v.querySelector("pre.blob-text").textContent, next: v.dataset.next,
                                  loaded: v.dataset.loaded, progress: v.querySelector(".progress").textContent,
                                  more: v.querySelector("button.more").hidden });
      }
      if (typeof m.full === "string" || !applyDelta(body, m)) body.innerHTML = m.full ?? await wholeBody();
      localTimes(body);  // the re-rendered times (those kept are marked data-local already)
      for (const v of body.querySelectorAll("details.viewer:not([open])")) {  // the re-rendered ones
        const k = kept.get(v.dataset.key);
        if (!k) continue;
        v.querySelector("pre.blob-text").textContent = k.text;
        if (k.loaded) { v.dataset.loaded = k.loaded; v.dataset.next = k.next; }
        v.querySelector(".progress").textContent = k.progress;
        v.querySelector("button.more").hidden = k.more;
        v.open = true;
      }
      for (const k of ["lo", "hi", "n"]) body.style.setProperty(`--${k}`, String(m.axis[k]));  // the bars' LSN axis
      shown = m.head_lsn;
      run.dataset.shown = String(shown);
      run.dataset.updates = String(Number(run.dataset.updates || 0) + 1);
      run.dataset.lastUpdate = typeof m.full === "string" ? "full" : "delta";
      placeStreams();
      if (askedTokens && !inFlight()) { askedTokens = false; rejoin(); }  // ended: no more tokens to forward
    } finally {
      busy = false;
      if (head > shown) setTimeout(refresh, 200);
    }
  }

  async function wholeBody() {
    const r = await fetch(`/runs/${encodeURIComponent(id)}/body${branch ? `?branch=${encodeURIComponent(branch)}` : ""}`);
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    return r.text();
  }

  let fetching = false, again = false;
  async function catchUp() {  // the commits above the head shown in the log, then the body at the new head
    if (fetching) { again = true; return; }
    fetching = true;
    try {
      do {
        again = false;
        const r = await fetch(`/runs/${encodeURIComponent(id)}/commits?after=${head}`);
        const m = await r.json().catch(() => ({}));
        if (!r.ok) { state.textContent = m.error || `HTTP ${r.status}`; state.classList.add("error"); return; }
        for (const c of m.commits) {
          if (c.lsn <= head) continue;
          const li = document.createElement("li");
          li.dataset.lsn = String(c.lsn);
          li.textContent = `lsn ${c.lsn}  ${c.lines.join("\n          ")}`;
          log.append(li);
        }
        if (m.more) again = true;  // a capped answer: ask for the rest
        head = Math.max(head, m.head_lsn);
        state.textContent = `live · head lsn ${head} · ${m.status}${m.outcome ? ` · outcome ${m.outcome}` : ""}`;
        state.dataset.live = "1";
        state.dataset.feed = mode;
        if (ENDED.has(m.status) && !again) {  // ended: leave once a fetch finds nothing newer (the status may be
          if (m.commits.length) again = true;  // read past the commits the answer holds)
          else { rejoin.stop(); ended(state, m.status); }
        }
      } while (again);
    } catch (err) {
      state.textContent = `could not follow: ${err.message}`;
    } finally {
      fetching = false;
    }
    refresh();
  }

  // Streamed tokens of the attempts in flight (shared feed only): one block per attempt, inside the attempt on
  // the timeline once it is shown there (else in #live-tokens), gone when the attempt's outcome commit is shown.
  const streams = new Map();  // "branch/step/attempt" → {el, text, note, calls, next}
  const tokensBox = document.getElementById("live-tokens");
  const inFlight = () => !["completed", "cancelled"].includes(document.getElementById("run-head")?.dataset.status);
  let askedTokens = false;

  function attemptOf(s) {
    if (s.branch !== (document.getElementById("shown-branch")?.textContent || "")) return null;
    return body.querySelector(`div.attempt[data-step="${CSS.escape(s.step)}"][data-attempt="${s.attempt}"]`);
  }

  function placeStreams() {
    for (const [k, s] of streams) {
      const a = attemptOf(s);
      if (a && a.dataset.outcomeLsn) { s.el.remove(); streams.delete(k); continue; }  // its outcome is shown
      const home = a || tokensBox;
      if (s.el.parentElement !== home) home.append(s.el);
    }
  }

  function newStream(c) {
    const el = document.createElement("div");
    el.className = "tokens";
    Object.assign(el.dataset, { branch: c.branch, step: c.step, attempt: String(c.attempt) });
    const head = document.createElement("div");
    head.className = "tokens-head dim";
    head.textContent = `streaming · ${c.step} #${c.attempt} `;
    const note = document.createElement("span");
    head.append(note);
    const text = document.createElement("pre");
    text.className = "tokens-text";
    el.append(head, text);
    return { el, text, note, calls: new Map(), next: 0, branch: c.branch, step: c.step, attempt: c.attempt };
  }

  function onTokens(chunks) {
    for (const c of chunks) {
      const k = `${c.branch}/${c.step}/${c.attempt}`;
      if (!streams.has(k)) streams.set(k, newStream(c));
      const s = streams.get(k);
      if (c.seq !== s.next) {  // joined mid-way, or messages lost: the output blob has it all once committed
        s.el.dataset.gap = "1";
        s.note.textContent = "(some of the stream was not seen) ";
      }
      s.next = c.seq + 1;
      s.el.dataset.seq = String(c.seq);
      if (c.content) s.text.append(c.content);
      for (const t of c.tool_calls || []) {
        if (!s.calls.has(t.index)) {
          const line = document.createElement("pre");
          line.className = "tokens-call";
          s.el.append(line);
          s.calls.set(t.index, { line, name: "", args: "" });
        }
        const call = s.calls.get(t.index);
        call.name += t.name || "";
        call.args += t.arguments || "";
        call.line.textContent = `→ ${call.name}(${call.args})`;
      }
      if (c.done) {
        s.el.dataset.done = "1";
        s.note.textContent = c.error ? `stopped: ${c.error}` : `done (${c.finish_reason ?? "no finish reason sent"}) · its outcome commit follows`;
      }
    }
    placeStreams();
  }

  let mode = "";
  viewers(document);
  const status = document.getElementById("run-head")?.dataset.status || "";
  if (ENDED.has(status)) { ended(state, status); return; }
  window.addEventListener("pagehide", () => { state.dataset.live = "0"; });
  const rejoin = follow((ids) => { if (ids.includes(id)) catchUp(); }, (m, tokenRuns) => {
    mode = m;
    tokensBox.dataset.subscribed = tokenRuns.includes(id) ? "1" : "0";
    catchUp();
  }, () => { askedTokens = inFlight(); return askedTokens ? id : null; }, onTokens);
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  copyButtons(document);
  setInterval(ages, 5000);  // ages on the runs page, the durations of what is still going
  const table = document.getElementById("runs");
  if (table) runsPage(table);
  const run = document.getElementById("run");
  if (run) runPage(run);
  if (!run && document.querySelector("details.viewer")) viewers(document);
});
