package kafkaclient_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// runGroupClient joins a consumer group on a kfake cluster and produces a
// record, which makes franz-go log its INFO lines (group management,
// assignments), and returns what reached a LOG_LEVEL=info log.
func runGroupClient(t *testing.T, kafkaLogLevel string) string {
	t.Helper()
	var logs testkit.LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	brokers := kafkatest.Fake(t).ListenAddrs()
	opts, err := kafkaclient.Options(config.Kafka{Brokers: brokers, ClientID: "t", LogLevel: kafkaLogLevel}, logger)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no record consumed within 20s")
		}
		if fs.NumRecords() > 0 {
			break
		}
	}
	cl.Close()
	return logs.String()
}

// franz-go's INFO lines are our DEBUG by default, so LOG_LEVEL=info is not
// flooded with heartbeats and rebalances; KAFKA_LOG_LEVEL=info brings them
// back at INFO, and none silences the client.
func TestClientInfoIsOurDebugUnlessKafkaLogLevel(t *testing.T) {
	t.Parallel()
	if out := runGroupClient(t, ""); strings.Contains(out, "component=kgo") {
		t.Errorf("default: client lines at LOG_LEVEL=info:\n%s", out)
	}
	out := runGroupClient(t, "info")
	if !strings.Contains(out, "level=INFO") || !strings.Contains(out, "component=kgo") {
		t.Errorf("KAFKA_LOG_LEVEL=info: no client INFO lines:\n%s", out)
	}
	if strings.Contains(out, "level=DEBUG") {
		t.Errorf("KAFKA_LOG_LEVEL=info with LOG_LEVEL=info wrote DEBUG lines:\n%s", out)
	}
}

// Each client level, one step down by default; at its own level with
// KAFKA_LOG_LEVEL, and nothing below that level.
func TestClientLogLevels(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kafkaLevel string
		client     kgo.LogLevel
		want       string // "" when the line is dropped
	}{
		{"", kgo.LogLevelError, "level=WARN"},
		{"", kgo.LogLevelWarn, "level=INFO"},
		{"", kgo.LogLevelInfo, "level=DEBUG"},
		{"", kgo.LogLevelDebug, ""}, // below DEBUG
		{"info", kgo.LogLevelInfo, "level=INFO"},
		{"info", kgo.LogLevelDebug, ""},
		{"debug", kgo.LogLevelDebug, "level=DEBUG"},
		{"error", kgo.LogLevelWarn, ""},
		{"error", kgo.LogLevelError, "level=ERROR"},
		{"none", kgo.LogLevelError, ""},
	} {
		var logs bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		opts, err := kafkaclient.Options(config.Kafka{Brokers: []string{"127.0.0.1:1"}, LogLevel: c.kafkaLevel}, logger)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		l := cl.OptValue(kgo.WithLogger).(kgo.Logger)
		logs.Reset()
		l.Log(c.client, "probe line")
		cl.Close()
		got := logs.String()
		line := ""
		for _, ln := range strings.Split(got, "\n") {
			if strings.Contains(ln, "probe line") {
				line = ln
			}
		}
		switch {
		case c.want == "" && line != "":
			t.Errorf("KAFKA_LOG_LEVEL=%q, client level %v: logged %q, want nothing", c.kafkaLevel, c.client, line)
		case c.want != "" && !strings.Contains(line, c.want):
			t.Errorf("KAFKA_LOG_LEVEL=%q, client level %v: logged %q, want %s", c.kafkaLevel, c.client, line, c.want)
		}
	}
}
