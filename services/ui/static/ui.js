// Reel UI: progressive enhancement of the server-rendered pages (they work without this file).
// Runs page: rows replaced/inserted live (SSE /events). Run page: lazy blob viewers paged by byte
// range, the live commit log and body refresh (SSE /runs/<id>/events). Text is set with textContent
// only, never parsed as HTML, except row/body fragments the server rendered (and escaped).
"use strict";

function connect(url, handlers) {
  let es = null;
  const open = () => {
    es = new EventSource(typeof url === "function" ? url() : url);
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => fn(JSON.parse(ev.data)));
    }
    es.onerror = () => { es.close(); setTimeout(open, 2000); };
  };
  open();
}

function ages() {
  const now = Date.now();
  for (const td of document.querySelectorAll("tr[data-created-ms] td.age")) {
    const ms = Number(td.parentElement.dataset.createdMs);
    if (!ms) continue;
    const s = Math.max(0, Math.floor((now - ms) / 1000));
    td.textContent = s >= 86400 ? `${Math.floor(s / 86400)} d` : s >= 3600 ? `${Math.floor(s / 3600)} h`
      : s >= 60 ? `${Math.floor(s / 60)} min` : `${s} s`;
  }
}

function runsPage(table) {
  const body = table.tBodies[0];
  const live = document.getElementById("live-runs");
  const rowOf = (id) => body.querySelector(`tr[data-run="${CSS.escape(id)}"]`);
  connect(table.dataset.events, {
    ready: () => { live.textContent = "live"; live.dataset.live = "1"; },
    run: (m) => {
      const tpl = document.createElement("template");
      tpl.innerHTML = m.html.trim();
      const row = tpl.content.firstElementChild;
      const old = rowOf(m.run_id);
      if (old) old.replaceWith(row); else body.prepend(row);
      document.getElementById("empty").hidden = true;
    },
    remove: (m) => { const old = rowOf(m.run_id); if (old) old.remove(); },
  });
  setInterval(ages, 5000);
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

function viewers(root) {
  root.addEventListener("toggle", (ev) => {
    const v = ev.target;
    if (v.matches && v.matches("details.viewer") && v.open && !v.dataset.loaded && !v.dataset.loading) {
      v.dataset.loading = "1";
      loadPage(v).finally(() => { delete v.dataset.loading; });
    }
  }, true);
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest && ev.target.closest("button.more");
    if (b) loadPage(b.closest("details.viewer"));
  });
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

  async function refresh() {
    if (busy || head <= shown) return;
    busy = true;
    const want = head;
    try {
      const r = await fetch(`/runs/${encodeURIComponent(id)}/body${branch ? `?branch=${encodeURIComponent(branch)}` : ""}`);
      if (!r.ok) return;
      const html = await r.text();
      const kept = new Map();  // open viewers keep their text and place
      for (const v of body.querySelectorAll("details.viewer[open]")) {
        kept.set(v.dataset.key, { text: v.querySelector("pre.blob-text").textContent, next: v.dataset.next,
                                  loaded: v.dataset.loaded, progress: v.querySelector(".progress").textContent,
                                  more: v.querySelector("button.more").hidden });
      }
      body.innerHTML = html;
      for (const v of body.querySelectorAll("details.viewer")) {
        const k = kept.get(v.dataset.key);
        if (!k) continue;
        v.querySelector("pre.blob-text").textContent = k.text;
        if (k.loaded) { v.dataset.loaded = k.loaded; v.dataset.next = k.next; }
        v.querySelector(".progress").textContent = k.progress;
        v.querySelector("button.more").hidden = k.more;
        v.open = true;
      }
      shown = Number(document.getElementById("run-head").dataset.head) || want;
      run.dataset.shown = String(shown);
    } finally {
      busy = false;
      if (head > shown) setTimeout(refresh, 200);
    }
  }

  viewers(document);
  connect(() => `/runs/${encodeURIComponent(id)}/events?after=${head}`, {
    commits: (m) => {
      for (const c of m.commits) {
        const li = document.createElement("li");
        li.dataset.lsn = String(c.lsn);
        li.textContent = `lsn ${c.lsn}  ${c.lines.join("\n          ")}`;
        log.append(li);
      }
      head = Math.max(head, m.head_lsn);
      state.textContent = `live · head lsn ${head} · ${m.status}${m.outcome ? ` · outcome ${m.outcome}` : ""}`;
      state.dataset.live = "1";
      refresh();
    },
    corrupt: (m) => { state.textContent = m.message; state.classList.add("error"); },
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("runs");
  if (table) runsPage(table);
  const run = document.getElementById("run");
  if (run) runPage(run);
  if (!run && document.querySelector("details.viewer")) viewers(document);
});
