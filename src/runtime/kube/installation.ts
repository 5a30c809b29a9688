/**
 * runtime/kube/installation — the cluster-mode installation id: the UID of the `kube-system`
 * namespace, which every cluster has, which never changes for the life of the cluster and which
 * a restore of the operator's own objects does not change either.
 */
import type { CoreV1Api } from '@kubernetes/client-node';
import { errorMessage } from '../../log/errors.ts';
import { callOptions } from './client.ts';

export const INSTALLATION_NAMESPACE = 'kube-system';

/** The `kube-system` namespace UID; an error says how to do without it (--installation-id). */
export async function clusterInstallationId(core: CoreV1Api, signal?: AbortSignal): Promise<string> {
  let uid: string | undefined;
  try {
    const ns = await core.readNamespace({ name: INSTALLATION_NAMESPACE }, callOptions({ signal }));
    uid = ns.metadata?.uid;
  } catch (err) {
    throw new Error(
      `reading the ${INSTALLATION_NAMESPACE} namespace for the installation id failed (grant get on namespaces/${INSTALLATION_NAMESPACE}, or pass --installation-id): ${errorMessage(err)}`,
      { cause: err },
    );
  }
  if (!uid) {
    throw new Error(`the ${INSTALLATION_NAMESPACE} namespace has no metadata.uid; pass --installation-id`);
  }
  return uid.toLowerCase();
}
