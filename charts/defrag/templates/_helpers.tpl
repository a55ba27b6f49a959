{{/*
Labels on every object's metadata: the kustomize tree's part-of, plus Helm's own. Selectors and
pod templates keep only app.kubernetes.io/name and component, as the kustomize tree has them,
so that an upgrade never changes an immutable selector.
*/}}
{{- define "defrag.labels" -}}
app.kubernetes.io/part-of: defrag
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "defrag.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The upstream kube-scheduler of the cluster's own version: the server's gitVersion without a
vendor suffix (v1.30.5-gke.1014001 is v1.30.5 upstream), unless a tag is set.
*/}}
{{- define "defrag.schedulerImage" -}}
{{- $tag := .Values.extender.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{ .Values.extender.scheduler.image.repository }}:{{ $tag }}
{{- end -}}

{{/* The settings file: the values' settings, the Lease in the release namespace unless set. */}}
{{- define "defrag.settings" -}}
{{- $settings := deepCopy .Values.settings -}}
{{- $leadership := get $settings "leadership" | default dict -}}
{{- if not (hasKey $leadership "lease_namespace") -}}
{{- $_ := set $leadership "lease_namespace" .Release.Namespace -}}
{{- end -}}
{{- $_ := set $settings "leadership" $leadership -}}
{{- toYaml $settings -}}
{{- end -}}

{{/* The rule files that are not dropped (null), by name. */}}
{{- define "defrag.rules" -}}
{{- range $name, $doc := .Values.rules }}
{{- if $doc }}
{{ $name }}: |
{{ toYaml $doc | indent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The labels a Prometheus selects monitors and rules by. */}}
{{- define "defrag.monitoringLabels" -}}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Egress to DNS and the API server, shared by every pod's egress policy. */}}
{{- define "defrag.egressBase" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: kube-system
      podSelector:
        matchLabels:
          k8s-app: kube-dns
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
- to:
  {{- range .Values.networkPolicy.apiServer.cidrs }}
    - ipBlock:
        cidr: {{ . | quote }}
  {{- end }}
  ports:
  {{- range .Values.networkPolicy.apiServer.ports }}
    - port: {{ . }}
      protocol: TCP
  {{- end }}
{{- end -}}

{{/* The pod and container securityContexts every defrag pod runs with (PSS restricted). */}}
{{- define "defrag.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/*
defrag-scheduler's KubeSchedulerConfiguration (deploy/components/extender/
kube-scheduler-config.yaml says why each field is set): its own Lease in the release namespace,
one profile, the extender of the same pod on loopback.
*/}}
{{- define "defrag.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceName: defrag-scheduler
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: defrag-scheduler
extenders:
  - urlPrefix: http://127.0.0.1:8888
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ .Values.extender.weight }}
    enableHTTPS: false
    nodeCacheCapable: true
    managedResources:
    {{- range .Values.extender.managedResources }}
      - name: {{ . }}
        ignoredByScheduler: false
    {{- end }}
    ignorable: true
    httpTimeout: {{ .Values.extender.httpTimeout }}
{{- end -}}

{{/* The daemon's HTTP port (settings.http.port; the daemon's default is 8080). */}}
{{- define "defrag.httpPort" -}}
{{ dig "http" "port" 8080 .Values.settings }}
{{- end -}}

{{/*
Settings the RBAC and the admission policies fix: the daemon may write only its Lease "defrag"
(policy defrag-own-lease), in the release namespace (its Role's). Refused here with the field's
name rather than by the API server at the first election.
*/}}
{{- define "defrag.validate" -}}
{{- $name := dig "leadership" "lease_name" "defrag" .Values.settings -}}
{{- if ne $name "defrag" -}}
{{- fail (printf "settings.leadership.lease_name is %q: it must be \"defrag\", the one Lease the admission policy defrag-own-lease lets the daemon write" $name) -}}
{{- end -}}
{{- $ns := dig "leadership" "lease_namespace" .Release.Namespace .Values.settings -}}
{{- if ne $ns .Release.Namespace -}}
{{- fail (printf "settings.leadership.lease_namespace is %q: it must be the release namespace %q, where the daemon's Role lets it write its Lease (or leave it unset)" $ns .Release.Namespace) -}}
{{- end -}}
{{- end -}}
