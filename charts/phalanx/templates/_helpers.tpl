{{/* The name every object starts with: the release name, or <release>-phalanx. */}}
{{- define "phalanx.fullname" -}}
{{- if contains "phalanx" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-phalanx" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "phalanx.labels" -}}
app.kubernetes.io/name: phalanx
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "phalanx.selector" (list . "scheduler") */}}
{{- define "phalanx.selector" -}}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "phalanx.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The DNS name of phalanx's Service (tls.enabled). */}}
{{- define "phalanx.serviceHost" -}}
{{ include "phalanx.fullname" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* The phalanx serve container (without volumeMounts); the extender address depends on the shape. */}}
{{- define "phalanx.serveContainer" -}}
- name: phalanx
  image: {{ include "phalanx.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
  - serve
  - --kubeconfig=in-cluster
  {{- if .Values.tls.enabled }}
  - --http-addr=0.0.0.0:{{ .Values.serve.port }}
  - --tls-cert=/etc/phalanx/tls/tls.crt
  - --tls-key=/etc/phalanx/tls/tls.key
  - --client-ca=/etc/phalanx/tls/ca.crt
  {{- else }}
  - --http-addr=127.0.0.1:{{ .Values.serve.port }}
  {{- end }}
  - --health-addr=0.0.0.0:{{ .Values.serve.healthPort }}
  - --barrier-timeout={{ .Values.serve.barrierTimeout }}
  - --plan-ttl={{ .Values.serve.planTTL }}
  - --http-threads={{ .Values.serve.httpThreads }}
  - --solver={{ .Values.serve.solver }}
  {{- range .Values.serve.extraArgs }}
  - {{ . | quote }}
  {{- end }}
  ports:
  {{- if .Values.tls.enabled }}
  - {name: extender, containerPort: {{ .Values.serve.port }}}
  {{- end }}
  - {name: health, containerPort: {{ .Values.serve.healthPort }}}
  # phalanx lists the cluster before it serves (at most 120 s; then it serves and /readyz says why)
  startupProbe:
    httpGet: {path: /healthz, port: health}
    periodSeconds: 5
    failureThreshold: 30
  livenessProbe:
    httpGet: {path: /healthz, port: health}
  readinessProbe:
    httpGet: {path: /readyz, port: health}
  resources:
    {{- toYaml .Values.serve.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
{{- end -}}

{{/* The KubeSchedulerConfiguration's extender entry: loopback, or mTLS to the Service. */}}
{{- define "phalanx.extender" -}}
extenders:
{{- if .Values.tls.enabled }}
- urlPrefix: "https://{{ include "phalanx.serviceHost" . }}:{{ .Values.serve.port }}/scheduler"
  enableHTTPS: true
  tlsConfig:
    caFile: /etc/phalanx/tls/ca.crt
    certFile: /etc/phalanx/tls/tls.crt
    keyFile: /etc/phalanx/tls/tls.key
    serverName: {{ include "phalanx.serviceHost" . }}
{{- else }}
- urlPrefix: "http://127.0.0.1:{{ .Values.serve.port }}/scheduler"
  enableHTTPS: false
{{- end }}
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: 1
  bindVerb: bind
  preemptVerb: preempt
  # must exceed --barrier-timeout: gang members wait at bind for each other
  httpTimeout: {{ mul 2 .Values.serve.barrierTimeout }}s
  nodeCacheCapable: true
  ignorable: false
  managedResources: []
{{- end -}}

{{/* The rules of a ClusterRole in one of scheduler-config/'s files, so the chart and the kustomize
manifests grant the same: include "phalanx.rules" (list . "rbac.yaml" "phalanx-scheduler") */}}
{{- define "phalanx.rules" -}}
{{- $root := index . 0 }}{{ $file := index . 1 }}{{ $name := index . 2 }}
{{- $found := list }}
{{- range ($root.Files.Get (printf "files/scheduler-config/%s" $file) | splitList "\n---\n") }}
{{- $doc := fromYaml . }}
{{- if and (eq (default "" $doc.kind) "ClusterRole") (eq $doc.metadata.name $name) }}{{ $found = $doc.rules }}{{ end }}
{{- end }}
{{- if not $found }}{{ fail (printf "no ClusterRole %s in scheduler-config/%s" $name $file) }}{{ end }}
{{- toYaml $found }}
{{- end -}}
