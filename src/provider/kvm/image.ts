/**
 * provider/kvm/image — the base-image cache in a host's storage pool. Bases are immutable and
 * content-addressed: `base-<key>-<version>.<format>` (the version is the configured checksum,
 * or the URL's hash) holds the image, `<base>.sha256` (written last) marks it complete and
 * records its digest. A changed image is a new base beside the old one, so the bytes under a
 * running VM's overlay never change; an old base of a configured image is removed only when no
 * volume in the pool has it as its backing file. A base without a marker is a crashed download
 * and is replaced. Images are fetched over http(s) into a temporary file, verified, then
 * uploaded; concurrent callers for one host and image share one job.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Logger } from 'pino';
import { isHttpUrl, redactUrl } from '../../api/url.ts';
import type { KvmImage } from '../../config/schema.ts';
import { silentLogger } from '../../log/index.ts';
import { permanent, transient } from '../errors.ts';
import {
  backingPathOf,
  baseVolumeName,
  baseVolumesOf,
  type DirectBoot,
  KVM_NAME_PATTERN,
  markerVolumeName,
  rawVolumeXml,
} from './domain.ts';
import type { LibvirtConnection } from './libvirt.ts';
import { ErrorCode, isLibvirtError, type PoolRef, type VolRef } from './libvirt-protocol.ts';
import { raceSignal } from './pool.ts';

export interface ResolvedImage {
  /** Config key, or `url-<hash>` for an image given as a URL. */
  key: string;
  /** The content-addressed base volume (see domain.baseVolumeName). */
  volume: string;
  url: string;
  sha256?: string | undefined;
  format: 'qcow2' | 'raw';
  firmware: 'uefi' | 'bios';
  /** Direct kernel boot (the image entry's `kernel`, `initrd`, `cmdline`); absent: boot the disk. */
  directBoot?: DirectBoot;
}

type Images = Record<string, Required<Pick<KvmImage, 'format' | 'firmware'>> & KvmImage>;

/**
 * The image a request names: a key of `kvm.images`, an http(s) URL (qcow2, UEFI), or nothing
 * when exactly one image is configured. Throws a message for a Permanent error.
 */
export function resolveImage(images: Images, ref: string | undefined): ResolvedImage {
  if (ref === undefined || ref === '') {
    const keys = Object.keys(images);
    if (keys.length !== 1) {
      throw new Error(
        `placement.image is required: kvm.images has ${keys.length === 0 ? 'no entries' : `several (${keys.join(', ')})`}`,
      );
    }
    ref = keys[0] as string;
  }
  const img = images[ref];
  if (img) {
    const version = img.sha256 ? `sha256-${img.sha256.toLowerCase().slice(0, 16)}` : `url-${hash16(img.url)}`;
    const volume = baseVolumeName(ref, img.format, version);
    const resolved: ResolvedImage = {
      key: ref,
      volume,
      url: img.url,
      sha256: img.sha256,
      format: img.format,
      firmware: img.firmware,
    };
    if (img.kernel !== undefined) {
      resolved.directBoot = {
        kernel: img.kernel,
        ...(img.initrd !== undefined ? { initrd: img.initrd } : {}),
        ...(img.cmdline !== undefined ? { cmdline: img.cmdline } : {}),
      };
    }
    return resolved;
  }
  if (isHttpUrl(ref)) {
    const key = `url-${hash16(ref)}`;
    return { key, volume: baseVolumeName(key, 'qcow2'), url: ref, format: 'qcow2', firmware: 'uefi' };
  }
  throw new Error(`image ${JSON.stringify(ref)} is neither a key of kvm.images nor an http(s) URL`);
}

const hash16 = (s: string) => createHash('sha256').update(s).digest('hex').slice(0, 16);

export interface BaseImage {
  volume: string;
  path: string;
  format: 'qcow2' | 'raw';
}

export interface ImageCacheOptions {
  log?: Logger;
  fetch?: typeof fetch;
  /** Bounds one download. Default 30 min. */
  downloadTimeoutMs?: number;
}

async function readAll(it: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const p of it) parts.push(p);
  return Buffer.concat(parts);
}

async function lookupVol(conn: LibvirtConnection, pool: PoolRef, name: string, signal: AbortSignal) {
  try {
    return await conn.storageVolLookupByName(pool, name, { signal });
  } catch (err) {
    if (isLibvirtError(err, ErrorCode.NO_STORAGE_VOL)) return undefined;
    throw err;
  }
}

/** The call's result, or undefined when the volume went away meanwhile. */
async function ignoreMissing<T>(p: Promise<T>): Promise<T | undefined> {
  try {
    return await p;
  } catch (err) {
    if (isLibvirtError(err, ErrorCode.NO_STORAGE_VOL)) return undefined;
    throw err;
  }
}

async function deleteVol(conn: LibvirtConnection, vol: VolRef | undefined, signal: AbortSignal) {
  if (!vol) return;
  try {
    await conn.storageVolDelete(vol, 0, { signal });
  } catch (err) {
    if (!isLibvirtError(err, ErrorCode.NO_STORAGE_VOL)) throw err;
  }
}

export class ImageCache {
  private readonly log: Logger;
  private readonly fetchFn: typeof fetch;
  private readonly downloadTimeoutMs: number;
  private readonly jobs = new Map<string, Promise<BaseImage>>();
  /** Bases creates are using right now (host/pool/volume → count): never swept. */
  private readonly holds = new Map<string, number>();
  /** Bases being removed by a sweep: a create of that base waits, then downloads afresh. */
  private readonly removing = new Map<string, Promise<void>>();
  private readonly stop = new AbortController();

  constructor(opts: ImageCacheOptions = {}) {
    this.log = (opts.log ?? silentLogger()).child({ component: 'kvm-image' });
    this.fetchFn = opts.fetch ?? fetch;
    this.downloadTimeoutMs = opts.downloadTimeoutMs ?? 30 * 60_000;
  }

  /**
   * Runs `use` with the cached base image on `host` (downloaded first when needed), holding it
   * so no sweep removes it before `use` has made the overlay that references it.
   */
  async with<T>(
    conn: LibvirtConnection,
    host: string,
    pool: PoolRef,
    image: ResolvedImage,
    signal: AbortSignal,
    use: (base: BaseImage) => Promise<T>,
  ): Promise<T> {
    if (!KVM_NAME_PATTERN.test(image.key)) {
      throw permanent(`image key ${JSON.stringify(image.key)} is not a valid volume name`);
    }
    const held = `${host}\n${pool.name}\n${image.volume}`;
    // Taken before anything is awaited: a sweep checks holds in the same turn it marks removal.
    this.holds.set(held, (this.holds.get(held) ?? 0) + 1);
    try {
      await raceSignal(this.removing.get(held) ?? Promise.resolve(), signal);
      return await use(await this.ensure(conn, host, pool, image, signal));
    } finally {
      const n = (this.holds.get(held) ?? 1) - 1;
      if (n > 0) this.holds.set(held, n);
      else this.holds.delete(held);
    }
  }

  /** The cached base image on `host`, downloading it first when needed. */
  private ensure(
    conn: LibvirtConnection,
    host: string,
    pool: PoolRef,
    image: ResolvedImage,
    signal: AbortSignal,
  ): Promise<BaseImage> {
    const volume = image.volume;
    const jobKey = `${host}\n${pool.name}\n${volume}\n${image.url}\n${image.sha256 ?? ''}`;
    let job = this.jobs.get(jobKey);
    if (!job) {
      // Shared by every caller: ends with the provider (close), not with one caller's signal.
      job = this.run(conn, host, pool, image, volume, this.stop.signal);
      this.jobs.set(jobKey, job);
      const j = job;
      void j.then(
        () => this.jobs.delete(jobKey),
        () => this.jobs.delete(jobKey),
      );
    }
    return raceSignal(job, signal);
  }

  /**
   * Removes the bases of `images` that are not their current version and that no volume in
   * the pool uses as its backing file (nor a create in flight). Bases of images not in this
   * list are left alone: another provider on the same pool may use them. Returns the removed.
   */
  async sweep(
    conn: LibvirtConnection,
    host: string,
    pool: PoolRef,
    images: readonly ResolvedImage[],
    signal: AbortSignal,
  ): Promise<string[]> {
    const o = { signal };
    const vols = await conn.storagePoolListAllVolumes(pool, o);
    const current = new Set(images.map((i) => i.volume));
    const old = vols.filter(
      (v) => !current.has(v.name) && images.some((i) => baseVolumesOf(i.key).test(v.name)),
    );
    if (old.length === 0) return [];
    const backing = new Set<string>();
    for (const v of vols) {
      if (v.name.startsWith('base-')) continue;
      const xml = await ignoreMissing(conn.storageVolGetXmlDesc(v, o));
      const path = xml === undefined ? undefined : backingPathOf(xml);
      if (path) backing.add(path);
    }
    const removed: string[] = [];
    for (const v of old) {
      const path = await ignoreMissing(conn.storageVolGetPath(v, o));
      if (path === undefined || backing.has(path)) continue;
      const held = `${host}\n${pool.name}\n${v.name}`;
      if (this.holds.has(held) || this.removing.has(held)) continue;
      const marker = vols.find((m) => m.name === markerVolumeName(v.name));
      // The marker goes first: a base left without one reads as unfinished, never as valid.
      const job = deleteVol(conn, marker, signal).then(() => deleteVol(conn, v, signal));
      this.removing.set(
        held,
        job.catch(() => undefined),
      );
      try {
        await job;
      } finally {
        this.removing.delete(held);
      }
      removed.push(v.name);
      this.log.info({ host, volume: v.name }, 'old base image removed: no overlay uses it');
    }
    return removed;
  }

  close(): void {
    this.stop.abort(new Error('kvm provider closed'));
  }

  private async run(
    conn: LibvirtConnection,
    host: string,
    pool: PoolRef,
    image: ResolvedImage,
    volume: string,
    signal: AbortSignal,
  ): Promise<BaseImage> {
    const markerName = markerVolumeName(volume);
    const marker = await lookupVol(conn, pool, markerName, signal);
    let base = await lookupVol(conn, pool, volume, signal);
    if (marker && base) {
      const digest = (await readAll(conn.storageVolDownload(marker, { signal }))).toString('utf8').trim();
      if (image.sha256 === undefined || digest.toLowerCase() === image.sha256.toLowerCase()) {
        return { volume, path: await conn.storageVolGetPath(base, { signal }), format: image.format };
      }
      // Same name, other bytes: only tampering does that. Overlays may read it; leave it be.
      throw permanent(
        `image ${image.key}: cached base ${volume} records sha256 ${digest}, configured ${image.sha256}; remove the volume by hand if no VM uses it`,
      );
    }
    // No marker: an earlier download did not finish, so no overlay was made on it. Start over.
    await deleteVol(conn, marker, signal);
    await deleteVol(conn, base, signal);
    base = undefined;

    const dir = await mkdtemp(join(tmpdir(), 'kvm-image-'));
    try {
      const file = join(dir, 'image');
      const digest = await this.download(image, file, signal);
      if (image.sha256 !== undefined && digest !== image.sha256.toLowerCase()) {
        throw permanent(
          `image ${image.key}: sha256 of ${redactUrl(image.url)} is ${digest}, configured ${image.sha256.toLowerCase()}`,
        );
      }
      const size = (await stat(file)).size;
      // Created as a plain file of the image's size, then filled byte for byte: the overlay
      // names the base's real format explicitly.
      base = await conn.storageVolCreateXml(pool, rawVolumeXml(volume, size), 0, { signal });
      try {
        await conn.storageVolUpload(base, createReadStream(file), { signal });
        const text = Buffer.from(`${digest}\n`, 'utf8');
        const m = await conn.storageVolCreateXml(pool, rawVolumeXml(markerName, text.length), 0, { signal });
        await conn.storageVolUpload(m, text, { signal });
      } catch (err) {
        // Leave no half image behind; the next attempt would replace it anyway.
        await deleteVol(conn, base, AbortSignal.timeout(10_000)).catch(() => undefined);
        throw err;
      }
      this.log.info({ host, volume, bytes: size }, 'base image cached');
      return { volume, path: await conn.storageVolGetPath(base, { signal }), format: image.format };
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  /** Streams the image into `file`, returning its sha256 (hex). */
  private async download(image: ResolvedImage, file: string, signal: AbortSignal): Promise<string> {
    const url = redactUrl(image.url);
    const sig = AbortSignal.any([signal, AbortSignal.timeout(this.downloadTimeoutMs)]);
    let res: Response;
    try {
      res = await this.fetchFn(image.url, { signal: sig, redirect: 'follow' });
    } catch (err) {
      throw transient(`image ${image.key}: cannot fetch ${url}: ${(err as Error).message}`, { cause: err });
    }
    if (!res.ok || !res.body) {
      await res.body?.cancel().catch(() => undefined);
      const msg = `image ${image.key}: GET ${url} answered HTTP ${res.status}`;
      throw res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429
        ? permanent(msg)
        : transient(msg);
    }
    const hash = createHash('sha256');
    const body = Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>);
    body.on('data', (chunk: Buffer) => hash.update(chunk));
    try {
      await pipeline(body, createWriteStream(file), { signal: sig });
    } catch (err) {
      throw transient(`image ${image.key}: download of ${url} failed: ${(err as Error).message}`, {
        cause: err,
      });
    }
    return hash.digest('hex');
  }
}
