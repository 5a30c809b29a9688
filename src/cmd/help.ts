/**
 * cmd/help — the `--help` text of every command, kept apart from the parser so the flags'
 * documentation reads in one piece.
 */

const HELP: Record<string, string> = {
  main: `egress-proxies-operator — a fleet of authenticated HTTP forward proxies, health-checked and
leased to crawlers.

Usage:
  egress-proxies-operator standalone --config <dir|file> [--state <file>] [flags]
  egress-proxies-operator operator --providers-config <file> [flags]
  egress-proxies-operator status [--server http://127.0.0.1:8090] [-o table|json] [--target HOST]
  egress-proxies-operator check-config --providers-config <file>
  egress-proxies-operator --version

Commands:
  standalone   Run everything in one process, no cluster: Proxy manifests from files,
               state in a local file. The quick start: npm start.
  operator     Run in a Kubernetes cluster on Proxy / ProviderHealth custom resources.
  status       Print the proxies of a running operator (phase, address, health, leases).
  check-config Validate a providers config file as the operator would at start, and exit.

Run 'egress-proxies-operator <command> --help' for the flags of a command.`,
  standalone: `Usage: egress-proxies-operator standalone --config <dir|file> [flags]

  -c, --config <dir|file>          The providers config file, or a directory holding
                                   providers.yaml (and, by default, a proxies/ folder).
  -m, --manifests <dir|file>       Proxy and Secret manifests (default: proxies/ beside the
                                   providers config). Edits take effect while running.
      --state <file>               Where status, instance IDs and generated credentials are
                                   kept (default: .state/standalone-state.json). One process
                                   per state file.
      --allow-empty-manifests      Let one rescan delete every Proxy, or more than half of them
                                   (otherwise such a rescan deletes nothing and warns).
${'COMMON'}`,
  operator: `Usage: egress-proxies-operator operator --providers-config <file> [flags]

      --providers-config <file>    Providers config (required).
      --leader-elect               Elect a leader among replicas (coordination.k8s.io Lease).
      --leader-election-namespace  Namespace of the Lease (default: the pod's namespace).
      --proxy-namespace <ns>       Only manage Proxies in this namespace.
      --metrics-secure             Serve metrics over HTTPS and require a ServiceAccount token
                                   (TokenReview + SubjectAccessReview) on every scrape.
      --metrics-cert-dir <dir>     tls.crt and tls.key for --metrics-secure (default: a
                                   self-signed certificate generated at start).
      --kubeconfig <file>          Default: in-cluster config, then $KUBECONFIG, then ~/.kube/config.
${'COMMON'}`,
  status: `Usage: egress-proxies-operator status [flags]

  -s, --server <url>     Discovery API of the running operator (default http://127.0.0.1:8090);
                         --discovery-url is another name for it.
      --token <token>    Bearer token (default: $DISCOVERY_TOKEN).
  -o, --output <fmt>     table (default) or json.
  -t, --target <host>    Leasable or not for this site (host, host:port or URL), and only its
                         cooldowns; ends with how many proxies it can get now.`,
  'check-config': `Usage: egress-proxies-operator check-config --providers-config <file>

  Reads and validates the file exactly as a start would, connects nowhere, and prints
  "providers config OK" (exit 0) or every problem, one line each, naming the field (exit 2).

      --providers-config <file>   The providers config to check.`,
  common: `Common flags:
      --discovery-bind-address <addr>     Lease / discovery API (standalone 127.0.0.1:8090, operator :8090).
      --metrics-bind-address <addr>       Prometheus /metrics; 0 = off (default 0).
      --health-probe-bind-address <addr>  /healthz and /readyz (standalone 127.0.0.1:8081, operator :8081).
      --gateway-bind-address <addr>       The gateway, one proxy endpoint for the fleet (standalone
                                          127.0.0.1:8888, operator 0 = off; see docs/gateway.md).
      --gateway-inspect                   Inspect HTTPS: terminate TLS with the operator CA and apply the
                                          response rules (gateway.rules) to HTTPS too (default off).
      --gateway-inspect-exclude <globs>   Hosts tunnelled untouched, e.g. *.bank.example,login.example.
      --gateway-origin-ca <file>          A PEM bundle trusted for origins besides the system store.
      --gateway-blocked-statuses <list>   Deprecated: statuses of the default rules (use gateway.rules).
      --gateway-max-connections <n>       Open gateway connections at most (default 20000; every cap is
                                          lowered to fit the open-files limit, docs/operations.md).
      --provider-check-interval <dur>     Provider health checks; 0 = off, else >= 10s (default 1m).
      --provider-check-timeout <dur>      Per round; default min(15s, interval); <= interval.
      --gc-interval <dur>                 Orphan instance sweep; 0 = off (default 10m).
      --gc-min-age <dur>                  Never collect instances younger than this (default 10m).
      --drain-timeout <dur>               A replaced instance keeps its leases at most this long, and no
                                          lease on it is renewed past that (default 10m; 0 = no drain).
      --max-concurrent-replacements <n|p%>  Replacements in flight per provider (default 10%, at least 1).
      --trace-health-probes               One span per health probe (off: probes run every second).
      --gcp-wire-full-payloads            Log GCP API requests/responses with bodies at debug (secrets redacted).
      --egress-ip-url <url>               Publish each proxy's egress IP from this URL (off by default).
      --log-level <level>                 trace|debug|info|warn|error (default info, or $LOG_LEVEL).
      --log-format <fmt>                  auto (pretty on a terminal, JSON otherwise) | json | pretty.
      --shutdown-grace-period <dur>       Time to drain on SIGTERM (default 30s).
      --lease-checkpoint-interval <dur>   Save leases and cooldowns this often (default 5s).
      --max-active-leases <n>             Live leases at most; then 503 too_many_leases (default 100000).
      --ended-lease-memory <size>         Memory for ended leases kept 15 min for late reports (default
                                          64Mi, ~1,000 releases/s; past it the oldest go early, counted).
      --discard-lease-state               Start from no leases or cooldowns when the lease checkpoint is
                                          damaged (kept aside), instead of refusing to start.
      --installation-id <id>              Which instances are this operator's (labels, GC, spec-hash key);
                                          default: the kube-system namespace UID (operator) or the id
                                          kept in the state file (standalone; must match it).
      --discovery-tls-cert <file>         Serve the discovery API over HTTPS with this PEM certificate
      --discovery-tls-key <file>          ...and this PEM key (both or neither).
      --discovery-allowed-hosts <list>    Without DISCOVERY_TOKEN, Host names served besides loopback, the
                                          bind address and the Pod's IPs (comma-separated; .suffix admits
                                          subdomains).
      --http-header-timeout <dur>         Discovery and metrics: time to receive a request head (default 10s).
      --http-request-timeout <dur>        ...time to receive a whole request (default 30s).
      --http-idle-timeout <dur>           ...an idle connection is closed after this (default 30s).
      --discovery-max-connections <n>     Open connections to the discovery API at most (default 1024).
      --metrics-max-connections <n>       Open connections to the metrics endpoint at most (default 64).
  -h, --help                              This help.

Boolean flags also take a value, as Go flags do: --flag=true|false (also 1|0, t|f).

Environment: DISCOVERY_TOKEN (bearer token for the discovery API), OTEL_* (tracing), LOG_LEVEL.`,
};

export function helpText(topic?: string): string {
  const body = (topic && HELP[topic]) || HELP.main || '';
  return body.replace('COMMON', HELP.common ?? '');
}
