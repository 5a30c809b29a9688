/**
 * scripts/test/session — the part of `npm test` that owns processes: it registers the run as a
 * user of libvirtd + sshd (starting them when allowed and not up), runs the test command with
 * signals passed on, and then stops what the run started — the processes the tests left behind,
 * and the daemons when this is the last run using them. From its first line to its last a
 * handler holds SIGINT, SIGTERM and SIGHUP: a second Ctrl-C while it stops things is answered
 * with "please wait", never with an abandoned cleanup. The up and down scripts run in their own
 * process group, so a Ctrl-C at the terminal does not cut them off halfway either.
 *
 * scripts/test/run.ts calls it with scripts/ci/libvirt-up.sh, libvirt-down.sh and vitest;
 * test/integration/scripts/session.test.ts with stub scripts and a stub test command (docs/testing.md).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { DaemonUsers, daemonsUp, RUN_MARKER, stopStragglers } from './prerequisites.ts';

export const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

export interface SessionOptions {
  /** Working directory of the scripts and the test command. */
  cwd: string;
  /** Where the daemons keep their state and pid files (`LIBVIRT_CI_DIR`, passed to the scripts). */
  stateDir: string;
  /** Starts the daemons (bash script); run only when `mayStartDaemons` and they are not up. */
  upScript: string;
  /** Stops them (bash script); run by the last run that uses daemons npm test started. */
  downScript: string;
  /** Root on a prepared machine: start the daemons when they are not up. */
  mayStartDaemons: boolean;
  /**
   * Whether the tests use the daemons at all (default true). When false (the integration tier)
   * the run neither registers as their user nor starts or stops them.
   */
  daemons?: boolean;
  /** The tests: vitest, or a stub. Gets `RUN_MARKER=<runId>` in its environment. */
  command: string;
  args: string[];
  /**
   * Run after the tests, in order, unless the run was interrupted (the KVM end-to-end tier: its
   * image build, then its vitest). The run's exit code is the worst of all.
   */
  afterwards?: FollowUp[];
  /** Marks the processes of this run (default: this process's pid). */
  runId?: string;
  /** How long stragglers get between SIGTERM and SIGKILL (default 3 s). */
  stragglerGraceMs?: number;
  say?: (msg: string) => void;
}

/** A command run after the tests, with the same signal handling and marker. */
export interface FollowUp {
  /** Said before it starts and, with its exit code and duration, after it ends. */
  name: string;
  command: string;
  args: string[];
  /**
   * When it fails, the follow-ups after it of the same tier are not run (and the run says so):
   * a failed build stops its own tier, not another.
   */
  gate?: boolean;
  /** Which tier it belongs to (for `gate`). */
  tier?: string;
}

/** The exit code of a process ended by `sig`, as a shell reports it. */
export function signalExitCode(sig: NodeJS.Signals): number {
  return sig === 'SIGINT' ? 130 : sig === 'SIGHUP' ? 129 : 143;
}

function defaultSay(msg: string): void {
  process.stderr.write(`[npm test] ${msg}\n`);
}

/** Runs a bash script in its own process group (out of reach of the terminal's Ctrl-C). */
function runScript(o: SessionOptions, script: string): Promise<{ code: number | null; why: string }> {
  return new Promise((resolve) => {
    const child = spawn('bash', [script], {
      cwd: o.cwd,
      detached: true,
      stdio: ['ignore', 'ignore', 'inherit'],
      env: { ...process.env, LIBVIRT_CI_DIR: o.stateDir },
    });
    child.once('error', (err) => resolve({ code: null, why: err.message }));
    child.once('exit', (code, signal) => resolve({ code, why: `exit ${code ?? signal}` }));
  });
}

/** Runs the test command; on a signal, passes it on (a terminal's Ctrl-C already reached it). */
function runForwardingSignals(
  o: SessionOptions,
  runId: string,
  onSignal: (listener: ((sig: NodeJS.Signals) => void) | undefined) => void,
): Promise<number> {
  return new Promise((resolve) => {
    const child: ChildProcess = spawn(o.command, o.args, {
      cwd: o.cwd,
      stdio: 'inherit',
      env: { ...process.env, [RUN_MARKER]: runId },
    });
    onSignal((sig) => {
      // A signal sent to this process alone must still stop the tests; give the child a moment
      // to act on the one the terminal sent it, then insist.
      setTimeout(() => child.exitCode === null && child.signalCode === null && child.kill(sig), 1000).unref();
      setTimeout(
        () => child.exitCode === null && child.signalCode === null && child.kill('SIGKILL'),
        30_000,
      ).unref();
    });
    child.once('error', (err) => {
      (o.say ?? defaultSay)(`${o.command}: ${err.message}`);
      onSignal(undefined);
      resolve(1);
    });
    child.once('exit', (code, signal) => {
      onSignal(undefined);
      resolve(code ?? (signal ? signalExitCode(signal) : 1));
    });
  });
}

export async function runSession(o: SessionOptions): Promise<number> {
  const say = o.say ?? defaultSay;
  const runId = o.runId ?? String(process.pid);
  let interrupted: NodeJS.Signals | undefined;
  let stopping = false;
  let forward: ((sig: NodeJS.Signals) => void) | undefined;
  const handler = (sig: NodeJS.Signals): void => {
    interrupted ??= sig;
    if (stopping) {
      say(
        `${sig}: still stopping what this run started; please wait (kill -9 ${process.pid} would leave it running)`,
      );
      return;
    }
    if (forward) forward(sig);
    else say(`${sig}: stopping once ${o.upScript} has finished (it is not cut off halfway)`);
  };
  // Installed before anything is started, removed after everything is stopped.
  for (const s of SIGNALS) process.on(s, handler);

  const useDaemons = o.daemons ?? true;
  const users = new DaemonUsers(o.stateDir);
  if (useDaemons) users.register();
  let code = 1;
  try {
    let ready = true;
    if (!useDaemons) {
      // Nothing of libvirtd or sshd is used: neither started nor counted as a user.
    } else if (o.mayStartDaemons && !daemonsUp(o.stateDir)) {
      say("starting libvirtd and sshd on loopback and the VMs' bridge for the kvm tests");
      users.markStartedByUs();
      const up = await runScript(o, o.upScript);
      if (up.code !== 0) {
        say(`${o.upScript} failed (${up.why})`);
        ready = false;
      }
    } else {
      say('reusing the running libvirtd and sshd');
    }
    if (ready && interrupted === undefined) {
      code = await runForwardingSignals(o, runId, (l) => {
        forward = l;
      });
      let skipTier: string | undefined;
      for (const f of o.afterwards ?? []) {
        if (interrupted !== undefined) break;
        if (skipTier !== undefined && f.tier === skipTier) continue;
        say(f.name);
        const started = Date.now();
        const c = await runForwardingSignals({ ...o, command: f.command, args: f.args }, runId, (l) => {
          forward = l;
        });
        say(`${f.name}: exit ${c} after ${Math.round((Date.now() - started) / 1000)} s`);
        code = Math.max(code, c);
        if (c !== 0 && f.gate) {
          say(`not running the rest of ${f.tier ?? 'the run'}: ${f.name} failed`);
          if (f.tier === undefined) break;
          skipTier = f.tier;
        }
      }
    }
  } finally {
    stopping = true;
    if (interrupted) say(`interrupted (${interrupted}); stopping what this run started`);
    const left = stopStragglers(runId, o.stragglerGraceMs);
    if (left > 0) say(`stopped ${left} process(es) the tests left running`);
    if (useDaemons && users.unregister()) {
      say('stopping libvirtd and sshd (started by npm test)');
      const down = await runScript(o, o.downScript);
      if (down.code !== 0) say(`${o.downScript} failed (${down.why})`);
      users.clear();
    }
    for (const s of SIGNALS) process.off(s, handler);
  }
  return interrupted ? signalExitCode(interrupted) : code;
}
