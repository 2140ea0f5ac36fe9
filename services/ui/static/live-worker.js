// Reel UI: the live feed shared by every page of this origin (a SharedWorker). It keeps ONE EventSource to
// /live while at least one page is connected, and relays its events to them: {type: "ready", tokens} when the
// stream (re)opens, {type: "moved", run_ids} when runs get commits, {type: "tokens", chunks} with what the model
// attempts of the page's run stream. A page posts {type: "hello", tokens: <its run id, or null>} to join (again,
// to change what it asks for) and "bye" when it is hidden or closed; the stream closes with the last page, so a
// browser holds one connection at most however many tabs are open, and none for pages in the back/forward
// cache. The stream forwards the tokens of the runs the pages ask for (at most MAX_TOKEN_RUNS): when that set
// changes the stream is reopened with the new set (each page then catches up, as after any reconnect).
"use strict";

const MAX_TOKEN_RUNS = 32;  // services/ui/app.py's MAX_TOKEN_RUNS
const ports = new Map();  // port → the run whose tokens it wants (or null)
let es = null;
let opened = "";  // the token runs `es` was opened with (comma-joined)
let ready = false;
let readyTokens = [];
let retry = null;

function send(m) { for (const p of ports.keys()) p.postMessage(m); }

function wanted() {
  return [...new Set([...ports.values()].filter((r) => r))].sort().slice(0, MAX_TOKEN_RUNS).join(",");
}

function open() {
  opened = wanted();
  es = new EventSource(opened ? `/live?tokens=${encodeURIComponent(opened)}` : "/live");
  es.addEventListener("ready", (ev) => {
    ready = true;
    readyTokens = JSON.parse(ev.data).tokens || [];
    send({ type: "ready", tokens: readyTokens });
  });
  es.addEventListener("moved", (ev) => send({ type: "moved", run_ids: JSON.parse(ev.data).run_ids }));
  es.addEventListener("tokens", (ev) => {
    const chunks = JSON.parse(ev.data).chunks;
    for (const [p, run] of ports) {
      const mine = chunks.filter((c) => c.run_id === run);
      if (mine.length) p.postMessage({ type: "tokens", chunks: mine });
    }
  });
  es.onerror = () => {
    ready = false;
    if (es.readyState === EventSource.CLOSED && ports.size) {  // not retried by the browser: retry here
      es = null;
      retry = setTimeout(() => { retry = null; if (ports.size && !es) open(); }, 2000);
    }
  };
}

function close() {
  if (es) es.close();
  es = null;
  ready = false;
  if (retry) clearTimeout(retry);
  retry = null;
}

self.onconnect = (ev) => {
  const port = ev.ports[0];
  port.onmessage = (m) => {
    const hello = m.data === "hello" ? { type: "hello", tokens: null } : m.data;
    if (hello && hello.type === "hello") {
      ports.set(port, typeof hello.tokens === "string" ? hello.tokens : null);
      if (!es && !retry) open();
      else if (es && wanted() !== opened) { close(); open(); }  // another set of token runs: one stream still
      else if (ready) port.postMessage({ type: "ready", tokens: readyTokens });
    } else if (m.data === "bye") {
      ports.delete(port);
      if (!ports.size) close();
      else if (es && wanted() !== opened) { close(); open(); }
    }
  };
  port.start();
};
