{{/* Names, labels and the pieces every workload shares. */}}

{{- define "echelon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>", or the release alone when it already contains the chart name. */}}
{{- define "echelon.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "echelon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A component's object name: (dict "root" $ "component" "membership"). */}}
{{- define "echelon.componentName" -}}
{{- printf "%s-%s" (include "echelon.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels never change after install: name, instance, component. */}}
{{- define "echelon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "echelon.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "echelon.labels" -}}
{{ include "echelon.selectorLabels" . }}
helm.sh/chart: {{ include "echelon.chart" .root }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: echelon
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* registry/repository:tag[@digest] from an image block; the tag defaults to appVersion. */}}
{{- define "echelon.image" -}}
{{- $registry := .image.registry | default .root.Values.image.registry -}}
{{- $ref := printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- if $registry }}{{ $ref = printf "%s/%s" $registry $ref }}{{ end -}}
{{- if .image.digest }}{{ $ref = printf "%s@%s" $ref .image.digest }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/* Every membership replica's stable DNS name and port, comma separated: the
     --peers of membership and the --membership of every other service. */}}
{{- define "echelon.membershipAddresses" -}}
{{- $name := include "echelon.componentName" (dict "root" . "component" "membership") -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.membership.replicas) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.membership.port)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{/* Flags every service shares (services/echelon/cli/main.py service_options); the id and the
     advertised address come from the pod through the downward API. */}}
{{- define "echelon.serviceArgs" -}}
- --id
- {{ .id | quote }}
- --host
- {{ .root.Values.bindHost | quote }}
- --port
- {{ .values.port | int | quote }}
- --advertise
- {{ .advertise | quote }}
- --metrics-port
- {{ .values.metricsPort | int | quote }}
{{- if .root.Values.tls.enabled }}
- --health-port
- {{ .values.healthPort | int | quote }}
{{- end }}
- --grace
- {{ .values.grace | quote }}
- --log-level
- {{ .root.Values.logLevel | quote }}
{{- include "echelon.authArgs" .root }}
{{- end -}}

{{/* The downward API variables the arguments above refer to as $(VAR). */}}
{{- define "echelon.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
{{- include "echelon.tlsEnv" . }}
{{- include "echelon.authEnv" (dict "root" . "client" false) }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Named ports, native gRPC probes on the standard health service (on the plain-text
     health port when TLS is on: the kubelet's gRPC probe speaks no TLS), security context. */}}
{{- define "echelon.serviceContainer" -}}
{{- $tls := .root.Values.tls.enabled -}}
{{- $probe := ternary .values.healthPort .values.port $tls -}}
image: {{ include "echelon.image" (dict "root" .root "image" .root.Values.image) }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
ports:
  - {name: grpc, containerPort: {{ .values.port }}, protocol: TCP}
  - {name: metrics, containerPort: {{ .values.metricsPort }}, protocol: TCP}
  {{- if $tls }}
  - {name: health, containerPort: {{ .values.healthPort }}, protocol: TCP}
  {{- if .clientPort }}
  - {name: grpc-token, containerPort: {{ .clientPort }}, protocol: TCP}
  {{- end }}
  {{- end }}
startupProbe:
  grpc: {port: {{ $probe }}}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  grpc: {port: {{ $probe }}}
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  grpc: {port: {{ $probe }}}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
resources:
  {{- toYaml .values.resources | nindent 2 }}
securityContext:
  {{- toYaml .root.Values.containerSecurityContext | nindent 2 }}
{{- with .root.Values.preStopSeconds }}
# Endpoints and peers stop sending here before the drain begins (SIGTERM after the sleep).
lifecycle:
  preStop:
    sleep: {seconds: {{ . }}}
{{- end }}
volumeMounts:
  - {name: tmp, mountPath: /tmp}
  {{- with .extraMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .root.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- include "echelon.tlsMount" .root | nindent 2 }}
  {{- include "echelon.authMount" .root | nindent 2 }}
{{- end -}}

{{/* Pod settings every workload shares; refuses a termination period the drain does not fit in. */}}
{{- define "echelon.podSpec" -}}
{{- if le (float64 .values.terminationGracePeriodSeconds) (float64 .values.grace) -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must exceed %s.grace (%v): Kubernetes would SIGKILL mid-drain" .component .values.terminationGracePeriodSeconds .component .values.grace) -}}
{{- end -}}
{{- if le (float64 .values.terminationGracePeriodSeconds) (addf .values.grace .root.Values.preStopSeconds) -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must exceed preStopSeconds (%v) plus %s.grace (%v): the preStop sleep counts against it" .component .values.terminationGracePeriodSeconds .root.Values.preStopSeconds .component .values.grace) -}}
{{- end -}}
serviceAccountName: {{ include "echelon.serviceAccountName" . }}
automountServiceAccountToken: {{ .automountToken | default false }}
{{- with .root.Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
enableServiceLinks: false
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if and .values.topologySpreadKey (not .onEveryNode) }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: {{ .values.topologySpreadKey }}
    whenUnsatisfiable: {{ ternary "DoNotSchedule" "ScheduleAnyway" .root.Values.hardSpread }}
    labelSelector:
      matchLabels:
        {{- include "echelon.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end -}}

{{/* Pod annotations: the component's own, and prometheus.io/* for a Prometheus without the operator. */}}
{{- define "echelon.podAnnotations" -}}
{{- $a := dict -}}
{{- if and .root.Values.metrics.podAnnotations (not .root.Values.metrics.serviceMonitor.enabled) -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" (toString .values.metricsPort) -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- /* What the scrape job in files/prometheus/scrape-pods.yaml reads to label an agent as
       the ServiceMonitor does: its id is its node's name; its region is its node's label. */ -}}
{{- if eq .component "agent" -}}
{{- if include "echelon.agentIdFromNode" .root }}{{ $_ := set $a "echelon.io/member-from" "node" }}{{ end -}}
{{- if .root.Values.agent.regionFromNode.enabled }}{{ $_ := set $a "echelon.io/region-from" "node" }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $a = merge (deepCopy (.values.podAnnotations | default dict)) $a -}}
{{- with $a -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A headless Service: stable DNS names for a StatefulSet's pods, and the scrape target. */}}
{{- define "echelon.headlessService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "echelon.labels" . | nindent 4 }}
spec:
  clusterIP: None
  {{- if .publishNotReady }}
  # Replicas resolve each other before they are ready: they sync with their peers first.
  publishNotReadyAddresses: true
  {{- end }}
  selector:
    {{- include "echelon.selectorLabels" . | nindent 4 }}
  ports:
    - {name: grpc, port: {{ .values.port }}, targetPort: grpc, protocol: TCP, appProtocol: grpc}
    - {name: metrics, port: {{ .values.metricsPort }}, targetPort: metrics, protocol: TCP, appProtocol: http}
{{- end -}}

{{/* A ServiceAccount per component, so RBAC can be granted to one component only; with
     serviceAccount.name, one for every component; with serviceAccount.create false, none
     (the pods run as serviceAccount.name, which must exist). */}}
{{- define "echelon.serviceAccount" -}}
{{- $sa := .root.Values.serviceAccount -}}
{{- /* A shared one is created once, with membership (always rendered). */ -}}
{{- if and $sa.create (or (not $sa.name) (eq .component "membership")) -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "echelon.serviceAccountName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "echelon.labels" . | nindent 4 }}
  {{- with $sa.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: false
{{- end -}}
{{- end -}}

{{/* The ServiceAccount a component's pods run as (dict "root" $ "component" "agent"). */}}
{{- define "echelon.serviceAccountName" -}}
{{- $sa := .root.Values.serviceAccount -}}
{{- if $sa.name -}}{{ $sa.name }}
{{- else if $sa.create -}}{{ include "echelon.componentName" (dict "root" .root "component" (.serviceAccount | default .component)) }}
{{- else -}}default
{{- end -}}
{{- end -}}

{{/* Labels every pod carries besides the chart's (values podLabels; never in selectors). */}}
{{- define "echelon.podLabels" -}}
{{- with .root.Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes every service pod gets besides its own (values extraVolumes). */}}
{{- define "echelon.extraVolumes" -}}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "echelon.pdb" -}}
{{- if .values.pdb.enabled -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "echelon.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "echelon.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .values.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "echelon.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* TLS (docs/security.md, contract/transport.py): every pod gets its own certificate naming
     spiffe://echelon/<role>/<member id>, mounted read-only at /etc/echelon/tls as
     tls.crt, tls.key, ca.crt (the services read ECHELON_TLS_DIR and reload the files when
     they change). With cert-manager the csi-driver issues and renews one per pod (its
     variables give the pod's name, which is the member id); with Secrets every pod of a
     component mounts the component's Secret. (dict "root" $ "role" "agent" "component" "agent") */}}
{{- define "echelon.tlsVolume" -}}
{{- $tls := .root.Values.tls -}}
{{- if $tls.enabled }}
- name: tls
{{- if eq $tls.source "certManager" }}
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ include "echelon.tlsIssuerName" .root | quote }}
      csi.cert-manager.io/issuer-kind: {{ $tls.certManager.issuerRef.kind | default "Issuer" | quote }}
      csi.cert-manager.io/issuer-group: {{ $tls.certManager.issuerRef.group | default "cert-manager.io" | quote }}
      csi.cert-manager.io/uri-sans: {{ printf "spiffe://echelon/%s/${POD_NAME}" .role | quote }}
      csi.cert-manager.io/dns-names: {{ join "," (concat (list "echelon") (.dnsNames | default list)) | quote }}
      csi.cert-manager.io/duration: {{ $tls.certManager.duration | quote }}
      csi.cert-manager.io/renew-before: {{ $tls.certManager.renewBefore | quote }}
      csi.cert-manager.io/key-usages: "digital signature,key encipherment,server auth,client auth"
      csi.cert-manager.io/fs-group: {{ .root.Values.podSecurityContext.fsGroup | toString | quote }}
{{- else }}
  secret:
    secretName: {{ required (printf "tls.secrets.%s: the Secret with this component's tls.crt, tls.key and ca.crt" (.secretKey | default .role)) (get $tls.secrets (.secretKey | default .role)) }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end -}}

{{- define "echelon.tlsMount" -}}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: /etc/echelon/tls, readOnly: true}
{{- end }}
{{- end -}}

{{- define "echelon.tlsEnv" -}}
{{- if .Values.tls.enabled }}
- {name: ECHELON_TLS_DIR, value: /etc/echelon/tls}
{{- end }}
{{- end -}}

{{/* The issuer that signs the pods' certificates: the user's, or the chart's own CA issuer. */}}
{{- define "echelon.tlsIssuerName" -}}
{{- .Values.tls.certManager.issuerRef.name | default (include "echelon.componentName" (dict "root" . "component" "ca")) -}}
{{- end -}}

{{/* Client identity and ACLs (docs/security.md, services/echelon/runtime/auth.py): the services' flags
     (secrets go in the environment, echelon.authEnv; the tokens file is mounted). With
     TLS and `helm test`, the test pod's certificate user is a superuser: a certificate
     wins over a token, and the test creates a topic. */}}
{{- define "echelon.authArgs" -}}
{{- $a := .Values.auth -}}
{{- if ne $a.mode "none" }}
{{- if and (eq $a.mode "tokens") (not $a.tokensSecret) }}{{ fail "auth.mode tokens needs auth.tokensSecret: a Secret whose key tokens.json is the tokens file" }}{{ end }}
{{- if and (not .Values.tls.enabled) (not $a.memberToken.secretName) }}{{ fail "auth without tls needs auth.memberToken.secretName: the token the services call each other with" }}{{ end }}
- --auth
- {{ $a.mode | quote }}
{{- if $a.tokensSecret }}
- --tokens-file
- /etc/echelon/auth/tokens.json
{{- end }}
{{- if eq $a.mode "jwt" }}
- --jwks
- {{ required "auth.jwt.jwksUrl: the identity provider's JWKS URL" $a.jwt.jwksUrl | quote }}
- --jwt-audience
- {{ $a.jwt.audience | quote }}
{{- with $a.jwt.issuer }}
- --jwt-issuer
- {{ . | quote }}
{{- end }}
{{- end }}
{{- $super := $a.superusers -}}
{{- if and .Values.tls.enabled .Values.tests.enabled }}{{ $super = append $super (include "echelon.componentName" (dict "root" . "component" "test")) }}{{ end -}}
{{- with $super }}
- --superusers
- {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- with $a.limits }}
- --limits
- {{ . | quote }}
{{- end }}
{{- with $a.identityCaps }}
- --identity-caps
- {{ toJson . | quote }}
{{- end }}
{{- end -}}

{{/* A token from a Secret: the services' member token, or (client: true) the cluster
     admin's token the routing job and the test pod send. (dict "root" $ "client" bool) */}}
{{- define "echelon.authEnv" -}}
{{- $a := .root.Values.auth -}}
{{- $ref := ternary $a.clientToken $a.memberToken .client -}}
{{- if and (ne $a.mode "none") $ref.secretName }}
- name: {{ ternary "ECHELON_TOKEN" "ECHELON_MEMBER_TOKEN" .client }}
  valueFrom: {secretKeyRef: {name: {{ $ref.secretName | quote }}, key: {{ $ref.key | quote }}}}
{{- end }}
{{- end -}}

{{- define "echelon.authVolume" -}}
{{- if and (ne .Values.auth.mode "none") .Values.auth.tokensSecret }}
- name: auth
  secret: {secretName: {{ .Values.auth.tokensSecret | quote }}, defaultMode: 0440}
{{- end }}
{{- end -}}

{{- define "echelon.authMount" -}}
{{- if and (ne .Values.auth.mode "none") .Values.auth.tokensSecret }}
- {name: auth, mountPath: /etc/echelon/auth, readOnly: true}
{{- end }}
{{- end -}}

{{/* "true" when an agent's id is its node's name (a DaemonSet, unless cert-manager issues
     per-pod certificates, which name the pod); empty otherwise. */}}
{{- define "echelon.agentIdFromNode" -}}
{{- if and (eq .Values.agent.kind "DaemonSet") (not (and .Values.tls.enabled (eq .Values.tls.source "certManager"))) -}}true{{- end -}}
{{- end -}}
