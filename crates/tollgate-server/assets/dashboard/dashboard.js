"use strict";
// The tollgate dashboard: polls one JSON snapshot and draws it. Every text from the server is
// set with textContent, never parsed as HTML.
(function () {
  const COLUMNS = ["allowed", "denied", "shadow_would_deny", "soft_exceeded", "degraded"];
  const LABELS = {
    allowed: "allowed/s", denied: "denied/s", shadow_would_deny: "shadow would deny/s",
    soft_exceeded: "soft exceeded/s", degraded: "degraded/s",
  };
  const POLL_MS = 2000;
  const TOKEN_KEY = "tollgate-admin-token";
  const $ = (id) => document.getElementById(id);
  let last = null;
  let versionsShown = "";
  let timer = null;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "on") for (const [ev, f] of Object.entries(v)) node.addEventListener(ev, f);
      else if (v !== null && v !== undefined) node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

  function headers(json) {
    const h = {};
    if (token()) h["Authorization"] = "Bearer " + token();
    if (json) h["Content-Type"] = "application/json";
    return h;
  }

  function rate(x) {
    if (!x) return "0";
    if (x >= 100) return x.toFixed(0);
    if (x >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }

  function pct(x) {
    const p = x * 100;
    if (p === 0) return "0%";
    if (p < 0.1) return "<0.1%";
    return (p >= 10 ? p.toFixed(0) : p.toFixed(1)) + "%";
  }

  function ms(x) {
    if (x === null || x === undefined) return "> 1000 ms";
    return (x < 1 ? "≤ " + x.toFixed(3) : "≤ " + x.toFixed(1)) + " ms";
  }

  function ago(msValue) {
    const s = Math.round(msValue / 1000);
    if (s < 120) return s + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return Math.round(s / 3600) + " h";
  }

  function spark(series, color) {
    const svgNs = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(svgNs, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 100 20");
    svg.setAttribute("preserveAspectRatio", "none");
    const values = series.length ? series : [0];
    const max = Math.max(...values, 1e-9);
    const step = values.length > 1 ? 100 / (values.length - 1) : 100;
    const points = values.map((v, i) => (i * step).toFixed(2) + "," + (19 - (v / max) * 18).toFixed(2));
    const line = document.createElementNS(svgNs, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("stroke", color);
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
    return svg;
  }

  function cssColor(column) {
    const name = { shadow_would_deny: "--shadow", soft_exceeded: "--soft" }[column] || "--" + column;
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
  }

  function table(id, head, rows) {
    const t = $(id);
    t.replaceChildren();
    const tr = el("tr");
    for (const h of head) tr.append(el("th", { class: h.num ? "num" : null }, h.text ?? h));
    t.append(el("thead", {}, tr));
    const body = el("tbody");
    for (const r of rows) body.append(r);
    if (!rows.length) body.append(el("tr", {}, el("td", { colspan: head.length, class: "muted" }, "none")));
    t.append(body);
  }

  function card(label, value, attrs) {
    return el("div", Object.assign({ class: "card" }, attrs || {}),
      el("div", { class: "label" }, label), el("div", { class: "value" }, value));
  }

  function sum(rules, column, field) {
    return rules.reduce((a, r) => a + (r[field][column] || 0), 0);
  }

  function sumSeries(rules, column) {
    const n = Math.max(0, ...rules.map((r) => r.rates[column].length));
    const out = new Array(n).fill(0);
    for (const r of rules) r.rates[column].forEach((v, i) => { out[i] += v; });
    return out;
  }

  function rateCells(tr, source, seriesSource) {
    for (const c of COLUMNS) {
      tr.append(el("td", { class: "num c-" + c, "data-column": c }, rate(source[c])));
    }
    const s = el("td");
    s.append(spark(seriesSource("allowed"), cssColor("allowed")));
    tr.append(s);
    const d = el("td");
    d.append(spark(seriesSource("denied").map((v, i) => v + seriesSource("shadow_would_deny")[i]), cssColor("denied")));
    tr.append(d);
  }

  function drawNow(snap) {
    const rules = snap.rules;
    const cards = $("cards");
    cards.replaceChildren();
    for (const c of COLUMNS) {
      cards.append(card(LABELS[c], rate(sum(rules, c, "now")), { id: "now-" + c, class: "card c-" + c }));
    }
    const d = snap.latency.decision, s = snap.latency.store;
    const window = Math.round(snap.latency_window_ms / 1000) + " s";
    cards.append(card("decision p50 / p99 (" + window + ")", d && d.count ? ms(d.p50_ms) + " / " + ms(d.p99_ms) : "no decisions"));
    cards.append(card("store p50 / p99 (" + window + ")", s && s.count ? ms(s.p50_ms) + " / " + ms(s.p99_ms) : "no store calls"));
    const head = ["domain", ...COLUMNS.map((c) => ({ text: LABELS[c], num: true })), "allowed", "denied + would deny"];
    const domains = [...new Set(rules.map((r) => r.domain))];
    table("domains", head, domains.map((domain) => {
      const of = rules.filter((r) => r.domain === domain);
      const tr = el("tr", { "data-domain": domain }, el("td", {}, domain));
      const now = {};
      for (const c of COLUMNS) now[c] = sum(of, c, "now");
      rateCells(tr, now, (c) => sumSeries(of, c));
      return tr;
    }));
    table("rules", ["domain", "rule", "mode", ...COLUMNS.map((c) => ({ text: LABELS[c], num: true })), "allowed", "denied + would deny"],
      rules.map((r) => {
        const tr = el("tr", { "data-rule": r.domain + "/" + r.rule },
          el("td", {}, r.domain), el("td", {}, r.rule), el("td", {}, r.unlimited ? "unlimited" : r.mode));
        rateCells(tr, r.now, (c) => r.rates[c]);
        return tr;
      }));
  }

  function hitsName(mode) {
    return { enforce: "denied", shadow: "would deny", soft: "soft exceeded" }[mode] || "denied";
  }

  function drawTop(snap) {
    const box = $("top");
    box.replaceChildren();
    const withKeys = snap.rules.filter((r) => r.top_keys.length);
    if (!withKeys.length) box.append(el("p", { class: "muted" }, "No rule has denied anything yet."));
    for (const r of withKeys) {
      const t = el("table");
      t.append(el("thead", {}, el("tr", {}, el("th", {}, "key"), el("th", { class: "num" }, hitsName(r.mode)),
        el("th", { class: "num" }, "± error"), el("th", { class: "num" }, "share of its own traffic"))));
      const body = el("tbody");
      for (const k of r.top_keys) {
        const own = k.own_traffic;
        body.append(el("tr", { "data-key": k.key }, el("td", { class: "key" }, k.key), el("td", { class: "num" }, k.count),
          el("td", { class: "num" }, k.error),
          el("td", { class: "num" }, own ? pct(own.share) + " of " + own.total : "— (needs detailed_metric)")));
      }
      t.append(body);
      box.append(el("div", { class: "rule-block", "data-rule": r.domain + "/" + r.rule },
        el("h4", {}, r.domain + " / " + r.rule + " (" + r.mode + ")"), el("div", { class: "scroll" }, t)));
    }
  }

  function shareTable(list, what, attr) {
    const t = el("table");
    t.append(el("thead", {}, el("tr", {}, el("th", {}, what), el("th", { class: "num" }, "requests"),
      el("th", { class: "num" }, "would deny"), el("th", {}, "share"))));
    const body = el("tbody");
    for (const v of list) {
      body.append(el("tr", { [attr]: v.value, "data-share": v.share.toFixed(4) },
        el("td", { class: "key" }, v.value), el("td", { class: "num" }, v.total), el("td", { class: "num" }, v.hits),
        el("td", {}, el("span", { class: "bar", style: "width:" + Math.round(v.share * 80) + "px" }),
          "would have denied " + pct(v.share) + " of " + v.value + "'s requests")));
    }
    if (!list.length) body.append(el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no requests yet")));
    t.append(body);
    return el("div", { class: "scroll" }, t);
  }

  function action(path, body, label) {
    $("action-result").textContent = label + "…";
    return fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(body || {}) })
      .then((r) => r.json().then((j) => ({ ok: r.ok, j })))
      .then(({ ok, j }) => {
        $("action-result").textContent = ok
          ? label + ": " + (j.result || "done") + (j.version ? " — running " + j.version.version : "")
          : label + " refused: " + (j.error || "error");
        $("action-result").className = ok ? "good" : "bad";
        versionsShown = "";
        return poll();
      })
      .catch((e) => { $("action-result").textContent = label + " failed: " + e; });
  }

  function sketchBlock(sketch, attr) {
    return el("div", { class: "sketch" },
      el("p", { class: "muted" }, "Per value, counted since tracking began: a bounded sketch of the " + sketch.capacity +
        " busiest values, " + sketch.total + " decisions seen; a value's decisions before it was tracked are not in its share (each may miss at most " +
        sketch.max_error + ", its own error shown by the API)."),
      el("h5", {}, "By first entry (sketch)"), shareTable(sketch.rollup, "value", attr + "-rollup"),
      el("h5", {}, "By full descriptor (sketch)"), shareTable(sketch.values, "descriptor", attr + "-value"));
  }

  function drawChanges(snap) {
    const cand = $("candidate");
    cand.replaceChildren(el("h3", {}, "Shadow candidate"));
    const c = snap.candidate;
    if (!c) {
      cand.append(el("p", { class: "muted" }, "No candidate is shadowing (POST /v1/admin/policy/candidate sets one)."));
    } else {
      const buttons = snap.can_write
        ? el("p", {}, el("button", { id: "promote", type: "button", on: { click: () => action("/v1/admin/dashboard/promote", {}, "Promote") } }, "Promote to running policy"), " ",
          el("button", { id: "drop", class: "danger", type: "button", on: { click: () => action("/v1/admin/dashboard/drop", {}, "Drop") } }, "Drop candidate"))
        : el("p", { class: "muted" }, "The full admin token is needed to promote or drop.");
      cand.append(el("p", {}, "Candidate " + c.hash + " (" + c.files.join(", ") + "), shadowing for " + ago(c.shadowing_for_ms) + "."), buttons);
      const t = el("table");
      t.append(el("thead", {}, el("tr", {}, el("th", {}, "rule"), el("th", { class: "num" }, "allowed"),
        el("th", { class: "num" }, "would deny"), el("th", {}, "share"), el("th", {}, "top affected keys"))));
      const body = el("tbody");
      for (const r of c.rules) {
        body.append(el("tr", { "data-candidate-rule": r.domain + "/" + r.rule, "data-share": r.share.toFixed(4) },
          el("td", {}, r.domain + " / " + r.rule), el("td", { class: "num" }, r.allowed), el("td", { class: "num" }, r.would_deny),
          el("td", {}, "would have denied " + pct(r.share) + " of its requests"),
          el("td", { class: "key" }, r.top_keys.map((k) => k.key + " (" + k.count + (k.error ? " ±" + k.error : "") + ")").join("; "))));
      }
      t.append(body);
      cand.append(el("div", { class: "scroll" }, t));
      for (const r of c.rules.filter((r) => r.sketch && r.sketch.total)) {
        cand.append(el("div", { class: "rule-block", "data-candidate-sketch": r.domain + "/" + r.rule },
          el("h4", {}, "Candidate " + r.domain + " / " + r.rule), sketchBlock(r.sketch, "data-candidate")));
      }
    }
    const shadow = $("shadow");
    shadow.replaceChildren(el("h3", {}, "Rules in shadow mode"));
    const rules = snap.rules.filter((r) => r.mode === "shadow");
    if (!rules.length) shadow.append(el("p", { class: "muted" }, "No rule of the running policy is in shadow mode."));
    for (const r of rules) {
      const total = r.totals.allowed + r.totals.shadow_would_deny;
      const share = total ? r.totals.shadow_would_deny / total : 0;
      const block = el("div", { class: "rule-block", "data-shadow-rule": r.domain + "/" + r.rule },
        el("h4", {}, r.domain + " / " + r.rule),
        el("p", { "data-overall-share": share.toFixed(4) }, "Would have denied " + pct(share) + " of its " + total + " requests so far (" + rate(r.now.shadow_would_deny) + "/s now)."));
      if (r.sketch) block.append(sketchBlock(r.sketch, "data-sketch"));
      if (r.detailed_metric) {
        block.append(el("p", { class: "muted" }, "Per value (detailed_metric counters): counted since the process started (or the rule was added), exactly, for up to 1000 values of this rule (later ones together as _other); " + r.values_tracked + " tracked."));
        block.append(el("h5", {}, "By first entry"), shareTable(r.rollup, "value", "data-rollup"));
        block.append(el("h5", {}, "By full descriptor"), shareTable(r.values, "descriptor", "data-value"));
      } else {
        block.append(el("p", { class: "muted" }, "Exact per-value counts need detailed_metric: true on this rule; the top keys it would deny:"),
          el("p", { class: "key" }, r.top_keys.map((k) => k.key + " (" + k.count + ")").join("; ") || "none yet"));
      }
      shadow.append(block);
    }
  }

  function drawHealth(snap) {
    const h = snap.health;
    const store = $("store");
    store.textContent = "store " + h.store + (h.reachable ? " reachable" : " failing");
    store.className = "pill " + (h.reachable ? "" : "bad");
    const cards = $("health-cards");
    const last = (xs) => xs.length ? xs[xs.length - 1] : 0;
    cards.replaceChildren(
      card("store", h.store + (h.reachable ? " · reachable" : " · failing"), { id: "health-store" }),
      card("store errors/s (total)", rate(last(h.store_errors)) + " (" + h.store_errors_total + ")"),
      card("fail-open/s (total)", rate(last(h.fail_open)) + " (" + h.fail_open_total + ")"),
      ...Object.entries(h.degraded_by_posture).map(([p, n]) => card("degraded, posture " + p, n)));
    table("breakers", ["node", "state"], h.breakers.map((b) =>
      el("tr", {}, el("td", { class: "key" }, b.node), el("td", { class: b.state === "closed" ? "good" : "bad" }, b.state))));
    const p = snap.policy;
    const current = p.versions.find((v) => v.current);
    $("version").textContent = "policy " + (current ? current.version : "?");
    $("version").setAttribute("data-seq", p.current);
    const signature = JSON.stringify([p.current, p.versions.map((v) => v.seq), snap.can_write]);
    if (signature !== versionsShown) {
      versionsShown = signature;
      table("versions", ["seq", "version", "origin", "accepted", "rules", ""], p.versions.slice().reverse().map((v) => {
        const cell = el("td");
        if (v.current) cell.append(el("strong", { id: "policy-current", "data-seq": v.seq }, "running"));
        else if (snap.can_write) {
          const button = el("button", { type: "button", "data-rollback": v.seq }, "Roll back to " + v.seq);
          button.addEventListener("click", () => {
            const sure = el("button", { type: "button", class: "danger", "data-confirm-rollback": v.seq }, "Confirm roll back to " + v.seq);
            sure.addEventListener("click", () => action("/v1/admin/dashboard/rollback", { to: v.seq }, "Roll back to " + v.seq));
            cell.replaceChildren(sure);
          });
          cell.append(button);
        }
        return el("tr", { "data-version": v.seq }, el("td", {}, v.seq), el("td", {}, v.version), el("td", {}, v.origin),
          el("td", {}, new Date(v.accepted_at_us / 1000).toLocaleString()), el("td", { class: "num" }, v.rules), cell);
      }));
      for (const id of ["diff-from", "diff-to"]) {
        const sel = $(id);
        const keep = sel.value;
        sel.replaceChildren(...p.versions.map((v) => el("option", { value: v.seq }, v.seq + " " + v.version)));
        if (keep && p.versions.some((v) => String(v.seq) === keep)) sel.value = keep;
        else if (id === "diff-to") sel.value = String(p.current);
        else if (p.versions.length > 1) sel.value = String(p.versions[p.versions.length - 2].seq);
      }
    }
    table("overrides", ["domain", "rule", "entries", "limit", "expires in", "reason", "applies"], snap.overrides.map((o) =>
      el("tr", {}, el("td", {}, o.domain), el("td", {}, o.rule),
        el("td", { class: "key" }, o.entries.map((e) => e.key + "=" + e.value).join(",")),
        el("td", { class: "num" }, o.requests_per_unit + (o.period_ms ? " / " + o.period_ms / 1000 + " s" : "")),
        el("td", {}, o.expires_in_ms === null ? "never" : ago(o.expires_in_ms)), el("td", {}, o.reason), el("td", {}, o.applies ? "yes" : "no"))));
  }

  function draw(snap) {
    last = snap;
    drawNow(snap);
    drawTop(snap);
    drawChanges(snap);
    drawHealth(snap);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString() + (snap.can_write ? "" : " · read-only");
  }

  function askToken(message) {
    $("token-form").hidden = false;
    $("token-error").textContent = message || "";
    $("token-input").focus();
  }

  function poll() {
    clearTimeout(timer);
    return fetch("/v1/admin/dashboard/snapshot", { headers: headers(false), cache: "no-store" })
      .then((r) => {
        if (r.status === 401) {
          askToken(token() ? "That token was refused." : "This admin API needs a token.");
          return null;
        }
        return r.json().then((j) => {
          if (!r.ok) throw new Error(j.error || r.status);
          return j;
        });
      })
      .then((snap) => {
        if (!snap) return;
        $("error").hidden = true;
        draw(snap);
        timer = setTimeout(poll, POLL_MS);
      })
      .catch((e) => {
        $("error").textContent = "Cannot read the snapshot: " + e.message + " (retrying)";
        $("error").hidden = false;
        timer = setTimeout(poll, POLL_MS * 2);
      });
  }

  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
    $("token-input").value = "";
    $("token-form").hidden = true;
    versionsShown = "";
    poll();
  });
  $("token-button").addEventListener("click", () => askToken(""));
  $("diff-button").addEventListener("click", () => {
    const q = "from=" + encodeURIComponent($("diff-from").value) + "&to=" + encodeURIComponent($("diff-to").value);
    fetch("/v1/admin/dashboard/diff?" + q, { headers: headers(false) })
      .then((r) => r.text())
      .then((t) => { $("diff").textContent = t || "(no difference)"; $("diff").hidden = false; });
  });
  poll();
  window.tollgateDashboard = { last: () => last };
})();
