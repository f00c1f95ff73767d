"use strict";
// The admin dashboard: polls /admin/stats and /admin/recent (with the admin
// token) every 2 s, keeps a short history in memory and draws it as
// sparklines, shows the hit ratio against its alert threshold, lists the
// recent keys (each row opens its timeline), and looks up one key's
// timeline by tenant id or by the client's credential (sent in the
// X-Idemgate-Credential header, never in the URL). No external resources,
// no build step.
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

  // The hit ratio against the rule that alerts on it (as /admin/stats
  // reports it: the baseline, and the ratio at which the alert fires).
  function renderAlert(a) {
    const gauge = $("gauge-ratio"), mark = $("gauge-threshold"), state = $("alert-state");
    const rule = a.factor + "× baseline, at least " + percent(a.factor * a.floor);
    // The gauge spans twice the threshold (or 100%), so the mark sits mid-way.
    const span = a.threshold !== null ? Math.min(1, Math.max(2 * a.threshold, 0.02)) : 1;
    gauge.style.width = (Math.min(a.ratio / span, 1) * 100).toFixed(1) + "%";
    gauge.className = "gauge-ratio" + (a.state.startsWith("above") ? " above" : "");
    state.className = "detail alert-state" + (a.state.startsWith("above") ? " above" : "");
    if (a.baseline === null) {
      setText("hit-baseline", "in " + a.minutes_to_baseline + " min");
      setText("hit-threshold", rule);
      mark.hidden = true;
      state.textContent = a.alert + ": no baseline yet (it is the hour ending 15 min ago)";
      return;
    }
    setText("hit-baseline", percent(a.baseline));
    setText("hit-threshold", percent(a.threshold) + " (" + rule + ")");
    mark.hidden = false;
    mark.style.left = (Math.min(a.threshold / span, 1) * 100).toFixed(1) + "%";
    const text = {
      above: "above the threshold: " + a.alert + " fires if this lasts 5 min",
      above_low_traffic: "above the threshold, but under " + a.min_rate + " keyed req/s: " + a.alert + " stays quiet",
      below: percent(Math.max(0, a.threshold - a.ratio)) + " below the threshold of " + a.alert,
    };
    state.textContent = text[a.state] || a.state;
  }

  function render(s) {
    setText("hit-ratio", percent(s.hit_ratio));
    renderAlert(s.hit_ratio_alert);
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
    renderRoutes(s.routes || []);

    push(history.ratio, s.hit_ratio);
    // Conflicts and tokens: what each interval added.
    push(history.conflicts, previous ? Math.max(0, s.inflight_conflicts - previous.inflight_conflicts) : 0);
    push(history.tokens, previous ? Math.max(0, s.tokens_saved - previous.tokens_saved) : 0);
    previous = s;
    spark("spark-hit-ratio", history.ratio, 1);
    spark("spark-conflicts", history.conflicts);
    spark("spark-tokens", history.tokens);
  }

  // One row per route: the share of its requests that ran protected, and
  // the two causes of the rest (a client that sent no key, a store down
  // under fail_open).
  function renderRoutes(routes) {
    const tbody = $("routes").querySelector("tbody");
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    for (const r of routes) {
      const tr = document.createElement("tr");
      const share = r.protected_share === null ? "–" : percent(r.protected_share);
      for (const cell of [r.route, String(r.requests), share, String(r.unprotected_no_key), String(r.unprotected_store_error)]) {
        const td = document.createElement("td");
        td.textContent = cell;
        tr.appendChild(td);
      }
      if (r.protected_share !== null && r.protected_share < 1) tr.className = "unprotected";
      tbody.appendChild(tr);
    }
  }

  const KINDS = { inflight: "in flight", conflicts: "conflict", fenced: "fenced", most_retried: "retried" };

  function ago(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }

  function whenText(kind, row, now) {
    if (kind === "inflight") return "running for " + ago(now - row.running_since_ms).replace(" ago", "");
    if (kind === "conflicts") return ago(now - row.last_conflict_ms);
    if (kind === "fenced") return ago(now - row.last_fenced_ms);
    return ago(now - row.last_seen_ms);
  }

  function openRow(row) {
    $("f-key").value = row.key;
    $("f-tenant").value = row.tenant;
    $("f-credential").value = "";
    $("f-namespace").value = row.namespace;
    lookup(row.key, row.tenant, row.namespace, "", $("f-token").value);
  }

  // The rows shown, so a poll that changes nothing but the times keeps
  // them (a row under the pointer or with the focus stays put).
  let shownRows = null;

  function renderRecent(r) {
    const tbody = $("recent").querySelector("tbody");
    const entries = [];
    for (const kind of Object.keys(KINDS)) {
      for (const row of r[kind] || []) entries.push([kind, row]);
    }
    const signature = JSON.stringify(entries.map(([kind, row]) =>
      [kind, row.key, row.tenant, row.namespace, row.requests, row.last_outcome]));
    if (signature === shownRows) {
      tbody.querySelectorAll("td.when").forEach((td, i) => {
        const [kind, row] = entries[i];
        td.textContent = whenText(kind, row, r.time_ms);
      });
      return;
    }
    shownRows = signature;
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    let n = 0;
    for (const [kind, row] of entries) {
      {
        const tr = document.createElement("tr");
        tr.className = "recent-row";
        tr.dataset.kind = kind;
        tr.dataset.key = row.key;
        tr.tabIndex = 0;
        tr.title = "open the timeline of " + row.key;
        const cells = [
          [KINDS[kind], "kind"],
          [row.key, "key"],
          [row.prefix || row.namespace, ""],
          [row.tenant.length > 12 ? row.tenant.slice(0, 12) + "…" : row.tenant, ""],
          [String(row.requests), ""],
          // A key running now: its execution has no outcome yet.
          kind === "inflight" ? ["running", "outcome-running"]
            : [row.last_outcome || "running", "outcome-" + (row.last_outcome || "running")],
          [whenText(kind, row, r.time_ms), "when"],
        ];
        for (const [text, cls] of cells) {
          const td = document.createElement("td");
          td.textContent = text;
          if (cls) td.className = cls;
          tr.appendChild(td);
        }
        tr.addEventListener("click", () => openRow(row));
        tr.addEventListener("keydown", (ev) => { if (ev.key === "Enter") openRow(row); });
        tbody.appendChild(tr);
        n += 1;
      }
    }
    $("recent").hidden = n === 0;
    $("recent-empty").hidden = n > 0;
  }

  async function getJson(path, token) {
    const r = await fetch(path, {
      cache: "no-store",
      headers: token ? { Authorization: "Bearer " + token } : {},
    });
    if (!r.ok) throw new Error("HTTP " + r.status);
    return r.json();
  }

  async function poll() {
    try {
      const token = $("f-token").value;
      const [stats, recent] = await Promise.all([
        getJson("/admin/stats", token),
        getJson("/admin/recent", token),
      ]);
      render(stats);
      renderRecent(recent);
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

  async function lookup(key, tenant, namespace, credential, token) {
    const summary = $("timeline-summary");
    clearTimeline();
    summary.className = "summary";
    summary.textContent = "looking up…";
    const q = new URLSearchParams();
    if (tenant) q.set("tenant", tenant);
    if (namespace) q.set("namespace", namespace);
    // The credential goes in a header, never in the URL (URLs get logged).
    const headers = {};
    if (token) headers.Authorization = "Bearer " + token;
    if (credential) headers["X-Idemgate-Credential"] = credential;
    try {
      const r = await fetch("/admin/keys/" + encodeURIComponent(key) + "/timeline?" + q.toString(), {
        cache: "no-store",
        headers,
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
    lookup(f.key.value.trim(), f.tenant.value.trim(), f.namespace.value.trim(), f.credential.value, f.token.value);
  });

  // ?key=&tenant=&namespace= opens a timeline directly, once the admin
  // token is typed. The token itself is never read from the address: a
  // secret in a URL ends up in history and logs; a `token=` left there is
  // taken out.
  const params = new URLSearchParams(window.location.search);
  $("f-key").value = params.get("key") || "";
  $("f-tenant").value = params.get("tenant") || "";
  $("f-namespace").value = params.get("namespace") || "";
  if (params.has("token")) {
    params.delete("token");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
  }
  let pendingLookup = Boolean($("f-key").value);
  $("f-token").addEventListener("change", () => {
    poll();
    if (pendingLookup && $("f-token").value) {
      pendingLookup = false;
      lookup($("f-key").value, $("f-tenant").value, $("f-namespace").value, "", $("f-token").value);
    }
  });

  poll();
  setInterval(poll, POLL_MS);
})();
