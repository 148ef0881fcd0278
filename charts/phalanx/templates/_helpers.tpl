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

{{/* "true" when phalanx-scheduler dials phalanx serve's gRPC across the pod network, over mTLS
(integration=plugin with tls.enabled); "" when it dials it on loopback. */}}
{{- define "phalanx.grpcTLS" -}}
{{- if and .Values.tls.enabled (eq .Values.integration "plugin") }}true{{ end }}
{{- end -}}

{{/* The DNS name of phalanx's Service (tls.enabled). */}}
{{- define "phalanx.serviceHost" -}}
{{ include "phalanx.fullname" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* The phalanx serve container (without volumeMounts); the extender address depends on the shape. */}}
{{/* The Lease serve follows (several replicas, docs/operations.md "Several replicas"): the one its
kube-scheduler elects on — beside it in the pod (mode second) or on the node (mode main); none when
serve runs as its own Deployment (tls.enabled), which has no kube-scheduler beside it. */}}
{{- define "phalanx.leaderLease" -}}
{{- if not .Values.tls.enabled }}
{{- if .Values.serve.leaderLease }}{{ .Values.serve.leaderLease }}
{{- else if eq .Values.mode "main" }}kube-system/kube-scheduler
{{- else }}{{ .Release.Namespace }}/{{ include "phalanx.fullname" . }}-scheduler
{{- end }}
{{- end }}
{{- end -}}

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
  {{- if include "phalanx.grpcTLS" . }}
  - --grpc-addr=0.0.0.0:{{ .Values.serve.grpcPort }}
  - --grpc-tls-cert=/etc/phalanx/tls/tls.crt
  - --grpc-tls-key=/etc/phalanx/tls/tls.key
  - --grpc-client-ca=/etc/phalanx/tls/ca.crt
  {{- else }}
  - --grpc-addr=127.0.0.1:{{ .Values.serve.grpcPort }}
  {{- end }}
  - --health-addr=0.0.0.0:{{ .Values.serve.healthPort }}
  - --barrier-timeout={{ .Values.serve.barrierTimeout }}
  - --plan-ttl={{ .Values.serve.planTTL }}
  - --http-threads={{ .Values.serve.httpThreads }}
  - --solver={{ .Values.serve.solver }}
  - --solver-workers={{ if .Values.serve.solverWorkers }}on{{ else }}off{{ end }}
  - --provisioning={{ .Values.serve.provisioning }}
  {{- if eq .Values.serve.provisioner "karpenter" }}
  - --provisioner=karpenter
  - --karpenter-nodepool={{ .Values.serve.karpenterNodePool }}
  - --provisioning-timeout={{ .Values.serve.provisioningTimeout }}
  {{- end }}
  {{- if .Values.serve.planAhead }}
  - --plan-ahead-for={{ if eq .Values.mode "main" }}default-scheduler{{ else }}{{ .Values.scheduler.name }}{{ end }}
  {{- end }}
  {{- with include "phalanx.leaderLease" . }}
  - --leader-lease={{ . }}
  {{- end }}
  {{- range .Values.serve.extraArgs }}
  - {{ . | quote }}
  {{- end }}
  ports:
  {{- if .Values.tls.enabled }}
  - {name: extender, containerPort: {{ .Values.serve.port }}}
  {{- end }}
  {{- if include "phalanx.grpcTLS" . }}
  - {name: grpc, containerPort: {{ .Values.serve.grpcPort }}}
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

{{/* Plugin mode's KubeSchedulerConfiguration fields: scheduler-config/kube-scheduler-plugin-config.yaml
(read from it, so the chart and the manifests enable the plugin at the same extension points) with
the profile's schedulerName, and the plugin's args: address = phalanx serve's gRPC on loopback, or
with tls.enabled its Service over mTLS (tls: the client Secret's files, mounted at /etc/phalanx/tls),
permitTimeout = serve.barrierTimeout, then plugin.args over them.
include "phalanx.pluginProfile" (list . "default-scheduler") */}}
{{- define "phalanx.pluginProfile" -}}
{{- $root := index . 0 }}
{{- $file := "files/scheduler-config/kube-scheduler-plugin-config.yaml" }}
{{- $cfg := $root.Files.Get $file | fromYaml }}
{{- if not $cfg.profiles }}{{ fail (printf "no profiles in %s" $file) }}{{ end }}
{{- $profile := index $cfg.profiles 0 }}
{{- $_ := set $profile "schedulerName" (index . 1 | default "default-scheduler") }}
{{- $found := false }}
{{- range $profile.pluginConfig }}
{{- if eq .name "Phalanx" }}
{{- $found = true }}
{{- if include "phalanx.grpcTLS" $root }}
{{- $host := include "phalanx.serviceHost" $root }}
{{- $_ := set .args "address" (printf "%s:%v" $host $root.Values.serve.grpcPort) }}
{{- $_ := set .args "tls" (dict "caFile" "/etc/phalanx/tls/ca.crt" "certFile" "/etc/phalanx/tls/tls.crt" "keyFile" "/etc/phalanx/tls/tls.key" "serverName" $host) }}
{{- else }}
{{- $_ := set .args "address" (printf "127.0.0.1:%v" $root.Values.serve.grpcPort) }}
{{- end }}
{{- $_ := set .args "permitTimeout" (printf "%vs" $root.Values.serve.barrierTimeout) }}
{{- $_ := mergeOverwrite .args (deepCopy $root.Values.plugin.args) }}
{{- end }}
{{- end }}
{{- if not $found }}{{ fail (printf "no pluginConfig of Phalanx in %s" $file) }}{{ end }}
{{- toYaml (pick $cfg "clientConnection" "profiles") }}
{{- end -}}

{{/* What kube-scheduler is given after apiVersion and kind: the extender or the plugin, for the
profile named by the second argument ("": the default profile, as kube-scheduler defaults it);
include "phalanx.schedulingConfig" (list . "phalanx") */}}
{{- define "phalanx.schedulingConfig" -}}
{{- $root := index . 0 }}
{{- if eq $root.Values.integration "plugin" }}
{{- include "phalanx.pluginProfile" . }}
{{- else -}}
# phalanx must see every feasible node to plan a whole group (no node sampling)
percentageOfNodesToScore: 100
{{- with index . 1 }}
profiles:
- schedulerName: {{ . }}
{{- end }}
{{ include "phalanx.extender" $root }}
{{- end }}
{{- end -}}

{{/* The configuration of the second scheduler (mode "second"): leader-elected on its own Lease. */}}
{{- define "phalanx.secondConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: {{ include "phalanx.fullname" . }}-scheduler
  resourceNamespace: {{ .Release.Namespace }}
  {{- with .Values.scheduler.leaderElection }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{ include "phalanx.schedulingConfig" (list . .Values.scheduler.name) }}
{{- end -}}

{{/* The binary and image of the scheduler container: kube-scheduler, or phalanx-scheduler in plugin mode. */}}
{{- define "phalanx.schedulerBinary" -}}
{{ ternary "phalanx-scheduler" "kube-scheduler" (eq .Values.integration "plugin") }}
{{- end -}}

{{- define "phalanx.schedulerImage" -}}
{{ ternary .Values.plugin.image .Values.scheduler.image (eq .Values.integration "plugin") }}
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
