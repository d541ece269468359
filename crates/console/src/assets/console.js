// Cairn console: the one script. Pages are complete without it; it only
// keeps a task's timeline live, appending the rows the daemon renders and
// sends as server-sent events (already escaped HTML, from the same code
// that renders the page), and fetches the ledger's verdict into its place.
"use strict";
// The ledger's verdict walks the whole chain: fetched after the page.
document.addEventListener("DOMContentLoaded", () => {
  const ledger = document.querySelector("#ledger[data-src]");
  if (!ledger) return;
  fetch(ledger.dataset.src, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.text() : Promise.reject(new Error(r.status))))
    .then((html) => { ledger.innerHTML = html; })
    .catch(() => {});
});
document.addEventListener("DOMContentLoaded", () => {
  const list = document.querySelector("ol.timeline[data-live]");
  if (!list) return;
  const status = document.createElement("p");
  status.className = "live";
  status.textContent = "live";
  list.before(status);
  const source = new EventSource(list.dataset.live);
  source.addEventListener("row", (e) => {
    if (document.getElementById("ev-" + e.lastEventId)) return;
    const t = document.createElement("template");
    t.innerHTML = e.data;
    list.append(t.content);
  });
  source.onopen = () => { status.textContent = "live"; status.classList.remove("off"); };
  source.onerror = () => { status.textContent = "reconnecting"; status.classList.add("off"); };
});
