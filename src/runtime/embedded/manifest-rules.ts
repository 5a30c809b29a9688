/**
 * runtime/embedded/manifest-rules — the two decisions a manifest rescan makes before it touches
 * anything: which file owns a name that several files define (the file that owned it keeps it;
 * on a fresh start, the first path in sort order), and whether the rescan would delete so many
 * Proxies at once that it looks like an accident rather than an edit.
 */
import { type FileScan, type ManifestDoc, type ManifestError, refName } from './manifests.ts';

export interface Desired {
  /** The documents to apply, keyed by manifestKey. */
  desired: Map<string, ManifestDoc>;
  /** Files rejected whole (their own errors, or a duplicate they add): their objects are kept. */
  badFiles: Set<string>;
  errors: ManifestError[];
}

/**
 * Every document of the files without errors. A name defined in several files stays with the
 * file that owns it now (`ownerOf`, from the bookkeeping) — also while that file is itself
 * rejected, since its objects keep their last good version — and every other file defining it
 * is rejected whole. With no current owner among them, the file whose path sorts first wins.
 */
export function collectDesired(scans: FileScan[], ownerOf: (key: string) => string | undefined): Desired {
  const badFiles = new Set<string>();
  const errors: ManifestError[] = [];
  for (const s of scans) {
    if (s.errors.length === 0) continue;
    badFiles.add(s.file);
    errors.push(...s.errors);
  }
  // Rejecting a file can settle another name's conflict differently: repeat until stable.
  for (let rejected = true; rejected; ) {
    rejected = false;
    const definers = new Map<string, ManifestDoc[]>();
    for (const s of scans) {
      if (badFiles.has(s.file)) continue;
      for (const d of s.docs) definers.set(d.key, [...(definers.get(d.key) ?? []), d]);
    }
    for (const [key, docs] of definers) {
      const owner = ownerOf(key);
      const held = owner !== undefined && badFiles.has(owner) && scans.some((s) => s.file === owner);
      if (docs.length < 2 && !held) continue;
      const winner = held ? undefined : (docs.find((d) => d.file === owner) ?? (docs[0] as ManifestDoc));
      const winnerFile = winner?.file ?? (owner as string);
      const where = winner
        ? `${winnerFile} (document ${winner.index})`
        : `${winnerFile} (its last good version)`;
      for (const d of docs) {
        if (d === winner || badFiles.has(d.file)) continue;
        badFiles.add(d.file);
        rejected = true;
        errors.push({
          file: d.file,
          document: d.index,
          path: 'metadata.name',
          message: `${refName(d.ref)} is already defined in ${where}; this file adds a duplicate and is rejected whole`,
        });
      }
    }
  }
  const desired = new Map<string, ManifestDoc>();
  for (const s of scans) {
    if (badFiles.has(s.file)) continue;
    for (const d of s.docs) desired.set(d.key, d);
  }
  return { desired, badFiles, errors };
}

/** The live manifest Proxies before the rescan, and how many of them it would delete. */
export interface ProxyLoss {
  before: number;
  lost: number;
}

/**
 * A rescan that would delete more than half of the live Proxies (all of them included) is
 * held back: a truncated file, `rm *.yaml` or an emptied directory is far more often an
 * accident than an intent, and each deleted Proxy may be a cloud VM.
 */
export const isMassDeletion = (l: ProxyLoss): boolean => l.lost > 0 && l.lost * 2 > l.before;
