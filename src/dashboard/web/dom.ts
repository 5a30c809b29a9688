/// <reference lib="dom" />
/**
 * dashboard/web/dom — building elements without innerHTML: every value from the server becomes
 * a text node, so nothing it says can turn into markup or script.
 */

type Child = Node | string | null | undefined | false;

/** `<tag class=… …attrs>children</tag>`; strings become text nodes. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined && c !== false) el.append(c);
  return el;
}

export function byId<T extends HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`the page has no #${id}`);
  return el as T;
}
