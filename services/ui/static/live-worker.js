// Reel UI: the live feed shared by every page of this origin (a SharedWorker). It keeps ONE EventSource to
// /live while at least one page is connected, and relays its events to them: {type: "ready"} when the
// stream (re)opens, {type: "moved", run_ids} when runs get commits. A page posts "hello" to join and "bye"
// when it is hidden or closed; the stream closes with the last page, so a browser holds one connection at
// most however many tabs are open, and none for pages in the back/forward cache.
"use strict";

const ports = new Set();
let es = null;
let ready = false;
let retry = null;

function send(m) { for (const p of ports) p.postMessage(m); }

function open() {
  es = new EventSource("/live");
  es.addEventListener("ready", () => { ready = true; send({ type: "ready" }); });
  es.addEventListener("moved", (ev) => send({ type: "moved", run_ids: JSON.parse(ev.data).run_ids }));
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
    if (m.data === "hello") {
      ports.add(port);
      if (!es && !retry) open(); else if (ready) port.postMessage({ type: "ready" });
    } else if (m.data === "bye") {
      ports.delete(port);
      if (!ports.size) close();
    }
  };
  port.start();
};
