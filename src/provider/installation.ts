/**
 * provider/installation — which operator fleet ("installation") an instance belongs to. Two
 * operators may share one GCP project, KVM host or cluster; each labels its instances with its
 * own installation id, and GC, adoption and the reconciler's search for stray instances touch
 * only what `claimOf` says is theirs. See docs/operations.md, "Installation identity".
 */
import type { Instance } from './contract.ts';

/**
 * What an id may look like: valid as a GCP label value, a Kubernetes label value and libvirt
 * metadata at once (lowercase letters, digits, `-` and `_`, ≤ 63, alphanumeric at both ends).
 * A UUID — the `kube-system` namespace UID or a generated one — fits.
 */
const INSTALLATION_ID = /^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$/;

/** Why `id` cannot be an installation id (naming `field`), or undefined when it can. */
export function installationIdProblem(id: string, field: string): string | undefined {
  if (INSTALLATION_ID.test(id)) return undefined;
  return `${field}: ${JSON.stringify(id.slice(0, 80))} is not a valid installation id (1-63 lowercase letters, digits, "-" or "_", starting and ending with a letter or digit)`;
}

/**
 * How an installation sees a listed instance:
 * - `ours`: labelled with our id, or unlabelled but carrying the UID of one of our Proxies
 *   (created before installations existed; adopted when the backend can relabel);
 * - `foreign`: labelled with another installation's id — never touched;
 * - `unclaimed`: unlabelled and no Proxy of ours has its UID — never touched, reported, since
 *   it may belong to another installation that has not been upgraded yet.
 */
export type Claim = 'ours' | 'foreign' | 'unclaimed';

export function claimOf(inst: Instance, installation: string, ourUids: ReadonlySet<string>): Claim {
  if (inst.installation !== undefined) return inst.installation === installation ? 'ours' : 'foreign';
  return inst.uid !== undefined && ourUids.has(inst.uid) ? 'ours' : 'unclaimed';
}
