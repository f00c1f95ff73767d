"use strict";
// The admin dashboard: polls /admin/stats (with the admin token) every 2 s, keeps a short history
// in memory and draws it as sparklines; looks up one key's timeline with
// the admin token. No external resources, no build step.
(function () {
  const POLL_MS = 2000;
  const HISTORY = 150; // 5 minutes of 2 s samples
  const history = { ratio: [], conflicts: [], tokens: [] };
  let previous = null;

  const $ = (id) => document.getElementById(id);
  const setText = (id, text) => { $(id).textContent = text; };

  function percent(ratio) {
    return (Math.round(ratio * 1000) / 10).toFixed(1) + "%";
  }

  function push(series, value) {
    series.push(value);
    if (series.length > HISTORY) series.shift();
  }

  function spark(id, values, fixedMax) {
    const svg = $(id);
    const w = 300, h = 60, pad = 3;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    if (values.length === 0) return;
    const max = fixedMax !== undefined ? fixedMax : Math.max(1, ...values);
    const step = values.length > 1 ? w / (values.length - 1) : 0;
    const pts = values.map((v, i) => {
      const x = values.length > 1 ? i * step : w / 2;
      const y = h - pad - (Math.min(v, max) / max) * (h - 2 * pad);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    const ns = "http://www.w3.org/2000/svg";
    const area = document.createElementNS(ns, "polygon");
    area.setAttribute("class", "area");
    const first = pts[0].split(",")[0], last = pts[pts.length - 1].split(",")[0];
    area.setAttribute("points", first + "," + h + " " + pts.join(" ") + " " + last + "," + h);
    svg.appendChild(area);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.appendChild(line);
  }

  function render(s) {
    setText("hit-ratio", percent(s.hit_ratio));
    setText("hits", String(s.hits));
    setText("requests", String(s.requests_total));
    setText("conflicts", String(s.inflight_conflicts));
    setText("tokens-saved", String(s.tokens_saved));
    setText("per-key-p50", String(s.requests_per_key.p50));
    setText("per-key-p99", String(s.requests_per_key.p99));
    const parts = Object.entries(s.outcomes)
      .filter(([, n]) => n > 0)
      .map(([o, n]) => o + " " + n);
    setText("outcomes", parts.length ? parts.join(" · ") : "no keyed requests yet");

    push(history.ratio, s.hit_ratio);
    // Conflicts and tokens: what each interval added.
    push(history.conflicts, previous ? Math.max(0, s.inflight_conflicts - previous.inflight_conflicts) : 0);
    push(history.tokens, previous ? Math.max(0, s.tokens_saved - previous.tokens_saved) : 0);
    previous = s;
    spark("spark-hit-ratio", history.ratio, 1);
    spark("spark-conflicts", history.conflicts);
    spark("spark-tokens", history.tokens);
  }

  async function poll() {
    try {
      const token = $("f-token").value;
      const r = await fetch("/admin/stats", {
        cache: "no-store",
        headers: token ? { Authorization: "Bearer " + token } : {},
      });
      if (!r.ok) throw new Error("HTTP " + r.status);
      render(await r.json());
      const st = $("status");
      st.className = "status";
      st.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      const st = $("status");
      st.className = "status error";
      st.textContent = "stats unavailable: " + e.message;
    }
  }

  function clearTimeline() {
    const table = $("timeline");
    const body = table.querySelector("tbody");
    while (body.firstChild) body.removeChild(body.firstChild);
    table.hidden = true;
  }

  function summaryText(t) {
    let state = t.state;
    if (t.state === "done" && t.status !== null && t.status !== undefined) state += " (status " + t.status + ")";
    if (t.state === "pending") state += " (running)";
    const n = t.attempts.reduce((sum, a) => sum + (a.count || 1), 0);
    return "key " + t.key + " · route " + t.namespace + " · tenant " + t.tenant + " · state: " + state +
      " · " + n + " attempt" + (n === 1 ? "" : "s");
  }

  async function lookup(key, tenant, namespace, token) {
    const summary = $("timeline-summary");
    clearTimeline();
    summary.className = "summary";
    summary.textContent = "looking up…";
    const q = new URLSearchParams();
    if (tenant) q.set("tenant", tenant);
    if (namespace) q.set("namespace", namespace);
    try {
      const r = await fetch("/admin/keys/" + encodeURIComponent(key) + "/timeline?" + q.toString(), {
        cache: "no-store",
        headers: token ? { Authorization: "Bearer " + token } : {},
      });
      const body = await r.json();
      if (!r.ok) {
        summary.className = "summary error";
        summary.textContent = (body.title || ("HTTP " + r.status)) + ": " + (body.detail || "");
        return;
      }
      summary.textContent = summaryText(body);
      const table = $("timeline");
      const tbody = table.querySelector("tbody");
      for (const a of body.attempts) {
        const tr = document.createElement("tr");
        tr.className = "attempt";
        tr.dataset.outcome = a.outcome;
        const cells = [
          a.at,
          a.replica,
          (a.count || 1) > 1 ? a.outcome + " ×" + a.count : a.outcome,
          a.status === null || a.status === undefined ? "–" : String(a.status),
          a.latency_ms.toFixed(1) + " ms",
        ];
        cells.forEach((text, i) => {
          const td = document.createElement("td");
          td.textContent = text;
          if (i === 2) td.className = "outcome-" + a.outcome;
          tr.appendChild(td);
        });
        tbody.appendChild(tr);
      }
      table.hidden = body.attempts.length === 0;
    } catch (e) {
      summary.className = "summary error";
      summary.textContent = "lookup failed: " + e.message;
    }
  }

  $("lookup").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = ev.target;
    lookup(f.key.value.trim(), f.tenant.value.trim(), f.namespace.value.trim(), f.token.value);
  });

  // ?key=&tenant=&namespace=&token= opens a timeline directly; the token
  // is then taken out of the address bar (and history).
  const params = new URLSearchParams(window.location.search);
  $("f-key").value = params.get("key") || "";
  $("f-tenant").value = params.get("tenant") || "";
  $("f-namespace").value = params.get("namespace") || "";
  $("f-token").value = params.get("token") || "";
  if (params.has("token")) {
    params.delete("token");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
  }
  if ($("f-key").value) {
    lookup($("f-key").value, $("f-tenant").value, $("f-namespace").value, $("f-token").value);
  }

  poll();
  setInterval(poll, POLL_MS);
})();
