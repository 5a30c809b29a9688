/// <reference lib="dom" />
/**
 * dashboard/web/app — the page's entry point: asks for the token when the API wants one,
 * polls the fleet every second and the latency history every step, and redraws.
 */
import { fetchHistory, fetchState, storedToken, storeToken, Unauthorized } from './api.ts';
import { byId } from './dom.ts';
import { FleetTable } from './fleet-table.ts';
import { clockTime } from './format.ts';
import {
  mergeEvents,
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

const table = new FleetTable(
  byId<HTMLTableElement>('fleet'),
  byId<HTMLInputElement>('filter'),
  byId('shown'),
);
const live = byId('live');
const tokenForm = byId<HTMLFormElement>('token-form');
const tokenInput = byId<HTMLInputElement>('token');
const forget = byId<HTMLButtonElement>('forget-token');

let events: FleetEvent[] = [];
let lastEvent = 0;
let failures = 0;
let running = false;
let stateTimer: number | undefined;
let historyTimer: number | undefined;

function draw(state: DashboardState): void {
  const serverNow = Date.parse(state.now);
  // Every event after a reset (another process answers now) replaces what the page held.
  events = state.lastEvent < lastEvent ? state.events : mergeEvents(events, state.events);
  lastEvent = state.lastEvent;
  table.update(state.proxies, serverNow);
  renderTotals(byId('totals'), state.totals);
  renderPools(byId<HTMLTableElement>('pools'), state.pools);
  renderLeases(byId<HTMLTableElement>('leases'), byId('lease-summary'), state.leases, serverNow);
  renderProviders(byId('providers'), state.providers);
  renderEvents(byId<HTMLOListElement>('events'), events);
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

async function pollState(): Promise<void> {
  try {
    draw(await fetchState(lastEvent));
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

async function pollHistory(): Promise<void> {
  try {
    table.setHistory(await fetchHistory());
  } catch {
    // The state poll reports trouble; the charts just keep their last picture.
  }
  if (running) historyTimer = window.setTimeout(pollHistory, HISTORY_EVERY_MS);
}

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
