/**
 * dashboard/page — the page's HTML and CSS. They live in code rather than beside it so the
 * compiled package (dist/) carries them without a copy step; the data comes only from the
 * token-protected routes, never from here.
 */

/** The page, loading the entry module `entry` (app.ts from source, app.js when compiled). */
export function pageHtml(entry: string): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Egress proxies</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/dashboard/app.css">
<script type="module" src="/dashboard/${entry}"></script>
</head>
<body>
<header>
  <h1>Egress proxies</h1>
  <div id="totals" class="totals"></div>
  <span id="live" class="live" role="status">connecting…</span>
  <button id="forget-token" type="button" hidden>Forget token</button>
</header>
<form id="token-form" class="token" hidden>
  <label>Discovery API token <input id="token" type="password" autocomplete="off" spellcheck="false"></label>
  <button type="submit">Open</button>
  <span id="token-error" class="error"></span>
</form>
<main>
  <section class="fleet">
    <div class="toolbar">
      <h2>Proxies</h2>
      <input id="filter" type="search" placeholder="Filter: name, pool, provider, phase, target, IP…" aria-label="Filter proxies">
      <span id="shown" class="muted"></span>
      <span class="pager">
        <button id="page-prev" type="button" aria-label="Previous page">‹</button>
        <span id="page-info" class="muted"></span>
        <button id="page-next" type="button" aria-label="Next page">›</button>
      </span>
    </div>
    <table id="fleet">
      <colgroup><col class="c-proxy"><col class="c-pool"><col class="c-provider"><col class="c-phase"><col class="c-health"><col class="c-leases"><col class="c-cooldowns"><col class="c-egress"><col class="c-address"></colgroup>
      <thead><tr>
        <th data-sort="key"><button type="button">Proxy</button></th>
        <th data-sort="pool"><button type="button">Pool</button></th>
        <th data-sort="provider"><button type="button">Provider</button></th>
        <th data-sort="phase"><button type="button">Phase</button></th>
        <th data-sort="latency"><button type="button">Health · latency, 15 min</button></th>
        <th data-sort="leases" class="num"><button type="button">Leases</button></th>
        <th data-sort="cooldowns"><button type="button">Cooldowns (time left)</button></th>
        <th data-sort="egressIP"><button type="button">Egress IP</button></th>
        <th data-sort="address"><button type="button">Address</button></th>
      </tr></thead>
      <tbody></tbody>
    </table>
  </section>
  <div class="panels">
    <section class="pools">
      <h2>Pools</h2>
      <table id="pools">
        <thead><tr><th>Pool</th><th class="num" title="spec.replicas">Desired</th><th class="num" title="status.replicas: not draining">Proxies</th><th class="num">Ready</th><th class="num">Healthy</th><th class="num">Leasable</th><th class="num">Leases</th><th>Conditions</th></tr></thead>
        <tbody></tbody>
      </table>
    </section>
    <section class="leases">
      <div class="toolbar">
        <h2>Leases</h2>
        <span id="lease-summary" class="muted"></span>
      </div>
      <table id="leases">
        <thead><tr><th>Lease</th><th>Proxy</th><th>Target</th><th>Via</th><th class="num">Age</th><th class="num">Expires in</th></tr></thead>
        <tbody></tbody>
      </table>
    </section>
    <section>
      <h2>Providers</h2>
      <div id="providers"></div>
    </section>
    <section class="events">
      <h2>Events</h2>
      <ol id="events"></ol>
    </section>
  </div>
</main>
</body>
</html>
`;
}

export const PAGE_CSS = `:root {
  color-scheme: light dark;
  --bg: #f7f7f5; --fg: #1d1d1b; --muted: #6b6b66; --line: #deded8; --panel: #fff;
  --ok: #1f8a3b; --bad: #c62828; --warn: #b26a00; --accent: #2456a6;
  font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
}
@media (prefers-color-scheme: dark) {
  :root { --bg: #16171a; --fg: #e6e6e3; --muted: #9a9a94; --line: #32343a; --panel: #1e2024; --accent: #7aa7ff; }
}
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin: 0; background: var(--bg); color: var(--fg); }
header { display: flex; align-items: center; gap: 1rem; padding: .6rem 1rem; border-bottom: 1px solid var(--line); background: var(--panel); position: sticky; top: 0; z-index: 1; }
h1 { font-size: 1.1rem; margin: 0; }
h2 { font-size: .95rem; margin: 0 0 .4rem; }
.totals { display: flex; gap: .9rem; flex-wrap: wrap; flex: 1; }
.total strong { font-variant-numeric: tabular-nums; }
.total.warn strong { color: var(--warn); }
.live { font-size: .85rem; color: var(--muted); }
.live.ok::before { content: "●"; color: var(--ok); margin-right: .3rem; }
.live.bad { color: var(--bad); }
.token { display: flex; gap: .6rem; align-items: center; padding: .8rem 1rem; background: var(--panel); border-bottom: 1px solid var(--line); }
.error { color: var(--bad); }
main { padding: .8rem 1rem; display: grid; gap: 1rem; }
section { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: .6rem .8rem; min-width: 0; }
.toolbar { display: flex; align-items: baseline; gap: .8rem; }
.toolbar input { flex: 0 1 28rem; padding: .3rem .5rem; font: inherit; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
.fleet { overflow-x: auto; }
.pager { margin-left: auto; display: flex; align-items: baseline; gap: .4rem; white-space: nowrap; }
.pager button { font: inherit; padding: 0 .5rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); cursor: pointer; }
.pager button:disabled { opacity: .4; cursor: default; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; white-space: nowrap; }
th button { all: unset; cursor: pointer; }
th button:focus-visible { outline: 2px solid var(--accent); }
th[aria-sort="ascending"] button::after { content: " ▲"; font-size: .7em; }
th[aria-sort="descending"] button::after { content: " ▼"; font-size: .7em; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
.mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: .85rem; }
.ns, .muted { color: var(--muted); }
tr.down td { background: color-mix(in srgb, var(--bad) 6%, transparent); }
.phase { padding: 0 .35rem; border-radius: 3px; background: var(--line); font-size: .85rem; }
.phase-ready { background: color-mix(in srgb, var(--ok) 20%, transparent); }
.phase-failed { background: color-mix(in srgb, var(--bad) 25%, transparent); }
.phase-replacing, .phase-provisioning { background: color-mix(in srgb, var(--warn) 20%, transparent); }
.dot { display: inline-block; width: .6rem; height: .6rem; border-radius: 50%; margin-right: .35rem; background: var(--muted); }
.dot.healthy { background: var(--ok); }
.dot.unhealthy { background: var(--bad); }
.health { white-space: nowrap; }
.latency { display: inline-block; min-width: 4.2rem; font-variant-numeric: tabular-nums; }
.spark { vertical-align: middle; }
.spark polyline { fill: none; stroke: var(--accent); stroke-width: 1.5; }
.spark circle { fill: var(--accent); }
.why { color: var(--muted); font-size: .8rem; white-space: normal; }
.cooldowns ul, .provider ul { list-style: none; margin: 0; padding: 0; }
.cooldowns .left { color: var(--warn); font-variant-numeric: tabular-nums; }
.cooldowns .shared { color: var(--muted); font-size: .8rem; }
/* Below the fold at any size of fleet: not laid out or painted until scrolled to. */
.panels > section { content-visibility: auto; contain-intrinsic-size: auto 16rem; }
#fleet { table-layout: fixed; min-width: 72rem; }
#fleet col.c-proxy { width: 16%; } #fleet col.c-pool { width: 7%; } #fleet col.c-provider { width: 7%; }
#fleet col.c-phase { width: 8%; } #fleet col.c-health { width: 17%; } #fleet col.c-leases { width: 6%; }
#fleet col.c-cooldowns { width: 18%; } #fleet col.c-egress { width: 10%; } #fleet col.c-address { width: 11%; }
#fleet td { overflow-wrap: break-word; }
.panels { display: grid; gap: 1rem; grid-template-columns: repeat(auto-fit, minmax(20rem, 1fr)); align-items: start; }
.pools, .leases { grid-column: 1 / -1; overflow-x: auto; }
.provider { margin-bottom: .5rem; }
.events ol { list-style: none; margin: 0; padding: 0; max-height: 24rem; overflow-y: auto; }
.event { display: grid; grid-template-columns: 4.5rem 6.5rem minmax(0, 1fr); column-gap: .5rem; padding: .15rem 0; border-bottom: 1px solid var(--line); font-size: .85rem; }
.event time { color: var(--muted); font-variant-numeric: tabular-nums; }
.event .kind { font-weight: 600; }
.event .proxy { grid-column: 3; }
.event .message { grid-column: 3; color: var(--muted); }
.event-shared-block .kind { color: var(--warn); }
.event-blocked .kind, .event-failed .kind, .event-unhealthy .kind, .event-deleted .kind { color: var(--bad); }
.event-healthy .kind, .event-added .kind { color: var(--ok); }
.event-pool .kind { color: var(--accent); }
td.warn { color: var(--warn); font-weight: 600; }
.pool-status { font-size: .85rem; }
.cond { display: inline-block; padding: 0 .3rem; margin: 0 .25rem .15rem 0; border-radius: 3px; background: var(--line); }
.cond-true { background: color-mix(in srgb, var(--ok) 20%, transparent); }
.cond-false { background: color-mix(in srgb, var(--bad) 25%, transparent); }
.cond-busy { background: color-mix(in srgb, var(--warn) 20%, transparent); }
.empty { color: var(--muted); }
`;
