/**
 * api/conditions — Kubernetes condition-list helpers (meta.SetStatusCondition semantics):
 * lastTransitionTime moves only when status flips, so it says when things changed.
 */
import type { Condition } from './meta.ts';

export function findCondition(conditions: Condition[] | undefined, type: string): Condition | undefined {
  return conditions?.find((c) => c.type === type);
}

/**
 * Returns a new list with `next` set in place of the condition of its type, every other
 * condition kept; lastTransitionTime stays unless the status changed. `now` as a string is
 * used as written (an RFC 3339 timestamp).
 */
export function setCondition(
  conditions: readonly Condition[] | undefined,
  next: Omit<Condition, 'lastTransitionTime'> & { lastTransitionTime?: string },
  now: Date | string,
): Condition[] {
  const list = conditions ? [...conditions] : [];
  const i = list.findIndex((c) => c.type === next.type);
  const prev = i >= 0 ? list[i] : undefined;
  const lastTransitionTime =
    prev && prev.status === next.status
      ? prev.lastTransitionTime
      : (next.lastTransitionTime ?? (typeof now === 'string' ? now : now.toISOString()));
  const merged: Condition = { ...next, lastTransitionTime };
  if (i >= 0) list[i] = merged;
  else list.push(merged);
  return list;
}

export function isConditionTrue(conditions: Condition[] | undefined, type: string): boolean {
  return findCondition(conditions, type)?.status === 'True';
}
