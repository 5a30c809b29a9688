/// <reference lib="dom" />
/**
 * dashboard/web/app — the page's entry point: asks for the token when the API wants one,
 * loads the fleet (in pages of rows), then polls every second for what changed since the
 * revision it holds, and the latency history of the rows shown every step. Each update is
 * timed with `performance.measure` (`dashboard:update`, `dashboard:load`), visible in the
 * browser's performance tools.
 */
import { fetchHistory, fetchState, storedToken, storeToken, Unauthorized } from './api.ts';
import { byId } from './dom.ts';
import { FleetTable } from './fleet-table.ts';
import { clockTime } from './format.ts';
import {
  mergeEvents,
  prependEvents,
  renderEvents,
  renderLeases,
  renderPools,
  renderProviders,
  renderTotals,
} from './panels.ts';
import type { DashboardState, FleetEvent } from './types.ts';

const STATE_EVERY_MS = 1000;
const HISTORY_EVERY_MS = 10_000;
const RETRY_MAX_MS = 5000;

/** Rows per request while loading the fleet: keeps each answer a few hundred KB. */
const LOAD_ROWS = 2000;

const table = new FleetTable({
  table: byId<HTMLTableElement>('fleet'),
  filter: byId<HTMLInputElement>('filter'),
  shown: byId('shown'),
  prev: byId<HTMLButtonElement>('page-prev'),
  next: byId<HTMLButtonElement>('page-next'),
  pageInfo: byId('page-info'),
});
const live = byId('live');
const tokenForm = byId<HTMLFormElement>('token-form');
const tokenInput = byId<HTMLInputElement>('token');
const forget = byId<HTMLButtonElement>('forget-token');

let events: FleetEvent[] = [];
let lastEvent = 0;
/** The revision of the rows the page holds; null before the first load (or after a refusal). */
let revision: number | null = null;
let failures = 0;
let running = false;
let stateTimer: number | undefined;
let historyTimer: number | undefined;

/** Events to draw: all of them after a reset, else the new ones (on top of those shown). */
let eventsReset = true;
let freshEvents: FleetEvent[] = [];

/** Keeps the events of an answer. */
function takeEvents(state: DashboardState): void {
  // Every event after a reset (another process answers now) replaces what the page held.
  if (state.lastEvent < lastEvent) {
    events = state.events;
    eventsReset = true;
  } else {
    events = mergeEvents(events, state.events);
    freshEvents = mergeEvents(freshEvents, state.events);
  }
  lastEvent = state.lastEvent;
}

/** The JSON each panel was last drawn from: a panel whose data did not change is left alone. */
const drawnFrom = new Map<string, string>();

function changed(panel: string, data: unknown): boolean {
  const json = JSON.stringify(data);
  if (drawnFrom.get(panel) === json) return false;
  drawnFrom.set(panel, json);
  return true;
}

/** Everything beside the proxies table (all of it small), from the newest answer. */
function drawPanels(state: DashboardState): void {
  const serverNow = Date.parse(state.now);
  if (changed('totals', state.totals)) renderTotals(byId('totals'), state.totals);
  if (changed('pools', state.pools)) renderPools(byId<HTMLTableElement>('pools'), state.pools);
  // Ages and time left move every second while there are leases.
  if (changed('leases', state.leases) || state.leases.newest.length > 0)
    renderLeases(byId<HTMLTableElement>('leases'), byId('lease-summary'), state.leases, serverNow);
  if (changed('providers', state.providers)) renderProviders(byId('providers'), state.providers);
  const list = byId<HTMLOListElement>('events');
  if (eventsReset) renderEvents(list, events);
  else prependEvents(list, freshEvents);
  eventsReset = false;
  freshEvents = [];
  live.textContent = `live · ${clockTime(state.now)}`;
  live.className = 'live ok';
}

function askForToken(message: string): void {
  running = false;
  window.clearTimeout(stateTimer);
  window.clearTimeout(historyTimer);
  tokenForm.hidden = false;
  byId('token-error').textContent = message;
  live.textContent = 'token needed';
  live.className = 'live bad';
  tokenInput.focus();
}

/**
 * A full answer is the first page of the fleet: the rest follows page by page, then the page
 * asks for changes since the first page's revision (which covers whatever changed meanwhile).
 */
async function load(first: DashboardState, started: number): Promise<void> {
  const rows = [...first.proxies];
  takeEvents(first);
  let last = first;
  while (last.next !== null) {
    last = (await fetchState({ after: lastEvent, from: last.next, limit: LOAD_ROWS })).body;
    rows.push(...last.proxies);
    takeEvents(last);
  }
  table.replace(rows, Date.parse(last.now));
  drawPanels(last);
  revision = first.revision;
  performance.measure('dashboard:load', {
    start: started,
    end: performance.now(),
    detail: { rows: rows.length },
  });
  if (running) void pollHistory();
}

/** One poll: the rows changed since the revision held, or the fleet anew. */
async function update(): Promise<void> {
  const started = performance.now();
  const answer = await fetchState({ after: lastEvent, since: revision ?? undefined, limit: LOAD_ROWS });
  const state = answer.body;
  if (state.full) return load(state, started);
  takeEvents(state);
  table.apply(state.proxies, state.removed, Date.parse(state.now));
  drawPanels(state);
  revision = state.revision;
  performance.measure('dashboard:update', {
    start: answer.received,
    end: performance.now(),
    detail: { rows: state.proxies.length, removed: state.removed.length },
  });
}

async function pollState(): Promise<void> {
  try {
    await update();
    failures = 0;
  } catch (err) {
    if (err instanceof Unauthorized) {
      askForToken(storedToken() ? 'That token was refused.' : '');
      return;
    }
    failures++;
    live.textContent = `disconnected: ${err instanceof Error ? err.message : String(err)}`;
    live.className = 'live bad';
  }
  if (running)
    stateTimer = window.setTimeout(pollState, Math.min(STATE_EVERY_MS * 2 ** failures, RETRY_MAX_MS));
}

let historyBusy = false;
let historyAgain = false;

/** The charts of the rows shown; asked again at once if the rows changed while it was under way. */
async function pollHistory(): Promise<void> {
  if (historyBusy) {
    historyAgain = true;
    return;
  }
  historyBusy = true;
  window.clearTimeout(historyTimer);
  try {
    table.setHistory(await fetchHistory(table.shownKeys()));
  } catch {
    // The state poll reports trouble; the charts just keep their last picture.
  }
  historyBusy = false;
  if (historyAgain) {
    historyAgain = false;
    return pollHistory();
  }
  if (running) historyTimer = window.setTimeout(pollHistory, HISTORY_EVERY_MS);
}

// Another page, filter or order: its rows' charts now rather than at the next step.
let shownTimer: number | undefined;
table.onShownChange = () => {
  window.clearTimeout(shownTimer);
  shownTimer = window.setTimeout(() => {
    if (running) void pollHistory();
  }, 300);
};

function start(): void {
  running = true;
  tokenForm.hidden = true;
  forget.hidden = storedToken() === null;
  void pollState();
  void pollHistory();
}

tokenForm.addEventListener('submit', (e) => {
  e.preventDefault();
  const token = tokenInput.value.trim();
  // The token goes to sessionStorage only; the field is emptied so it never lingers in the page.
  tokenInput.value = '';
  if (!token) return;
  storeToken(token);
  start();
});

forget.addEventListener('click', () => {
  storeToken(null);
  askForToken('');
  forget.hidden = true;
});

start();
