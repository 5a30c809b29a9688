/** The provider contract against the test double every reconciler, GC and crash test uses. */
import { FakeProvider } from '../../support/fake-provider.ts';
import { createRequest } from '../../support/provider-calls.ts';
import { providerContract } from '../../support/provider-contract.ts';

let n = 0;
providerContract(
  'fake',
  async () => {
    const fake = new FakeProvider({ pendingGets: 1 });
    return {
      provider: fake,
      uniqueName: (what) => `px-${what}-${++n}`,
      request: (name, over) => createRequest(name, over),
      missingID: () => fake.idOf(`px-missing-${++n}`),
      malformedID: 'px-no-prefix',
      slowDown: (ms) => {
        fake.latency = { create: ms, get: ms, delete: ms, listByTag: ms };
      },
      speedUp: () => {
        fake.latency = {};
      },
    };
  },
  { midCallAbort: true },
);
