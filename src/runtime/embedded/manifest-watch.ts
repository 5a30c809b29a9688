/**
 * runtime/embedded/manifest-watch — change notification for the manifests: the directory that
 * holds them, its parent (so a directory that is removed and re-created is watched again at
 * once — a watch dies with the directory it was set on), and the directories that symlinked
 * manifests point into (an edit of a link's target changes nothing in the linking directory).
 */
import { type FSWatcher, watch as fsWatch, statSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import type { Logger } from '../../log/index.ts';

const MANIFEST_FILE_LIKE = /\.(ya?ml|json)$/i;

export class ManifestWatcher {
  private readonly dir: string;
  /** In single-file mode, only events naming this file count. */
  private readonly only: string | undefined;
  private readonly onChange: () => void;
  private readonly log: Logger;
  private main: FSWatcher | undefined;
  private parent: FSWatcher | undefined;
  private readonly targets = new Map<string, FSWatcher>();
  private closed = false;
  private warned = false;

  constructor(path: string, onChange: () => void, log: Logger) {
    let isDir: boolean;
    try {
      isDir = statSync(path).isDirectory();
    } catch {
      isDir = !MANIFEST_FILE_LIKE.test(path);
    }
    this.dir = isDir ? path : dirname(path);
    this.only = isDir ? undefined : basename(path);
    this.onChange = onChange;
    this.log = log;
  }

  start(): void {
    this.armMain();
    const name = basename(this.dir);
    this.parent = this.watch(dirname(this.dir), (file) => {
      if (file !== undefined && file !== name) return;
      this.armMain(); // removed, renamed or re-created: watch whatever is there now
      this.onChange();
    });
  }

  /** Watches the directories symlinked manifests resolve into (besides the manifests directory). */
  watchTargets(dirs: Iterable<string>): void {
    if (this.closed) return;
    const want = new Set([...dirs].filter((d) => d !== this.dir));
    for (const [d, w] of this.targets) {
      if (want.has(d)) continue;
      w.close();
      this.targets.delete(d);
    }
    for (const d of want) {
      if (this.targets.has(d)) continue;
      const w = this.watch(d, () => this.onChange());
      if (w) this.targets.set(d, w);
    }
  }

  close(): void {
    this.closed = true;
    this.main?.close();
    this.parent?.close();
    for (const w of this.targets.values()) w.close();
    this.targets.clear();
  }

  private armMain(): void {
    if (this.closed) return;
    this.main?.close();
    this.main = this.watch(this.dir, (file) => {
      if (!this.only || file === undefined || file === this.only) this.onChange();
    });
  }

  private watch(dir: string, on: (file: string | undefined) => void): FSWatcher | undefined {
    try {
      const w = fsWatch(dir, { persistent: false }, (_ev, file) => on(file?.toString()));
      // A watched directory that disappears ends its watch; the parent watch re-arms it.
      w.on('error', () => w.close());
      return w;
    } catch (e) {
      // Missing right now (the parent watch sees it come back), or no notification here.
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT' && !this.warned) {
        this.warned = true;
        this.log.warn({ err: e, dir }, 'cannot watch manifests; relying on periodic rescans');
      }
      return undefined;
    }
  }
}
