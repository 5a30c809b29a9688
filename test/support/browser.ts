/**
 * test/support/browser — headless Chromium from Debian (`chromium`, installed by
 * `bash .ci/install-system-packages.sh`) driven by playwright-core, with a fresh profile per
 * launch and everything that would phone home switched off; tests talk to loopback only.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BrowserContext, chromium } from 'playwright-core';

export const CHROMIUM = '/usr/bin/chromium';

export const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

export interface Browser {
  context: BrowserContext;
  close(): Promise<void>;
}

/** What a launch may add: a proxy (with Basic credentials) and environment (e.g. HOME, whose NSS db Chromium trusts). */
export interface LaunchOptions {
  proxy?: { server: string; username?: string; password?: string };
  env?: Record<string, string>;
}

/** Launches Chromium with a fresh --user-data-dir; fails naming the fix when it is missing. */
export async function launchChromium(
  viewport = { width: 1440, height: 900 },
  opts: LaunchOptions = {},
): Promise<Browser> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `${CHROMIUM} is missing: run \`bash .ci/install-system-packages.sh\` as root (Debian package chromium)`,
    );
  }
  const profile = mkdtempSync(join(tmpdir(), 'chromium-profile-'));
  // launchPersistentContext passes the profile as --user-data-dir.
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport,
    ...(opts.proxy ? { proxy: opts.proxy } : {}),
    ...(opts.env ? { env: { ...process.env, ...opts.env } } : {}),
  });
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
