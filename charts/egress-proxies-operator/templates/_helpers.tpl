{{/*
Labels of every object: the chart's own (test/e2e/kube/helm.test.ts strips exactly these when it
compares the chart with config/default) and the part-of label config/default adds.
*/}}
{{- define "epo.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: egress-proxies-operator
{{- end }}

{{/* Most objects also carry the name label (the generated providers ConfigMap does not). */}}
{{- define "epo.labels" -}}
{{ include "epo.commonLabels" . }}
app.kubernetes.io/name: egress-proxies-operator
{{- end }}

{{/* The manager Pods, as the Services, the PodDisruptionBudget and the NetworkPolicy select them. */}}
{{- define "epo.selector" -}}
app.kubernetes.io/name: egress-proxies-operator
app.kubernetes.io/component: manager
{{- end }}

{{/* The operator's ServiceAccount as an RBAC subject. */}}
{{- define "epo.subject" -}}
- kind: ServiceAccount
  name: egress-proxies-operator
  namespace: {{ .Release.Namespace }}
{{- end }}
