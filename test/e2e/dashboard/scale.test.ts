/**
 * The dashboard with a large fleet in headless Chromium: 2,000 proxies behind the real
 * Dashboard and discovery server (test/support/dashboard-fleet), the real page. The table holds
 * one page of rows whatever the fleet's size; a change to a proxy redraws that row in its own
 * element and leaves the others' elements alone; pages, sorting and the filter work over the
 * whole fleet; proxies that come and go are followed; the polls after the first load carry
 * only what changed, and the charts are asked for the rows shown only. The speed of an update
 * at 10,000 proxies is bench/dashboard.ts's.
 */
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { PAGE_ROWS } from '../../../src/dashboard/web/fleet-table.ts';
import { type Browser, launchChromium } from '../../support/browser.ts';
import {
  type DashboardFleet,
  FLEET_POOLS,
  FLEET_TOKEN,
  fleetKey,
  startDashboardFleet,
} from '../../support/dashboard-fleet.ts';

vi.setConfig({ testTimeout: 60_000, hookTimeout: 90_000 });

const PROXIES = 2000;

let fleet: DashboardFleet;
let browser: Browser;
let page: Page;
const stateAnswers: { url: string; bytes: number }[] = [];
const historyAsked: string[] = [];

const rows = () => page.locator('#fleet tbody tr');
const firstKey = () => rows().first().getAttribute('data-proxy');
const row = (i: number) => page.locator(`#fleet tr[data-proxy="${fleetKey(i)}"]`);

beforeAll(async () => {
  fleet = await startDashboardFleet(PROXIES);
  browser = await launchChromium();
  page = await browser.context.newPage();
  page.on('request', (req) => {
    if (req.url().includes('/v1/dashboard/history')) historyAsked.push(req.url());
  });
  page.on('response', (res) => {
    if (!res.url().includes('/v1/dashboard/state')) return;
    void res.body().then(
      (b) => stateAnswers.push({ url: res.url(), bytes: b.length }),
      () => undefined,
    );
  });
  await page.goto(`${fleet.url}/`);
  await page.fill('#token', FLEET_TOKEN);
  await page.click('#token-form button[type=submit]');
  await row(0).waitFor({ timeout: 30_000 });
});

afterAll(async () => {
  await browser?.close();
  await fleet?.close();
});

describe('dashboard with 2,000 proxies in Chromium', () => {
  it('holds one page of rows in the DOM and says where in the fleet it is', async () => {
    expect(await rows().count()).toBe(PAGE_ROWS);
    expect(await page.textContent('#shown')).toBe(`${PROXIES} proxies`);
    expect(await page.textContent('#page-info')).toBe(`1–${PAGE_ROWS} of ${PROXIES}`);
    expect(await page.isDisabled('#page-prev')).toBe(true);
    expect(await page.isDisabled('#page-next')).toBe(false);
  });

  it("redraws a changed proxy in its own row element and leaves the other rows' elements alone", async () => {
    // Mark the elements as they are now: a row to change, and a cell of a row that stays.
    await page.evaluate(
      ([changing, staying]) => {
        const tr = document.querySelector<HTMLElement>(`#fleet tr[data-proxy="${changing}"]`);
        const td = document.querySelector<HTMLElement>(`#fleet tr[data-proxy="${staying}"] td`);
        if (!tr || !td) throw new Error('rows missing');
        tr.dataset.marked = 'changing';
        td.dataset.marked = 'staying';
      },
      [fleetKey(3), fleetKey(4)],
    );
    fleet.setHealthy(3, false);
    await expect.poll(() => row(3).getAttribute('class'), { timeout: 10_000 }).toBe('down');
    expect(await row(3).locator('.dot.unhealthy').count()).toBe(1);
    // The same <tr>, updated in place; the untouched row's cell is the very same element.
    expect(await row(3).getAttribute('data-marked')).toBe('changing');
    expect(await row(4).locator('td').first().getAttribute('data-marked')).toBe('staying');
    expect(await rows().count()).toBe(PAGE_ROWS);
    fleet.setHealthy(3, true);
    await expect.poll(() => row(3).getAttribute('class'), { timeout: 10_000 }).toBe('');
  });

  it('turns pages over the whole fleet, in the order chosen', async () => {
    await page.click('#page-next');
    expect(await firstKey()).toBe(fleetKey(PAGE_ROWS));
    expect(await page.textContent('#page-info')).toBe(`${PAGE_ROWS + 1}–${2 * PAGE_ROWS} of ${PROXIES}`);
    expect(await rows().count()).toBe(PAGE_ROWS);
    await page.click('#page-prev');
    expect(await firstKey()).toBe(fleetKey(0));
    // Sorting starts again at the first page, over every proxy, not only the page shown.
    await page.click('#page-next');
    await page.click('#fleet th[data-sort="key"] button');
    expect(await firstKey()).toBe(fleetKey(PROXIES - 1));
    expect(await page.textContent('#page-info')).toBe(`1–${PAGE_ROWS} of ${PROXIES}`);
    await page.click('#fleet th[data-sort="key"] button');
    expect(await firstKey()).toBe(fleetKey(0));
  });

  it('filters over the whole fleet and pages what it keeps', async () => {
    fleet.setHealthy(7, false);
    await expect.poll(() => row(7).getAttribute('class'), { timeout: 10_000 }).toBe('down');
    await page.fill('#filter', 'pool-7 unhealthy');
    await expect.poll(() => rows().count()).toBe(1);
    expect(await firstKey()).toBe(fleetKey(7));
    const inPool = PROXIES / FLEET_POOLS;
    await page.fill('#filter', 'pool-7');
    await expect.poll(() => page.textContent('#shown')).toBe(`${inPool} of ${PROXIES}`);
    expect(await page.textContent('#page-info')).toBe(`1–${PAGE_ROWS} of ${inPool}`);
    await page.click('#page-next');
    expect(await page.textContent('#page-info')).toBe(`${PAGE_ROWS + 1}–${inPool} of ${inPool}`);
    expect(await page.isDisabled('#page-next')).toBe(true);
    await page.fill('#filter', '');
    await expect.poll(() => page.textContent('#page-info')).toBe(`1–${PAGE_ROWS} of ${PROXIES}`);
    fleet.setHealthy(7, true);
  });

  it('follows proxies that go and come', async () => {
    fleet.remove(1);
    await expect.poll(() => row(1).count(), { timeout: 10_000 }).toBe(0);
    expect(await page.textContent('#shown')).toBe(`${PROXIES - 1} proxies`);
    expect(await rows().count()).toBe(PAGE_ROWS);
    fleet.add(1);
    await expect.poll(() => row(1).count(), { timeout: 10_000 }).toBe(1);
    expect(await page.textContent('#shown')).toBe(`${PROXIES} proxies`);
  });

  it('polls for what changed only, and asks for the charts of the rows shown only', async () => {
    const polls = stateAnswers.filter((a) => a.url.includes('since='));
    expect(polls.length).toBeGreaterThan(3);
    const load = stateAnswers.filter((a) => !a.url.includes('since='));
    const loadedBytes = load.reduce((n, a) => n + a.bytes, 0);
    // The first load carried the fleet (well over 100 bytes a row); a poll carries a few rows.
    expect(loadedBytes).toBeGreaterThan(PROXIES * 100);
    const smallest = Math.min(...polls.map((a) => a.bytes));
    expect(smallest).toBeLessThan(loadedBytes / 50);
    // The charts follow the page: the newest history request names the rows shown, no others.
    const shownAndAsked = async () => {
      const shown = await rows().evaluateAll((trs) => trs.map((t) => t.getAttribute('data-proxy')));
      const asked = new URL(historyAsked.at(-1) ?? 'http://x/').searchParams.get('proxies')?.split(',') ?? [];
      return { shown: [...shown].sort(), asked: [...asked].sort() };
    };
    await expect
      .poll(
        async () => {
          const { shown, asked } = await shownAndAsked();
          return asked.length > 0 && asked.join() === shown.join();
        },
        { timeout: 15_000 },
      )
      .toBe(true);
    expect((await shownAndAsked()).asked).toHaveLength(PAGE_ROWS);
  });
});
