package kafkatest

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRealBrokerIsApacheKafka4 proves the broker the integration tests run
// against is Apache Kafka 4.x in KRaft mode, not kfake or another
// implementation: the ApiVersions answer maps to Kafka 4.x (franz-go's
// kversion guess), it advertises the KRaft metadata.version feature, and
// DescribeCluster returns a Kafka cluster id (a base64url UUID; kfake says
// "kfake").
func TestRealBrokerIsApacheKafka4(t *testing.T) {
	t.Parallel()
	brokers := RealBrokers(t)
	cl := Client(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	versions, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	if len(versions) == 0 {
		t.Fatal("ApiVersions: no broker answered")
	}
	for _, v := range versions.Sorted() {
		if v.Err != nil {
			t.Fatalf("ApiVersions from node %d: %v", v.NodeID, v.Err)
		}
		guess := v.VersionGuess()
		t.Logf("node %d: franz-go guesses Apache Kafka %s", v.NodeID, guess)
		if !strings.HasPrefix(guess, "v4.") {
			t.Errorf("node %d: ApiVersions maps to Kafka %q, want v4.x", v.NodeID, guess)
		}
		// Keys this product relies on, with the minimum max version a 4.x
		// broker has (ApiVersions v3+ is the flexible one with features;
		// DescribeCluster exists since 2.8; Produce v9+ / Fetch v12+ are
		// the flexible versions franz-go uses against 4.x).
		for _, k := range []struct {
			key    int16
			minMax int16
		}{
			{kmsg.ApiVersions.Int16(), 3},
			{kmsg.DescribeCluster.Int16(), 1},
			{kmsg.Produce.Int16(), 11},
			{kmsg.Fetch.Int16(), 16},
			{kmsg.Metadata.Int16(), 12},
		} {
			minV, maxV, ok := v.KeyVersions(k.key)
			t.Logf("node %d: %s v%d..v%d", v.NodeID, kmsg.NameForKey(k.key), minV, maxV)
			if !ok || maxV < k.minMax {
				t.Errorf("node %d: %s supported=%v max v%d, want at least v%d", v.NodeID, kmsg.NameForKey(k.key), ok, maxV, k.minMax)
			}
		}
		// Kafka 4.0 removed the pre-KIP-896 Fetch versions v0..v3.
		if minV, _ := v.KeyMinVersion(kmsg.Fetch.Int16()); minV < 4 {
			t.Errorf("node %d: Fetch min version v%d; Kafka 4.x dropped v0..v3", v.NodeID, minV)
		}
		var metadataVersion int16 = -1
		for _, f := range v.Raw().FinalizedFeatures {
			t.Logf("node %d: finalized feature %s=%d", v.NodeID, f.Name, f.MaxVersionLevel)
			if f.Name == "metadata.version" {
				metadataVersion = f.MaxVersionLevel
			}
		}
		if metadataVersion < 0 {
			t.Errorf("node %d: no finalized metadata.version feature: not a KRaft Kafka", v.NodeID)
		}
	}

	req := kmsg.NewPtrDescribeClusterRequest()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("DescribeCluster: %v", err)
	}
	if resp.ErrorCode != 0 {
		t.Fatalf("DescribeCluster: error code %d: %v", resp.ErrorCode, resp.ErrorMessage)
	}
	t.Logf("cluster id %q, controller %d, %d broker(s)", resp.ClusterID, resp.ControllerID, len(resp.Brokers))
	if len(resp.Brokers) == 0 {
		t.Error("DescribeCluster lists no brokers")
	}
	// A KRaft cluster id is a 16-byte UUID in unpadded base64url (22 chars).
	if raw, err := base64.RawURLEncoding.DecodeString(resp.ClusterID); err != nil || len(raw) != 16 {
		t.Errorf("cluster id %q is not a Kafka UUID (base64url of 16 bytes): %v", resp.ClusterID, err)
	}
}

// TestRealBrokerRoundTripsHeaders produces one record with a key, a value and
// three headers (one with an empty value, one binary, one repeated key) to a
// fresh topic and consumes it back byte for byte.
func TestRealBrokerRoundTripsHeaders(t *testing.T) {
	t.Parallel()
	brokers := RealBrokers(t)
	topic := CreateTopic(t, brokers, 1, nil)

	want := &kgo.Record{
		Topic: topic,
		Key:   []byte("asset-42"),
		Value: []byte(`{"event":"asset.version_created","version":7}`),
		Headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			{Key: "event-type", Value: []byte{}},
			{Key: "bin", Value: []byte{0x00, 0xff, 0x10, '\n'}},
		},
	}
	cl := Client(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, want).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	got := ConsumeAll(t, brokers, topic, 1, 30*time.Second)
	if len(got) != 1 {
		t.Fatalf("consumed %d records from %s, want 1", len(got), topic)
	}
	r := got[0]
	if !bytes.Equal(r.Key, want.Key) || !bytes.Equal(r.Value, want.Value) {
		t.Errorf("record key/value = %q/%q, want %q/%q", r.Key, r.Value, want.Key, want.Value)
	}
	if len(r.Headers) != len(want.Headers) {
		t.Fatalf("consumed %d headers %v, want %d %v", len(r.Headers), r.Headers, len(want.Headers), want.Headers)
	}
	for i, h := range want.Headers {
		if r.Headers[i].Key != h.Key || !bytes.Equal(r.Headers[i].Value, h.Value) {
			t.Errorf("header %d = %q:%q, want %q:%q", i, r.Headers[i].Key, r.Headers[i].Value, h.Key, h.Value)
		}
	}
	if r.Offset != 0 || r.Partition != 0 {
		t.Errorf("record at %d/%d, want the first record of partition 0", r.Partition, r.Offset)
	}
}
