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
// A running command's output, as it comes: written as text (textContent),
// never parsed as markup, in one block per command (by its step).
document.addEventListener("DOMContentLoaded", () => {
  const section = document.querySelector("#running[data-live]");
  if (!section) return;
  const KEEP = 64 * 1024; // characters of output shown per command
  const block = (step, argv) => {
    let b = section.querySelector(`div.cmd[data-step="${step}"]`);
    if (!b) {
      b = document.createElement("div");
      b.className = "cmd running";
      b.dataset.step = String(step);
      const head = document.createElement("p");
      head.className = "head";
      b.append(head, document.createElement("pre"));
      section.append(b);
    }
    if (argv) b.querySelector("p.head").textContent = "$ " + argv.join(" ") + "  (step " + step + ", running)";
    return b;
  };
  const source = new EventSource(section.dataset.live);
  const data = (e) => { try { return JSON.parse(e.data); } catch { return null; } };
  source.addEventListener("started", (e) => { const d = data(e); if (d) block(d.step, d.argv); });
  source.addEventListener("output", (e) => {
    const d = data(e);
    if (!d) return;
    const pre = block(d.step).querySelector("pre");
    pre.textContent = (pre.textContent + d.text).slice(-KEEP);
  });
  source.addEventListener("exited", (e) => {
    const d = data(e);
    if (!d) return;
    const b = block(d.step);
    b.classList.remove("running");
    const head = b.querySelector("p.head");
    head.textContent = head.textContent.replace(", running)", ", exit " + d.exit_code + ")");
  });
  source.addEventListener("missed", (e) => {
    const d = data(e);
    const last = section.querySelector("div.cmd:last-of-type pre");
    if (d && last) last.textContent += "\n[" + d.missed + " chunks of output missed]\n";
  });
});
