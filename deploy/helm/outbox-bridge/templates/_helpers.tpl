{{/* Names and labels shared by every template. */}}

{{- define "outbox-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, unless the release name already contains the chart
name; cut to leave room for the longest suffix ("-consume", "-migrate"). */}}
{{- define "outbox-bridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "outbox-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-bridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "outbox-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: outbox-bridge
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "outbox-bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The workloads of this release: the bridge commands its Deployments
run. With delivery.fastLane there is no consume stage: `bridge consume`
refuses to start with WEBHOOK_FAST_LANE=true, since deliver reads the topics
itself. */}}
{{- define "outbox-bridge.stages" -}}
{{- $out := list -}}
{{- if eq .Values.mode "run" -}}
{{- $out = append $out "run" -}}
{{- else if eq .Values.mode "stages" -}}
{{- range $s := list "relay" "consume" "deliver" -}}
{{- if and (index $.Values $s).enabled (not (and (eq $s "consume") $.Values.delivery.fastLane)) -}}
{{- $out = append $out $s -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- fail (printf "mode must be stages or run, not %q" .Values.mode) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Whether stage (a string, in .stage) serves the admin API. */}}
{{- define "outbox-bridge.servesAdmin" -}}
{{- if .root.Values.secrets.adminToken.name -}}
{{- if or (eq .stage "run") (eq .stage .root.Values.admin.stage) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether stage delivers webhooks (and so needs the secret key ring). */}}
{{- define "outbox-bridge.delivers" -}}
{{- if or (eq .stage "run") (eq .stage "deliver") -}}true{{- end -}}
{{- end -}}

{{/* Whether stage talks to Kafka (and so gets the SASL credentials and the
TLS Secret): every stage but deliver, and deliver too with
delivery.fastLane (a member of the consumer group). */}}
{{- define "outbox-bridge.usesKafka" -}}
{{- if or (ne .stage "deliver") .root.Values.delivery.fastLane -}}true{{- end -}}
{{- end -}}

{{/* Whether stage is a member of the consumer group: consume, deliver with
delivery.fastLane, run. */}}
{{- define "outbox-bridge.groupMember" -}}
{{- if or (eq .stage "consume") (eq .stage "run") (and (eq .stage "deliver") .root.Values.delivery.fastLane) -}}true{{- end -}}
{{- end -}}

{{/* Checks of the values that Kubernetes would accept but the bridge could
not use; they fail the render with a message naming the field. */}}
{{- define "outbox-bridge.validate" -}}
{{- $v := .Values -}}
{{- if not $v.secrets.database.name -}}
{{- fail "secrets.database.name: the Secret holding DATABASE_URL is required" -}}
{{- end -}}
{{- if not (kindIs "bool" $v.delivery.fastLane) -}}
{{- fail (printf "delivery.fastLane must be true or false, not %v" $v.delivery.fastLane) -}}
{{- end -}}
{{- if not (has $v.admin.stage (list "relay" "consume" "deliver")) -}}
{{- fail (printf "admin.stage must be relay, consume or deliver, not %q" $v.admin.stage) -}}
{{- end -}}
{{- if and $v.delivery.fastLane (eq $v.mode "stages") (eq $v.admin.stage "consume") $v.secrets.adminToken.name -}}
{{- fail "admin.stage=consume: delivery.fastLane runs no consume stage; serve the admin API from deliver or relay" -}}
{{- end -}}
{{- $stages := include "outbox-bridge.stages" . | fromJsonArray -}}
{{- if not $stages -}}
{{- fail "no stage is enabled: enable relay, consume or deliver (or set mode: run)" -}}
{{- end -}}
{{- if and (or (has "deliver" $stages) (has "run" $stages) $v.secrets.adminToken.name) (not $v.secrets.secretKeys.name) (ne (toString (index $v.config "BRIDGE_ALLOW_PLAINTEXT_SECRETS" | default "")) "true") -}}
{{- fail "secrets.secretKeys.name: the Secret holding BRIDGE_SECRET_KEYS is required (deliver and the admin API encrypt the webhook signing secrets with it); config.BRIDGE_ALLOW_PLAINTEXT_SECRETS: \"true\" stores them in plain text instead (not for production)" -}}
{{- end -}}
{{- $kafkaStages := list -}}
{{- $members := list -}}
{{- range $s := $stages -}}
{{- if include "outbox-bridge.usesKafka" (dict "root" $ "stage" $s) -}}
{{- $kafkaStages = append $kafkaStages $s -}}
{{- end -}}
{{- if include "outbox-bridge.groupMember" (dict "root" $ "stage" $s) -}}
{{- $members = append $members $s -}}
{{- end -}}
{{- end -}}
{{- if and $kafkaStages (not $v.kafka.brokers) -}}
{{- fail (ternary "kafka.brokers: relay and deliver (delivery.fastLane) need at least one broker" "kafka.brokers: relay and consume need at least one broker" $v.delivery.fastLane) -}}
{{- end -}}
{{- if and $members (not $v.consume.topics) -}}
{{- fail (ternary "consume.topics: deliver (delivery.fastLane) reads the consumer group's topics and needs at least one" "consume.topics: the consumer needs at least one topic" $v.delivery.fastLane) -}}
{{- end -}}
{{- if and $v.kafka.sasl.mechanism (not $v.secrets.kafkaSasl.name) -}}
{{- fail "secrets.kafkaSasl.name: kafka.sasl.mechanism is set, so the Secret with the SASL credentials is required" -}}
{{- end -}}
{{- if and $v.kafka.tls.secretName (not $v.kafka.tls.enabled) -}}
{{- fail "kafka.tls.secretName is set but kafka.tls.enabled is false" -}}
{{- end -}}
{{- if ne (empty $v.kafka.tls.certKey) (empty $v.kafka.tls.keyKey) -}}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey must be set together" -}}
{{- end -}}
{{- if and $v.kafka.tls.certKey (not $v.kafka.tls.secretName) -}}
{{- fail "kafka.tls.certKey needs kafka.tls.secretName" -}}
{{- end -}}
{{- $partitions := int $v.kafka.partitions -}}
{{- if lt $partitions 1 -}}
{{- fail "kafka.partitions must be at least 1" -}}
{{- end -}}
{{- if gt (int $v.relay.replicas) 64 -}}
{{- fail (printf "relay.replicas=%v: the relay has 64 lanes, a replica beyond that would hold none" $v.relay.replicas) -}}
{{- end -}}
{{- if gt (int $v.relay.autoscaling.maxReplicas) 64 -}}
{{- fail (printf "relay.autoscaling.maxReplicas=%v: the relay has 64 lanes" $v.relay.autoscaling.maxReplicas) -}}
{{- end -}}
{{- if and $v.delivery.fastLane (has "deliver" $stages) (gt (int $v.deliver.replicas) $partitions) -}}
{{- fail (printf "deliver.replicas=%v exceeds kafka.partitions=%v: with delivery.fastLane each deliverer is a member of the consumer group, which gives each partition to one member" $v.deliver.replicas $partitions) -}}
{{- end -}}
{{- if gt (int $v.consume.replicas) $partitions -}}
{{- fail (printf "consume.replicas=%v exceeds kafka.partitions=%v: a consumer group gives each partition to one member, the rest would idle" $v.consume.replicas $partitions) -}}
{{- end -}}
{{- if gt (int $v.consume.autoscaling.maxReplicas) $partitions -}}
{{- fail (printf "consume.autoscaling.maxReplicas=%v exceeds kafka.partitions=%v" $v.consume.autoscaling.maxReplicas $partitions) -}}
{{- end -}}
{{- if and (eq $v.mode "run") (gt (int $v.run.replicas) (min 64 $partitions)) -}}
{{- fail (printf "run.replicas=%v exceeds what its relay (64 lanes) and consumer (kafka.partitions=%v) parts can use" $v.run.replicas $partitions) -}}
{{- end -}}
{{- range $s := list "relay" "consume" "deliver" -}}
{{- $a := (index $v $s).autoscaling -}}
{{- if and $a.enabled (gt (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- fail (printf "%s.autoscaling: minReplicas %v is above maxReplicas %v" $s $a.minReplicas $a.maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- if and $v.consume.autoscaling.enabled (not $v.consume.autoscaling.topic) (hasPrefix "~" (first $v.consume.topics)) -}}
{{- fail "consume.autoscaling.topic: the first of consume.topics is a regular expression; name the topic KEDA should read the lag of" -}}
{{- end -}}
{{- if and $v.delivery.fastLane $v.deliver.autoscaling.enabled (not $v.deliver.autoscaling.topic) (hasPrefix "~" (first $v.consume.topics)) -}}
{{- fail "deliver.autoscaling.topic: the first of consume.topics is a regular expression; name the topic KEDA should read the lag of" -}}
{{- end -}}
{{- if lt (int $v.deliver.shutdownGrace) 1 -}}
{{- fail "deliver.shutdownGrace must be at least 1 (seconds)" -}}
{{- end -}}
{{- /* SIGTERM → drain: the deliverer's grace, then up to 5 s for each of
the ops server's and the telemetry's shutdown. SIGKILL before that
cancels requests in flight and charges nothing, but loses spans and
metrics and leaves leases to expire. */ -}}
{{- $drain := add (int $v.deliver.shutdownGrace) 10 -}}
{{- if le (int $v.terminationGracePeriodSeconds) $drain -}}
{{- fail (printf "terminationGracePeriodSeconds=%v must be above the drain (deliver.shutdownGrace %v s + 10 s of shutdown steps = %v s)" $v.terminationGracePeriodSeconds $v.deliver.shutdownGrace $drain) -}}
{{- end -}}
{{- range $k, $_ := $v.config -}}
{{- if or (has $k (list "HTTP_ADDR" "DATABASE_URL" "DATABASE_MAX_CONNS" "DATABASE_CONNECT_TIMEOUT" "CONSUMER_TOPICS" "CONSUMER_GROUP" "WEBHOOK_SHUTDOWN_GRACE" "WEBHOOK_FAST_LANE" "ADMIN_TOKEN" "BRIDGE_SECRET_KEYS")) (hasPrefix "KAFKA_" $k) -}}
{{- fail (printf "config.%s: the chart sets this variable from its own field (see values.yaml)" $k) -}}
{{- end -}}
{{- end -}}
{{- /* One setting for every stage: a deliverer on the fast lane beside a
consumer (or the reverse) would split the group's partitions between the
two paths. */ -}}
{{- range $s := list "relay" "consume" "deliver" "run" -}}
{{- if hasKey (index $v $s).env "WEBHOOK_FAST_LANE" -}}
{{- fail (printf "%s.env.WEBHOOK_FAST_LANE: the chart sets it for every stage from delivery.fastLane" $s) -}}
{{- end -}}
{{- end -}}
{{- end -}}
