package contract_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
)

var ceConfig = &contract.CloudEvents{Source: "/outbox-bridge"}

func withCloudEvents(evs []contract.Event) []contract.Event {
	out := make([]contract.Event, len(evs))
	for i, ev := range evs {
		ev.CloudEvents = ceConfig
		ev.CreatedAt = time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
		if i == 0 {
			// A row header with the ce_ prefix must not shadow the bridge's.
			ev.Headers = map[string]string{"tenant": "acme", "ce_id": "forged", "ce_source": "elsewhere"}
		}
		out[i] = ev
	}
	return out
}

// TestKafkaRecordCloudEventsGolden pins the bytes of a record with
// RELAY_CLOUDEVENTS=binary: the bridge's headers unchanged and first, then
// the ce_* headers, then the row's own (minus any ce_* of its own).
func TestKafkaRecordCloudEventsGolden(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	for i, ev := range withCloudEvents(goldenEvents) {
		if i > 0 {
			out.WriteString("\n")
		}
		out.WriteString(dumpRecord(contract.Encode(ev)))
	}
	golden(t, "kafka_record_cloudevents.golden", []byte(out.String()))
}

// TestCloudEventsSDKReadsTheRecord decodes the records with the official
// CloudEvents Go SDK (binding.ToEvent, then the event's own validation),
// through a message that applies the Kafka protocol binding's binary-mode
// rules to the record: ce_-prefixed headers are attributes or extensions,
// content-type is datacontenttype, the value is the data.
func TestCloudEventsSDKReadsTheRecord(t *testing.T) {
	t.Parallel()
	for _, ev := range withCloudEvents(goldenEvents) {
		rec := contract.Encode(ev)
		got, err := binding.ToEvent(context.Background(), kafkaMessage{rec})
		if err != nil {
			t.Fatalf("%s: the SDK cannot read the record: %v", ev.DedupID, err)
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("%s: not a valid CloudEvent: %v", ev.DedupID, err)
		}
		subject := ""
		if ev.AssetID != nil {
			subject = *ev.AssetID
		}
		if got.SpecVersion() != "1.0" || got.ID() != ev.DedupID || got.Source() != "/outbox-bridge" || got.Type() != ev.EventType ||
			!got.Time().Equal(ev.CreatedAt) || got.Subject() != subject || got.DataContentType() != contract.ContentTypeJSON ||
			!bytes.Equal(got.Data(), ev.Payload) {
			t.Errorf("%s: SDK read %s", ev.DedupID, got)
		}
		// The bridge's own consumer still reads the record as before.
		if m, err := contract.Decode(rec); err != nil || m.DedupID != ev.DedupID || m.EventType != ev.EventType {
			t.Errorf("%s: Decode %+v, %v", ev.DedupID, m, err)
		}
	}
}

// kafkaMessage is a binding.Message over a Kafka record in binary mode.
type kafkaMessage struct{ rec *kgo.Record }

var ceSpecs = spec.WithPrefix(contract.CloudEventsPrefix)

func (m kafkaMessage) header(k string) (string, bool) {
	for _, h := range m.rec.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}

func (m kafkaMessage) ReadEncoding() binding.Encoding {
	if _, ok := m.header(contract.HeaderCESpecVersion); ok {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m kafkaMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m kafkaMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	sv, _ := m.header(contract.HeaderCESpecVersion)
	version := ceSpecs.Version(sv)
	if version == nil {
		return binding.ErrUnknownEncoding
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	for _, h := range m.rec.Headers {
		if h.Key == contract.HeaderContentType {
			if err := w.SetAttribute(version.AttributeFromKind(spec.DataContentType), string(h.Value)); err != nil {
				return err
			}
			continue
		}
		if attr := version.Attribute(h.Key); attr != nil {
			if err := w.SetAttribute(attr, string(h.Value)); err != nil {
				return err
			}
		} else if strings.HasPrefix(h.Key, contract.CloudEventsPrefix) {
			if err := w.SetExtension(strings.ToLower(strings.TrimPrefix(h.Key, contract.CloudEventsPrefix)), string(h.Value)); err != nil {
				return err
			}
		}
	}
	if err := w.SetData(bytes.NewReader(m.rec.Value)); err != nil {
		return err
	}
	return w.End(ctx)
}

func (m kafkaMessage) Finish(error) error { return nil }

func (m kafkaMessage) version() spec.Version {
	sv, _ := m.header(contract.HeaderCESpecVersion)
	return ceSpecs.Version(sv)
}

// GetAttribute and GetExtension make kafkaMessage a
// binding.MessageMetadataReader, as the SDK's own binding messages are.
func (m kafkaMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	attr := v.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	name := attr.PrefixedName()
	if k == spec.DataContentType {
		name = contract.HeaderContentType
	}
	if val, ok := m.header(name); ok {
		return attr, val
	}
	return attr, nil
}

func (m kafkaMessage) GetExtension(name string) interface{} {
	if val, ok := m.header(contract.CloudEventsPrefix + name); ok {
		return val
	}
	return nil
}
