/**
 * The provider contract against the gcp provider through the official @google-cloud/compute
 * client (REST) and the stateful fake Compute Engine on loopback.
 */
import { googleAuthLibrary } from 'google-gax';
import { createGcpProvider } from '../../../src/provider/gcp/index.ts';
import { type FakeGce, startFakeGce } from '../../support/fake-gce.ts';
import { createRequest } from '../../support/provider-calls.ts';
import { providerContract } from '../../support/provider-contract.ts';

const PROJECT = 'proj-contract';
const ZONE = 'europe-west1-b';
let n = 0;
let fake: FakeGce;

providerContract(
  'gcp',
  async () => {
    fake = await startFakeGce({ zones: [ZONE, 'us-central1-a'] });
    const provider = createGcpProvider({
      name: 'gcp-contract',
      config: { project: PROJECT },
      clientOptions: {
        apiEndpoint: '127.0.0.1',
        port: fake.port,
        protocol: 'http',
        authClient: new googleAuthLibrary.PassThroughClient(),
      },
      callTimeoutMs: 3000,
    });
    return {
      provider,
      uniqueName: (what) => `px-${what}-${++n}`,
      request: (name, over) => createRequest(name, { zone: ZONE, ...over }),
      missingID: () => `projects/${PROJECT}/zones/${ZONE}/instances/px-missing-${++n}`,
      malformedID: 'px-no-prefix',
      slowDown: (ms) => fake.inject({ match: /./, status: 503, delayMs: ms }),
      speedUp: () => fake.clearFaults(),
      close: () => fake.close(),
    };
  },
  { midCallAbort: true },
);
