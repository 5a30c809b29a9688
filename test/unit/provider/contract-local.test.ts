/** The provider contract against the local provider (listeners in this process). */
import { createLocalProvider } from '../../../src/provider/local/index.ts';
import { freePortRange } from '../../support/ports.ts';
import { createRequest } from '../../support/provider-calls.ts';
import { providerContract } from '../../support/provider-contract.ts';

let n = 0;
providerContract('local', async () => {
  const provider = createLocalProvider({
    name: 'local-contract',
    config: { portRange: await freePortRange(12) },
  });
  return {
    provider,
    uniqueName: (what) => `px-${what}-${++n}`,
    request: (name, over) => createRequest(name, over),
    missingID: () => `local/px-missing-${++n}`,
    malformedID: 'px-no-prefix',
  };
});
