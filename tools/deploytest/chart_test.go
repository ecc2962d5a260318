package deploytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// `helm lint --strict` for every values set: errors and warnings fail.
func TestHelmLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range valueSets {
		t.Run(setName(file), func(t *testing.T) {
			linter := lint.AllWithKubeVersion(chartDir, valuesFile(t, file), namespace, kv)
			for _, msg := range linter.Messages {
				if msg.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", msg)
				} else {
					t.Logf("helm lint: %s", msg)
				}
			}
		})
	}
}

// objects holds every rendered manifest decoded into its published Go type.
type objects struct {
	configMaps      []*corev1.ConfigMap
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	jobs            []*batchv1.Job
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	scaledObjects   []*kedav1alpha1.ScaledObject
}

// decodeStrict decodes one manifest into its type, rejecting unknown and
// duplicate fields (sigs.k8s.io/yaml's strict mode: a misspelt or misplaced
// field is an error here instead of something the API server silently
// drops).
func decodeStrict(m manifest, into any) error {
	if err := yaml.UnmarshalStrict(m.YAML, into); err != nil {
		return fmt.Errorf("%s (%s %s): %v", m.Source, m.Kind, m.Name, err)
	}
	return nil
}

func decodeAll(t *testing.T, ms []manifest) objects {
	t.Helper()
	var o objects
	for _, m := range ms {
		var err error
		switch m.APIVersion + " " + m.Kind {
		case "v1 ConfigMap":
			x := &corev1.ConfigMap{}
			err = decodeStrict(m, x)
			o.configMaps = append(o.configMaps, x)
		case "apps/v1 Deployment":
			x := &appsv1.Deployment{}
			err = decodeStrict(m, x)
			o.deployments = append(o.deployments, x)
		case "v1 Service":
			x := &corev1.Service{}
			err = decodeStrict(m, x)
			o.services = append(o.services, x)
		case "batch/v1 Job":
			x := &batchv1.Job{}
			err = decodeStrict(m, x)
			o.jobs = append(o.jobs, x)
		case "policy/v1 PodDisruptionBudget":
			x := &policyv1.PodDisruptionBudget{}
			err = decodeStrict(m, x)
			o.pdbs = append(o.pdbs, x)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			x := &monitoringv1.ServiceMonitor{}
			err = decodeStrict(m, x)
			o.serviceMonitors = append(o.serviceMonitors, x)
		case "keda.sh/v1alpha1 ScaledObject":
			x := &kedav1alpha1.ScaledObject{}
			err = decodeStrict(m, x)
			o.scaledObjects = append(o.scaledObjects, x)
		default:
			err = fmt.Errorf("%s: %s %s is a kind this test does not decode; add it", m.Source, m.APIVersion, m.Kind)
		}
		if err != nil {
			t.Error(err)
		}
	}
	return o
}

// Every manifest decodes strictly into k8s.io/api, the Prometheus Operator's
// or KEDA's types, and its metadata passes apimachinery's validation (names
// are DNS subdomains within length, labels and annotations are valid).
func TestManifestsDecodeStrictly(t *testing.T) {
	for _, file := range valueSets {
		t.Run(setName(file), func(t *testing.T) {
			ms := mustRender(t, file)
			seen := map[string]bool{}
			for _, m := range ms {
				key := m.Kind + "/" + m.Name
				if seen[key] {
					t.Errorf("%s is rendered twice", key)
				}
				seen[key] = true
				var obj struct {
					Metadata metav1.ObjectMeta `json:"metadata"`
				}
				if err := yaml.Unmarshal(m.YAML, &obj); err != nil {
					t.Fatal(err)
				}
				// Namespaced, named as Helm would (it sets the namespace).
				obj.Metadata.Namespace = namespace
				for _, e := range apivalidation.ValidateObjectMeta(&obj.Metadata, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata")) {
					t.Errorf("%s %s: %v", m.Kind, m.Name, e)
				}
				if m.Kind == "Service" || m.Kind == "Deployment" {
					// Services and the pods' names derive from these: DNS labels.
					for _, e := range apivalidation.NameIsDNS1035Label(m.Name, false) {
						t.Errorf("%s %s: %s", m.Kind, m.Name, e)
					}
				}
			}
			decodeAll(t, ms)
		})
	}
}

// The strict decoder is strict: a field Kubernetes does not know fails.
func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	bad := manifest{Source: "test", Kind: "Deployment", YAML: []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n")}
	if err := decodeStrict(bad, &appsv1.Deployment{}); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("unknown field spec.replica: got %v, want an error naming it", err)
	}
	bad = manifest{Source: "test", Kind: "ScaledObject", YAML: []byte("apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata:\n  name: x\nspec:\n  scaleTargetRef: {name: y}\n  maxReplicas: 3\n  triggers: []\n")}
	if err := decodeStrict(bad, &kedav1alpha1.ScaledObject{}); err == nil || !strings.Contains(err.Error(), "maxReplicas") {
		t.Errorf("unknown field spec.maxReplicas: got %v, want an error naming it", err)
	}
}

func podLabels(d *appsv1.Deployment) labels.Set { return d.Spec.Template.Labels }

func selects(t *testing.T, sel *metav1.LabelSelector, set labels.Set) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(set)
}

func component(labels map[string]string) string { return labels["app.kubernetes.io/component"] }

// The structure a stage needs: its command, probes on /healthz and /readyz,
// resource requests, a PodDisruptionBudget and a Service selecting exactly
// its pods, a termination grace above the drain, a migration hook.
func TestChartStructure(t *testing.T) {
	wantStages := map[string][]string{
		"defaults":               {"deliver", "relay"},
		"all-options":            {"deliver", "relay"},
		"run-mode":               {"run"},
		"row-engine":             {"consume", "deliver", "relay"},
		"all-options+row-engine": {"consume", "deliver", "relay"},
	}
	for _, file := range valueSets {
		t.Run(setName(file), func(t *testing.T) {
			o := decodeAll(t, mustRender(t, file))
			var stages []string
			for _, d := range o.deployments {
				stage := component(d.Labels)
				stages = append(stages, stage)
				for _, e := range metav1validation.ValidateLabelSelector(d.Spec.Selector, metav1validation.LabelSelectorValidationOptions{}, field.NewPath("spec.selector")) {
					t.Errorf("%s: %v", d.Name, e)
				}
				if !selects(t, d.Spec.Selector, podLabels(d)) {
					t.Errorf("%s: selector %v does not match its pod labels %v", d.Name, d.Spec.Selector, podLabels(d))
				}
				pod := d.Spec.Template.Spec
				if len(pod.Containers) != 1 {
					t.Fatalf("%s: %d containers", d.Name, len(pod.Containers))
				}
				c := pod.Containers[0]
				if !slices.Equal(c.Args, []string{stage}) {
					t.Errorf("%s runs %v, want [%s]", d.Name, c.Args, stage)
				}
				checkProbe(t, d.Name+" liveness", c.LivenessProbe, "/healthz")
				checkProbe(t, d.Name+" readiness", c.ReadinessProbe, "/readyz")
				checkProbe(t, d.Name+" startup", c.StartupProbe, "/healthz")
				if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
					t.Errorf("%s: no cpu/memory requests: %v", d.Name, c.Resources.Requests)
				}
				if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
					t.Errorf("%s: root filesystem is writable", d.Name)
				}
				if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
					t.Errorf("%s: may run as root", d.Name)
				}
				env := stageEnv(t, o, d)
				grace, err := time.ParseDuration(env["WEBHOOK_SHUTDOWN_GRACE"])
				if err != nil {
					t.Fatalf("%s: WEBHOOK_SHUTDOWN_GRACE=%q: %v", d.Name, env["WEBHOOK_SHUTDOWN_GRACE"], err)
				}
				// The drain: the deliverer's grace, then the ops server's and
				// the telemetry's shutdown (5 s each, internal/cli).
				drain := grace + 10*time.Second
				if pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second <= drain {
					t.Errorf("%s: terminationGracePeriodSeconds %v is not above the drain (%v)", d.Name, pod.TerminationGracePeriodSeconds, drain)
				}
				// The port the probes use is where the bridge listens.
				if port := c.Ports[0].ContainerPort; !strings.HasSuffix(env["HTTP_ADDR"], ":"+strconv.Itoa(int(port))) || !strings.HasPrefix(env["HTTP_ADDR"], "0.0.0.0:") {
					t.Errorf("%s: HTTP_ADDR=%q but the container port is %d", d.Name, env["HTTP_ADDR"], port)
				}

				// One PDB, one metrics Service, selecting exactly this stage.
				var pdbs, svcs int
				for _, p := range o.pdbs {
					if selects(t, p.Spec.Selector, podLabels(d)) {
						pdbs++
						if (p.Spec.MaxUnavailable == nil) == (p.Spec.MinAvailable == nil) {
							t.Errorf("PDB %s: exactly one of maxUnavailable and minAvailable", p.Name)
						}
					}
				}
				for _, s := range o.services {
					if component(s.Labels) == "admin" {
						continue
					}
					if labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels(d)) {
						svcs++
						// Scraped while not ready (Kafka or PostgreSQL down is
						// when the metrics matter most).
						if !s.Spec.PublishNotReadyAddresses {
							t.Errorf("Service %s drops not-ready pods from its endpoints: Prometheus would stop scraping them in an outage", s.Name)
						}
						if s.Spec.Ports[0].TargetPort.StrVal != c.Ports[0].Name {
							t.Errorf("Service %s targets %v, the container's port is %q", s.Name, s.Spec.Ports[0].TargetPort, c.Ports[0].Name)
						}
					}
				}
				if pdbs != 1 || svcs != 1 {
					t.Errorf("%s: %d PodDisruptionBudgets and %d Services select its pods, want 1 and 1", d.Name, pdbs, svcs)
				}
				// No two stages share pods.
				for _, other := range o.deployments {
					if other != d && selects(t, other.Spec.Selector, podLabels(d)) {
						t.Errorf("%s's selector matches %s's pods", other.Name, d.Name)
					}
				}
			}
			slices.Sort(stages)
			if want := wantStages[setName(file)]; !slices.Equal(stages, want) {
				t.Errorf("stages %v, want %v", stages, want)
			}

			// The migration: a pre-install and pre-upgrade hook running
			// `bridge migrate` with the database Secret, never restarted
			// in place.
			if len(o.jobs) != 1 {
				t.Fatalf("%d Jobs, want the migration", len(o.jobs))
			}
			j := o.jobs[0]
			hooks := strings.Split(j.Annotations["helm.sh/hook"], ",")
			if !slices.Contains(hooks, "pre-install") || !slices.Contains(hooks, "pre-upgrade") {
				t.Errorf("migration Job hooks %v, want pre-install and pre-upgrade", hooks)
			}
			jc := j.Spec.Template.Spec.Containers[0]
			if !slices.Equal(jc.Args, []string{"migrate"}) || j.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("migration Job runs %v with restartPolicy %s", jc.Args, j.Spec.Template.Spec.RestartPolicy)
			}
			if len(jc.EnvFrom) != 0 {
				t.Errorf("the migration hook reads %v: a pre-install hook runs before the chart's ConfigMap exists", jc.EnvFrom)
			}

			// The ServiceMonitor scrapes every stage's Service, on a port
			// those Services have, with the job label the alerts use.
			for _, sm := range o.serviceMonitors {
				var scraped []string
				for _, s := range o.services {
					if selects(t, &sm.Spec.Selector, s.Labels) {
						scraped = append(scraped, component(s.Labels))
						for _, ep := range sm.Spec.Endpoints {
							if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
								t.Errorf("ServiceMonitor port %q: Service %s has no such port", ep.Port, s.Name)
							}
						}
						if s.Labels[sm.Spec.JobLabel] != "outbox-bridge" {
							t.Errorf("Service %s: job label %s=%q, the alert rules select job=\"outbox-bridge\"", s.Name, sm.Spec.JobLabel, s.Labels[sm.Spec.JobLabel])
						}
					}
				}
				slices.Sort(scraped)
				if !slices.Equal(scraped, stages) {
					t.Errorf("ServiceMonitor scrapes %v, want every stage %v (and not the admin Service)", scraped, stages)
				}
			}
		})
	}
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: no HTTP probe", what)
		return
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.StrVal != "http" {
		t.Errorf("%s probe: %s on %v, want %s on the http port", what, p.HTTPGet.Path, p.HTTPGet.Port, path)
	}
}

// stageEnv is what the bridge process of d sees: its ConfigMap (envFrom)
// overlaid with its own env, a secretKeyRef standing for a plausible value
// of that variable.
func stageEnv(t *testing.T, o objects, d *appsv1.Deployment) map[string]string {
	t.Helper()
	env := map[string]string{}
	c := d.Spec.Template.Spec.Containers[0]
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Fatalf("%s: envFrom %v is not a ConfigMap", d.Name, from)
		}
		i := slices.IndexFunc(o.configMaps, func(cm *corev1.ConfigMap) bool { return cm.Name == from.ConfigMapRef.Name })
		if i < 0 {
			t.Fatalf("%s: envFrom ConfigMap %q is not rendered", d.Name, from.ConfigMapRef.Name)
		}
		for k, v := range o.configMaps[i].Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = secretPlaceholder(e.Name)
		default:
			t.Errorf("%s: %s comes from %v; the chart reads only Secrets", d.Name, e.Name, e.ValueFrom)
		}
	}
	return env
}

func secretPlaceholder(name string) string {
	switch name {
	case "DATABASE_URL":
		return "postgres://bridge:secret@db.example:5432/bridge?sslmode=require"
	case "BRIDGE_SECRET_KEYS":
		// A key ring of the documented format (config.Load parses it).
		return "k2:cGxhY2Vob2xkZXIta2V5LXR3by10aGlydHktdHdvLWI=,k1:cGxhY2Vob2xkZXIta2V5LW9uZS10aGlydHktdHdvLWI="
	default:
		return "placeholder-" + strings.ToLower(name) + "-0123456789abcdef"
	}
}

// pendingVars are variables the chart sets for a feature another part of the
// bridge is adding; config.Vars gains them when it lands, and then they are
// checked like the rest (this map may then be emptied).
var pendingVars = map[string]string{}

type checkEnv struct {
	Name    string            `json:"name"`
	Command string            `json:"command"`
	Env     map[string]string `json:"env"`
}

type checkResponse struct {
	Vars        []string `json:"vars"`
	TracingVars []string `json:"tracing_vars"`
	Results     []struct {
		Name  string `json:"name"`
		Error string `json:"error"`
	} `json:"results"`
}

// configCheck runs internal/config/configcheck in the bridge's own module
// (not imported: this module's go.mod stays independent of the bridge's):
// the variables the bridge reads, and whether each environment loads as its
// command would load it.
func configCheck(t *testing.T, envs []checkEnv) checkResponse {
	t.Helper()
	req, err := json.Marshal(map[string]any{"environments": envs})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./internal/config/configcheck")
	cmd.Dir = root
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run ./internal/config/configcheck: %v\n%s", err, stderr.String())
	}
	var resp checkResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("configcheck answered %s: %v", out, err)
	}
	if len(resp.Vars) == 0 || len(resp.Results) != len(envs) {
		t.Fatalf("configcheck answered %s", out)
	}
	return resp
}

// Every variable the chart sets is one the bridge reads (internal/config,
// as internal/composetest checks the compose file), and each workload's whole
// environment loads through config.Load as its command would load it.
func TestChartEnvironment(t *testing.T) {
	type setter struct{ who, name string }
	var sets []setter
	var envs []checkEnv
	for _, file := range valueSets {
		o := decodeAll(t, mustRender(t, file))
		set := setName(file)
		for _, cm := range o.configMaps {
			for k := range cm.Data {
				sets = append(sets, setter{set + ": ConfigMap " + cm.Name, k})
			}
		}
		for _, d := range o.deployments {
			c := d.Spec.Template.Spec.Containers[0]
			for _, e := range c.Env {
				sets = append(sets, setter{set + ": " + d.Name, e.Name})
			}
			env := stageEnv(t, o, d)
			// configcheck checks the delivery path as the command does:
			// a fast-lane deliverer needs the brokers and topics, and
			// consume is refused while the fast lane is on.
			envs = append(envs, checkEnv{set + ": " + d.Name, c.Args[0], env})
		}
		for _, j := range o.jobs {
			c := j.Spec.Template.Spec.Containers[0]
			env := map[string]string{}
			for _, e := range c.Env {
				sets = append(sets, setter{set + ": " + j.Name, e.Name})
				env[e.Name] = e.Value
				if e.ValueFrom != nil {
					env[e.Name] = secretPlaceholder(e.Name)
				}
			}
			envs = append(envs, checkEnv{set + ": " + j.Name, c.Args[0], env})
		}
	}
	resp := configCheck(t, envs)
	known := map[string]bool{}
	for _, v := range append(resp.Vars, resp.TracingVars...) {
		known[v] = true
	}
	for v, why := range pendingVars {
		if known[v] {
			t.Logf("%s (%s) is read by internal/config now: remove it from pendingVars", v, why)
		}
	}
	for _, s := range sets {
		if !known[s.name] && pendingVars[s.name] == "" {
			t.Errorf("%s sets %s, which the bridge does not read (config.Vars and config.TracingVars)", s.who, s.name)
		}
	}
	for i, r := range resp.Results {
		if r.Error != "" {
			t.Errorf("%s (bridge %s): its environment does not load: %s", r.Name, envs[i].Command, r.Error)
		}
	}
}

// Secrets reach the pods that need them, by secretKeyRef only: never in the
// ConfigMap, never as a literal. With the fast lane the deliverers are Kafka
// clients too: they get the SASL credentials and the TLS Secret.
func TestChartSecrets(t *testing.T) {
	for _, c := range []struct {
		file    string
		deliver []string
	}{
		{"ci/all-options-values.yaml", []string{"DATABASE_URL", "ADMIN_TOKEN", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "BRIDGE_SECRET_KEYS"}},
		{"ci/all-options-values.yaml+ci/row-engine-values.yaml", []string{"DATABASE_URL", "ADMIN_TOKEN", "BRIDGE_SECRET_KEYS"}},
	} {
		t.Run(setName(c.file), func(t *testing.T) { checkChartSecrets(t, c.file, c.deliver) })
	}
}

func checkChartSecrets(t *testing.T, file string, deliverSecrets []string) {
	o := decodeAll(t, mustRender(t, file))
	secretVars := []string{"DATABASE_URL", "ADMIN_TOKEN", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "BRIDGE_SECRET_KEYS"}
	for _, cm := range o.configMaps {
		for _, v := range secretVars {
			if _, ok := cm.Data[v]; ok {
				t.Errorf("ConfigMap %s holds %s", cm.Name, v)
			}
		}
	}
	want := map[string][]string{
		"relay":   {"DATABASE_URL", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"},
		"consume": {"DATABASE_URL", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"},
		"deliver": deliverSecrets,
	}
	for _, d := range o.deployments {
		stage := component(d.Labels)
		c := d.Spec.Template.Spec.Containers[0]
		var got []string
		for _, e := range c.Env {
			if slices.Contains(secretVars, e.Name) {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name == "" {
					t.Errorf("%s: %s is not from a Secret", d.Name, e.Name)
				}
				got = append(got, e.Name)
			}
		}
		if !slices.Equal(got, want[stage]) {
			t.Errorf("%s gets secrets %v, want %v", d.Name, got, want[stage])
		}
		// The Kafka TLS Secret is mounted where the KAFKA_TLS_*_FILE paths
		// point, in every pod that talks to Kafka (and only there).
		env := stageEnv(t, o, d)
		usesKafka := slices.Contains(got, "KAFKA_SASL_USERNAME")
		if !usesKafka && (len(c.VolumeMounts) != 0 || len(d.Spec.Template.Spec.Volumes) != 0) {
			t.Errorf("%s talks to no Kafka but mounts %v", d.Name, c.VolumeMounts)
		}
		if usesKafka {
			if len(c.VolumeMounts) != 1 || len(d.Spec.Template.Spec.Volumes) != 1 || d.Spec.Template.Spec.Volumes[0].Secret == nil {
				t.Fatalf("%s: kafka TLS Secret not mounted: %v", d.Name, c.VolumeMounts)
			}
			dir := c.VolumeMounts[0].MountPath
			for _, k := range []string{"KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"} {
				if !strings.HasPrefix(env[k], dir+"/") {
					t.Errorf("%s: %s=%q is not in the mounted %s", d.Name, k, env[k], dir)
				}
			}
		}
	}
	// The admin Service reaches the pods holding ADMIN_TOKEN.
	var admin *corev1.Service
	for _, s := range o.services {
		if component(s.Labels) == "admin" {
			admin = s
		}
	}
	if admin == nil {
		t.Fatal("no admin Service")
	}
	for _, d := range o.deployments {
		hasToken := slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "ADMIN_TOKEN" })
		if labels.SelectorFromSet(admin.Spec.Selector).Matches(podLabels(d)) != hasToken {
			t.Errorf("admin Service selects %s: %v; it has ADMIN_TOKEN: %v", d.Name, !hasToken, hasToken)
		}
	}
}

// KEDA: the consumer group's members on its lag (consume, or deliver with
// the fast lane), the row engine's deliverers and the relays on their
// backlog through Prometheus, each within what the stage can use.
func TestChartAutoscaling(t *testing.T) {
	t.Parallel()
	o := decodeAll(t, mustRender(t, ""))
	if len(o.scaledObjects) != 0 || len(o.serviceMonitors) != 0 {
		t.Errorf("defaults render %d ScaledObjects and %d ServiceMonitors: both are off by default", len(o.scaledObjects), len(o.serviceMonitors))
	}
	for _, file := range []string{"ci/all-options-values.yaml", "ci/all-options-values.yaml+ci/row-engine-values.yaml"} {
		t.Run(setName(file), func(t *testing.T) { checkChartAutoscaling(t, file) })
	}
}

func checkChartAutoscaling(t *testing.T, file string) {
	all := valuesFile(t, file)
	partitions := int32(all["kafka"].(map[string]any)["partitions"].(float64))
	fast := fastLane(t, file)
	o := decodeAll(t, mustRender(t, file))
	deployments := map[string]*appsv1.Deployment{}
	for _, d := range o.deployments {
		deployments[d.Name] = d
	}
	byStage := map[string]*kedav1alpha1.ScaledObject{}
	for _, so := range o.scaledObjects {
		d := deployments[so.Spec.ScaleTargetRef.Name]
		if d == nil {
			t.Errorf("ScaledObject %s scales %q, which is not a rendered Deployment", so.Name, so.Spec.ScaleTargetRef.Name)
			continue
		}
		if d.Spec.Replicas != nil {
			t.Errorf("%s sets replicas while KEDA scales it: every upgrade would reset KEDA's count", d.Name)
		}
		byStage[component(d.Labels)] = so
		if so.Spec.MinReplicaCount == nil || so.Spec.MaxReplicaCount == nil || *so.Spec.MinReplicaCount > *so.Spec.MaxReplicaCount || *so.Spec.MinReplicaCount < 1 {
			t.Errorf("%s: replicas %v..%v", so.Name, so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
		}
		if len(so.Spec.Triggers) != 1 {
			t.Fatalf("%s: %d triggers", so.Name, len(so.Spec.Triggers))
		}
	}
	limits := map[string]int32{"relay": 64, "consume": partitions, "deliver": 1 << 30}
	triggers := map[string]string{"relay": "prometheus", "consume": "kafka", "deliver": "prometheus"}
	if fast {
		// No consumer; the deliverers are the group's members.
		delete(triggers, "consume")
		limits["deliver"] = partitions
		triggers["deliver"] = "kafka"
	}
	for stage, so := range byStage {
		if triggers[stage] == "" {
			t.Errorf("%s scales %s, which this layout does not run", so.Name, stage)
			continue
		}
		if *so.Spec.MaxReplicaCount > limits[stage] {
			t.Errorf("%s: maxReplicaCount %d above what the stage can use (%d)", so.Name, *so.Spec.MaxReplicaCount, limits[stage])
		}
		tr := so.Spec.Triggers[0]
		if tr.Type != triggers[stage] {
			t.Errorf("%s: trigger %s, want %s", so.Name, tr.Type, triggers[stage])
		}
		switch tr.Type {
		case "kafka":
			cm := o.configMaps[0].Data
			if tr.Metadata["consumerGroup"] != cm["CONSUMER_GROUP"] || tr.Metadata["bootstrapServers"] != cm["KAFKA_BROKERS"] {
				t.Errorf("%s: kafka trigger %v reads another group or cluster than CONSUMER_GROUP=%s KAFKA_BROKERS=%s", so.Name, tr.Metadata, cm["CONSUMER_GROUP"], cm["KAFKA_BROKERS"])
			}
			if !slices.Contains(strings.Split(cm["CONSUMER_TOPICS"], ","), tr.Metadata["topic"]) {
				t.Errorf("%s: lag of topic %q, which is not consumed (%s)", so.Name, tr.Metadata["topic"], cm["CONSUMER_TOPICS"])
			}
			if tr.Metadata["allowIdleConsumers"] == "true" {
				t.Errorf("%s: allowIdleConsumers lets KEDA go past the partitions", so.Name)
			}
			if _, err := strconv.Atoi(tr.Metadata["lagThreshold"]); err != nil {
				t.Errorf("%s: lagThreshold %q", so.Name, tr.Metadata["lagThreshold"])
			}
		case "prometheus":
			if _, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil {
				t.Errorf("%s: threshold %q", so.Name, tr.Metadata["threshold"])
			}
			checkQuery(t, so.Name, tr.Metadata["query"])
			// It reads this release's Service only.
			if !strings.Contains(tr.Metadata["query"], fmt.Sprintf("service=%q", so.Spec.ScaleTargetRef.Name)) || !strings.Contains(tr.Metadata["query"], fmt.Sprintf("namespace=%q", namespace)) {
				t.Errorf("%s: query %s is not limited to this release's series", so.Name, tr.Metadata["query"])
			}
		}
	}
	for stage := range triggers {
		if byStage[stage] == nil {
			t.Errorf("all options on: no ScaledObject for %s", stage)
		}
	}
	// all-options asks for more deliverers than partitions: with the fast
	// lane KEDA's maximum is the partitions, without it what was asked.
	if so := byStage["deliver"]; so != nil {
		want := int32(all["deliver"].(map[string]any)["autoscaling"].(map[string]any)["maxReplicas"].(float64))
		if fast {
			want = min(want, partitions)
		}
		if *so.Spec.MaxReplicaCount != want {
			t.Errorf("%s: maxReplicaCount %d, want %d", so.Name, *so.Spec.MaxReplicaCount, want)
		}
	}
}

// Values Kubernetes would accept but the bridge could not use are refused
// at render time, naming the field.
//
// Without the values schema: these checks hold for a `helm install
// --skip-schema-validation` too (TestValuesSchema tests the schema).
func TestChartRefusesBadValues(t *testing.T) {
	ch := loadChart(t)
	ch.Schema = nil
	base := valuesFile(t, "")
	cases := []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"relay.replicas": 65}, "relay.replicas=65"},
		{map[string]any{"relay.autoscaling.maxReplicas": 100}, "relay.autoscaling.maxReplicas=100"},
		{map[string]any{"consume.replicas": 7}, "consume.replicas=7 exceeds kafka.partitions=6"},
		{map[string]any{"consume.autoscaling.maxReplicas": 12}, "consume.autoscaling.maxReplicas=12 exceeds kafka.partitions=6"},
		{map[string]any{"mode": "run", "run.replicas": 7}, "run.replicas=7"},
		{map[string]any{"terminationGracePeriodSeconds": 15}, "terminationGracePeriodSeconds=15 must be above the drain"},
		{map[string]any{"deliver.shutdownGrace": 60}, "terminationGracePeriodSeconds=60 must be above the drain"},
		{map[string]any{"secrets.database.name": ""}, "secrets.database.name"},
		{map[string]any{"secrets.secretKeys.name": ""}, "secrets.secretKeys.name: the Secret holding BRIDGE_SECRET_KEYS is required"},
		{map[string]any{"secrets.secretKeys.name": "", "deliver.enabled": false, "secrets.adminToken.name": "a"}, "secrets.secretKeys.name"},
		{map[string]any{"kafka.sasl.mechanism": "PLAIN"}, "secrets.kafkaSasl.name"},
		{map[string]any{"kafka.brokers": []any{}}, "kafka.brokers"},
		{map[string]any{"consume.topics": []any{}}, "consume.topics"},
		{map[string]any{"consume.topics": []any{}, "delivery.fastLane": false}, "consume.topics"},
		{map[string]any{"relay.enabled": false, "kafka.brokers": []any{}}, "kafka.brokers: relay and deliver (delivery.fastLane)"},
		{map[string]any{"deliver.replicas": 7}, "deliver.replicas=7 exceeds kafka.partitions=6"},
		{map[string]any{"config.WEBHOOK_FAST_LANE": "false"}, "config.WEBHOOK_FAST_LANE"},
		{map[string]any{"deliver.env.WEBHOOK_FAST_LANE": "false"}, "deliver.env.WEBHOOK_FAST_LANE"},
		{map[string]any{"admin.stage": "consume", "secrets.adminToken.name": "a"}, "admin.stage=consume"},
		{map[string]any{"deliver.autoscaling.enabled": true, "consume.topics": []any{"~assets.*"}}, "deliver.autoscaling.topic"},
		{map[string]any{"config.KAFKA_BROKERS": "x:1"}, "config.KAFKA_BROKERS"},
		{map[string]any{"config.HTTP_ADDR": ":1"}, "config.HTTP_ADDR"},
		{map[string]any{"mode": "all"}, "mode must be stages or run"},
		{map[string]any{"admin.stage": "migrate"}, "admin.stage"},
		{map[string]any{"kafka.tls.certKey": "tls.crt"}, "kafka.tls.certKey and kafka.tls.keyKey"},
		{map[string]any{"consume.autoscaling.enabled": true, "consume.topics": []any{"~assets.*"}}, "consume.autoscaling.topic"},
		{map[string]any{"relay.enabled": false, "consume.enabled": false, "deliver.enabled": false}, "no stage is enabled"},
	}
	for _, c := range cases {
		_, err := render(ch, with(base, c.set))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.set, err, c.want)
		}
	}
	// And the edges are accepted.
	for _, set := range []map[string]any{
		{"relay.replicas": 64, "consume.replicas": 6, "deliver.replicas": 6},
		{"terminationGracePeriodSeconds": 16},
		{"deliver.enabled": false, "kafka.brokers": []any{"k:9092"}},
		// A row-engine deliverer alone talks to no Kafka; past the
		// partitions it only adds claimers.
		{"delivery.fastLane": false, "relay.enabled": false, "consume.enabled": false, "kafka.brokers": []any{}},
		{"delivery.fastLane": false, "deliver.replicas": 7},
		{"delivery.fastLane": false, "admin.stage": "consume", "secrets.adminToken.name": "a"},
		// No stage signs or writes secrets: no key ring needed.
		{"deliver.enabled": false, "secrets.secretKeys.name": ""},
		// Plain text, said explicitly.
		{"secrets.secretKeys.name": "", "config.BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true"},
	} {
		if _, err := render(ch, with(base, set)); err != nil {
			t.Errorf("%v: %v", set, err)
		}
	}
}

// values.yaml is documented field by field: every setting (a key with a
// value) has a comment right above it, except inside blocks that are
// Kubernetes' own types (resources, security contexts) or the free-form
// config map, which their block's comment describes.
func TestValuesDocumented(t *testing.T) {
	ch := loadChart(t)
	var raw []byte
	for _, f := range ch.Raw {
		if f.Name == "values.yaml" {
			raw = f.Data
		}
	}
	native := []string{"resources", "podSecurityContext", "securityContext", "config"}
	type key struct {
		indent int
		name   string
	}
	var stack []key
	lines := strings.Split(string(raw), "\n")
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "- ") {
			continue
		}
		name, value, ok := strings.Cut(trimmed, ":")
		if !ok {
			t.Errorf("values.yaml:%d: %q is not a key", i+1, trimmed)
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		inNative := slices.ContainsFunc(stack, func(k key) bool { return slices.Contains(native, k.name) })
		stack = append(stack, key{indent, name})
		if strings.TrimSpace(value) == "" || inNative {
			continue // a block, or a field of a documented Kubernetes type
		}
		if !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") {
			t.Errorf("values.yaml:%d: %s has no comment", i+1, name)
		}
	}
}

// values.schema.json makes Helm refuse a misspelt or misplaced field (which
// it would otherwise ignore) and a value of the wrong kind, and it describes
// every field values.yaml has (the renders above validate the defaults and
// the all-options file against it).
func TestValuesSchema(t *testing.T) {
	ch := loadChart(t)
	if len(ch.Schema) == 0 {
		t.Fatal("the chart has no values.schema.json")
	}
	base := valuesFile(t, "")
	for _, c := range []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"relay.replica": 3}, "replica"},
		{map[string]any{"replicas": 3}, "replicas"},
		{map[string]any{"mode": "all-in-one"}, "mode"},
		{map[string]any{"consume.replicas": "two"}, "replicas"},
		{map[string]any{"kafka.sasl.mechanism": "GSSAPI"}, "mechanism"},
		{map[string]any{"deliver.autoscaling.minReplicas": 0}, "minReplicas"},
		{map[string]any{"delivery.fastLane": "yes"}, "fastLane"},
		{map[string]any{"delivery.fastlane": true}, "fastlane"},
		{map[string]any{"config.LOG_LEVEL": map[string]any{"x": 1}}, "LOG_LEVEL"},
	} {
		_, err := render(ch, with(base, c.set))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want a schema error naming %q", c.set, err, c.want)
		}
	}
	// Every object field the schema declares is in values.yaml (or is one
	// of the documented optional ones), so the two describe the same tree.
	var schema map[string]any
	if err := json.Unmarshal(ch.Schema, &schema); err != nil {
		t.Fatal(err)
	}
	optional := map[string]bool{"relay.pdb.minAvailable": true, "consume.pdb.minAvailable": true, "deliver.pdb.minAvailable": true, "run.pdb.minAvailable": true}
	var walk func(path string, s map[string]any, v any)
	walk = func(path string, s map[string]any, v any) {
		props, _ := s["properties"].(map[string]any)
		vm, _ := v.(map[string]any)
		for k, sub := range props {
			p := strings.TrimPrefix(path+"."+k, ".")
			val, ok := vm[k]
			if !ok {
				if !optional[p] {
					t.Errorf("values.schema.json declares %s, which values.yaml does not have", p)
				}
				continue
			}
			walk(p, sub.(map[string]any), val)
		}
	}
	walk("", schema, ch.Values)
}
