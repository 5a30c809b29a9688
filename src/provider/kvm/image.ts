/**
 * provider/kvm/image — the base-image cache in a host's storage pool: `base-<key>.<format>`
 * holds the image, `base-<key>.<format>.sha256` (written last) marks it complete and records
 * its digest. A base without a marker is a crashed download and is replaced. Images are fetched
 * over http(s) into a temporary file, verified, then uploaded; concurrent callers for one host
 * and image share one job.
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
import { baseVolumeName, KVM_NAME_PATTERN, markerVolumeName, rawVolumeXml } from './domain.ts';
import type { LibvirtConnection } from './libvirt.ts';
import { ErrorCode, isLibvirtError, type PoolRef, type VolRef } from './libvirt-protocol.ts';
import { raceSignal } from './pool.ts';

export interface ResolvedImage {
  /** Config key, or `url-<hash>` for an image given as a URL. */
  key: string;
  url: string;
  sha256?: string | undefined;
  format: 'qcow2' | 'raw';
  firmware: 'uefi' | 'bios';
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
  if (img) return { key: ref, url: img.url, sha256: img.sha256, format: img.format, firmware: img.firmware };
  if (isHttpUrl(ref)) {
    const key = `url-${createHash('sha256').update(ref).digest('hex').slice(0, 16)}`;
    return { key, url: ref, format: 'qcow2', firmware: 'uefi' };
  }
  throw new Error(`image ${JSON.stringify(ref)} is neither a key of kvm.images nor an http(s) URL`);
}

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
  private readonly stop = new AbortController();

  constructor(opts: ImageCacheOptions = {}) {
    this.log = (opts.log ?? silentLogger()).child({ component: 'kvm-image' });
    this.fetchFn = opts.fetch ?? fetch;
    this.downloadTimeoutMs = opts.downloadTimeoutMs ?? 30 * 60_000;
  }

  /** The cached base image on `host`, downloading it first when needed. */
  ensure(
    conn: LibvirtConnection,
    host: string,
    pool: PoolRef,
    image: ResolvedImage,
    signal: AbortSignal,
  ): Promise<BaseImage> {
    if (!KVM_NAME_PATTERN.test(image.key)) {
      return Promise.reject(permanent(`image key ${JSON.stringify(image.key)} is not a valid volume name`));
    }
    const volume = baseVolumeName(image.key, image.format);
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
      this.log.info({ host, volume }, 'cached base image has another sha256 than configured; replacing it');
    }
    // No marker: an earlier download did not finish (or the image changed). Start over.
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
