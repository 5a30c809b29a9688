/**
 * The provider contract against the aws provider through the official @aws-sdk/client-ec2
 * against moto's server on loopback (test/support/moto.ts). Integration tier: moto_server is a
 * child process from a private virtual environment, like schemathesis; it is a fake of the EC2
 * API, not a real backend or VM.
 */
import { createAwsProvider } from '../../../src/provider/aws/index.ts';
import { MOTO_CREDENTIALS, type Moto, seedRegion, startMoto } from '../../support/moto.ts';
import { createRequest } from '../../support/provider-calls.ts';
import { providerContract } from '../../support/provider-contract.ts';

const REGION = 'us-east-1';
let n = 0;
let moto: Moto;

providerContract(
  'aws (moto)',
  async () => {
    moto = await startMoto();
    const seed = await seedRegion(moto.url, REGION, [`${REGION}a`, `${REGION}b`]);
    const provider = createAwsProvider({
      name: 'aws-contract',
      config: {
        regions: [{ name: REGION, subnets: seed.subnets }],
        images: { default: seed.imageId },
        securityGroup: { sourceRanges: ['203.0.113.0/24'] },
        endpoint: moto.url,
      },
      clientOptions: { credentials: MOTO_CREDENTIALS, maxAttempts: 1 },
    });
    return {
      provider,
      uniqueName: (what) => `px-${what}-${++n}`,
      request: (name, over) => createRequest(name, over),
      missingID: () => `regions/${REGION}/instances/px-missing-${++n}`,
      malformedID: 'px-no-prefix',
      close: () => moto.close(),
    };
  },
  { timeoutMs: 30_000 },
);
