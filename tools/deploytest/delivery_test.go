package deploytest

import (
	"strconv"
	"testing"

	"sigs.k8s.io/yaml"
)

// delivery.fastLane decides the layout. With it (the default) nothing of
// consume is rendered (`bridge consume` refuses to start with the fast lane)
// and the deliverers are members of the consumer group: brokers, topics and
// group reach them. Without it consume runs as before. Every workload is
// told which (WEBHOOK_FAST_LANE), so the bridge's own default never decides.
func TestChartDeliveryModes(t *testing.T) {
	for _, file := range valueSets {
		t.Run(setName(file), func(t *testing.T) {
			fast := fastLane(t, file)
			ms := mustRender(t, file)
			consumeObjects := 0
			for _, m := range ms {
				var obj struct {
					Metadata struct {
						Labels map[string]string `json:"labels"`
					} `json:"metadata"`
				}
				if err := yaml.Unmarshal(m.YAML, &obj); err != nil {
					t.Fatal(err)
				}
				if component(obj.Metadata.Labels) == "consume" {
					consumeObjects++
					if fast {
						t.Errorf("the fast lane renders %s %s", m.Kind, m.Name)
					}
				}
			}
			o := decodeAll(t, ms)
			if !fast && o.deployments[0].Spec.Template.Spec.Containers[0].Args[0] != "run" && consumeObjects == 0 {
				t.Error("the row engine renders no consume stage")
			}
			for _, d := range o.deployments {
				env := stageEnv(t, o, d)
				stage := d.Spec.Template.Spec.Containers[0].Args[0]
				if got, want := env["WEBHOOK_FAST_LANE"], strconv.FormatBool(fast); got != want {
					t.Errorf("%s: WEBHOOK_FAST_LANE=%q, want %q set explicitly", d.Name, got, want)
				}
				if fast && (stage == "deliver" || stage == "run") {
					for _, k := range []string{"KAFKA_BROKERS", "CONSUMER_TOPICS", "CONSUMER_GROUP"} {
						if env[k] == "" {
							t.Errorf("%s is a fast-lane member but gets no %s", d.Name, k)
						}
					}
				}
			}
			if fast {
				for _, so := range o.scaledObjects {
					if so.Spec.ScaleTargetRef.Name == releaseDeployment(o, "deliver") && so.Spec.Triggers[0].Type != "kafka" {
						t.Errorf("%s: fast-lane deliverers scale on a %s trigger, want the group's lag (kafka)", so.Name, so.Spec.Triggers[0].Type)
					}
				}
			}
		})
	}
}

// releaseDeployment is the name of the Deployment running stage, "" if none.
func releaseDeployment(o objects, stage string) string {
	for _, d := range o.deployments {
		if component(d.Labels) == stage {
			return d.Name
		}
	}
	return ""
}
