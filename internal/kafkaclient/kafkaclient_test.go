package kafkaclient_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/kafkatest"
)

// newClient builds a client from Options without contacting any broker
// (franz-go connects lazily), so the test can read the options back.
func newClient(t *testing.T, cfg config.Kafka) *kgo.Client {
	t.Helper()
	opts, err := kafkaclient.Options(cfg, nil)
	if err != nil {
		t.Fatalf("Options: %v", err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func saslMechanisms(cl *kgo.Client) []string {
	var names []string
	for _, v := range cl.OptValues(kgo.SASL) {
		if ms, ok := v.([]sasl.Mechanism); ok {
			for _, m := range ms {
				names = append(names, m.Name())
			}
		}
	}
	return names
}

func requireVarError(t *testing.T, err error, variable string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Options succeeded, want an error naming %s", variable)
	}
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Var != variable {
		t.Fatalf("error %q (%T) does not name %s", err, err, variable)
	}
	if !strings.HasPrefix(err.Error(), variable) || strings.Contains(err.Error(), "\n") {
		t.Errorf("message %q is not one line starting with %s", err, variable)
	}
}

func TestOptionsSASLMechanisms(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			cl := newClient(t, config.Kafka{
				Brokers:       []string{"127.0.0.1:9092"},
				ClientID:      "bridge-test",
				SASLMechanism: mech,
				SASLUsername:  "u",
				SASLPassword:  "p",
			})
			if got := saslMechanisms(cl); len(got) != 1 || got[0] != mech {
				t.Errorf("SASL mechanisms = %v, want [%s]", got, mech)
			}
			if got := cl.OptValue(kgo.ClientID); got != "bridge-test" {
				t.Errorf("client id = %v, want bridge-test", got)
			}
		})
	}
}

func TestOptionsWithoutSASLOrTLS(t *testing.T) {
	t.Parallel()
	cl := newClient(t, config.Kafka{Brokers: []string{"127.0.0.1:9092"}, ClientID: "c"})
	if got := saslMechanisms(cl); len(got) != 0 {
		t.Errorf("SASL mechanisms = %v, want none", got)
	}
	if tc, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config); tc != nil {
		t.Errorf("TLS config set without KAFKA_TLS: %+v", tc)
	}
	if got := cl.OptValue(kgo.SeedBrokers); got == nil || !strings.Contains(strings.Join(got.([]string), ","), "127.0.0.1:9092") {
		t.Errorf("seed brokers = %v", got)
	}
}

func TestOptionsBadInputNamesVariable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("this is not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := newCA(t)
	caFile := ca.writeCert(t, dir)
	tests := []struct {
		name     string
		cfg      config.Kafka
		variable string
		fragment string
	}{
		{"unknown mechanism", config.Kafka{SASLMechanism: "GSSAPI", SASLUsername: "u", SASLPassword: "p"}, "KAFKA_SASL_MECHANISM", "GSSAPI"},
		{"lower-case mechanism", config.Kafka{SASLMechanism: "plain", SASLUsername: "u", SASLPassword: "p"}, "KAFKA_SASL_MECHANISM", "PLAIN"},
		{"missing CA file", config.Kafka{TLS: true, TLSCAFile: filepath.Join(dir, "nope.pem")}, "KAFKA_TLS_CA_FILE", "nope.pem"},
		{"CA file without PEM", config.Kafka{TLS: true, TLSCAFile: notPEM}, "KAFKA_TLS_CA_FILE", "no PEM certificate"},
		{"client cert without its key", config.Kafka{TLS: true, TLSCAFile: caFile, TLSCertFile: caFile, TLSKeyFile: filepath.Join(dir, "missing.key")}, "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.cfg.Brokers = []string{"127.0.0.1:9092"}
			_, err := kafkaclient.Options(tt.cfg, nil)
			requireVarError(t, err, tt.variable)
			if !strings.Contains(err.Error(), tt.fragment) {
				t.Errorf("message %q does not mention %q", err, tt.fragment)
			}
		})
	}
}

func TestOptionsTLSLoadsGeneratedCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	caFile := ca.writeCert(t, dir)
	clientCert, clientKey := ca.issue(t, "bridge-client", nil).write(t, dir, "client")

	cl := newClient(t, config.Kafka{
		Brokers:     []string{"kafka-1.internal:9093", "kafka-2.internal:9093"},
		ClientID:    "c",
		TLS:         true,
		TLSCAFile:   caFile,
		TLSCertFile: clientCert,
		TLSKeyFile:  clientKey,
	})
	tc, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config)
	if tc == nil {
		t.Fatal("no TLS config with KAFKA_TLS=true")
	}
	if tc.ServerName != "kafka-1.internal" {
		t.Errorf("ServerName = %q, want the first broker's host", tc.ServerName)
	}
	if tc.InsecureSkipVerify {
		t.Error("InsecureSkipVerify set without KAFKA_TLS_INSECURE_SKIP_VERIFY")
	}
	if tc.MinVersion < tls.VersionTLS12 {
		t.Errorf("MinVersion = %x, want TLS 1.2 or newer", tc.MinVersion)
	}
	if len(tc.Certificates) != 1 {
		t.Fatalf("%d client certificates, want 1", len(tc.Certificates))
	}
	// The pool trusts exactly what the CA signed.
	server := ca.issue(t, "kafka-1.internal", nil)
	if _, err := server.leaf.Verify(x509.VerifyOptions{Roots: tc.RootCAs, DNSName: "kafka-1.internal"}); err != nil {
		t.Errorf("a certificate signed by the CA does not verify against RootCAs: %v", err)
	}
	other := newCA(t).issue(t, "kafka-1.internal", nil)
	if _, err := other.leaf.Verify(x509.VerifyOptions{Roots: tc.RootCAs, DNSName: "kafka-1.internal"}); err == nil {
		t.Error("a certificate from another CA verifies against RootCAs")
	}

	override := newClient(t, config.Kafka{Brokers: []string{"10.0.0.1:9093"}, ClientID: "c", TLS: true, TLSCAFile: caFile, TLSServerName: "kafka.example"})
	if tc, _ := override.OptValue(kgo.DialTLSConfig).(*tls.Config); tc == nil || tc.ServerName != "kafka.example" {
		t.Errorf("KAFKA_TLS_SERVER_NAME not applied: %+v", tc)
	}
}

// TestOptionsAuthenticateOverTLS proves the options actually work: a kfake
// cluster that requires TLS (certificate from a generated CA) and SASL
// accepts a client built from Options with the right CA and credentials, for
// each mechanism, and refuses a wrong password or an untrusted CA.
func TestOptionsAuthenticateOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newCA(t)
	caFile := ca.writeCert(t, dir)
	serverCert := ca.issue(t, "localhost", []net.IP{net.IPv4(127, 0, 0, 1)})
	otherCAFile := newCA(t).writeCert(t, t.TempDir())

	cluster := kafkatest.Fake(t,
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serverCert.tlsCert()}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "plain-user", "plain-pass"),
		kfake.Superuser("SCRAM-SHA-256", "scram256-user", "scram256-pass"),
		kfake.Superuser("SCRAM-SHA-512", "scram512-user", "scram512-pass"),
		kfake.SeedTopics(1, "auth-check"),
	)
	brokers := cluster.ListenAddrs()

	tests := []struct {
		name       string
		mech       string
		user, pass string
		caFile     string
		wantOK     bool
	}{
		{"PLAIN", "PLAIN", "plain-user", "plain-pass", caFile, true},
		{"SCRAM-SHA-256", "SCRAM-SHA-256", "scram256-user", "scram256-pass", caFile, true},
		{"SCRAM-SHA-512", "SCRAM-SHA-512", "scram512-user", "scram512-pass", caFile, true},
		{"wrong password", "PLAIN", "plain-user", "nope", caFile, false},
		{"wrong SCRAM password", "SCRAM-SHA-512", "scram512-user", "nope", caFile, false},
		{"untrusted CA", "PLAIN", "plain-user", "plain-pass", otherCAFile, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts, err := kafkaclient.Options(config.Kafka{
				Brokers:       brokers,
				ClientID:      "bridge-test",
				TLS:           true,
				TLSCAFile:     tt.caFile,
				SASLMechanism: tt.mech,
				SASLUsername:  tt.user,
				SASLPassword:  tt.pass,
			}, nil)
			if err != nil {
				t.Fatalf("Options: %v", err)
			}
			cl, err := kgo.NewClient(append(opts, kgo.RequestRetries(0))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = cl.Ping(ctx)
			if tt.wantOK && err != nil {
				t.Fatalf("Ping with %s over TLS: %v", tt.mech, err)
			}
			if !tt.wantOK && err == nil {
				t.Fatalf("Ping succeeded, want a refusal")
			}
			if !tt.wantOK {
				t.Logf("refused as expected: %v", err)
				return
			}
			// Beyond the handshake: an authenticated request is served.
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "auth-check", Value: []byte(tt.mech)}).FirstErr(); err != nil {
				t.Errorf("produce after authenticating: %v", err)
			}
		})
	}
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

type issued struct {
	leaf *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	cert, der, key := signed(t, &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bridge test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	return &testCA{cert: cert, key: key, der: der}
}

// signed makes a P-256 key and a certificate for it from tmpl, signed with
// parentKey as parent (parent nil: self-signed).
func signed(t *testing.T, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, []byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, der, key
}

func (ca *testCA) writeCert(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "ca-*.pem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pem.Encode(f, &pem.Block{Type: "CERTIFICATE", Bytes: ca.der}); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

func (ca *testCA) issue(t *testing.T, name string, ips []net.IP) *issued {
	t.Helper()
	leaf, der, key := signed(t, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, ca.cert, ca.key)
	return &issued{leaf: leaf, der: der, key: key}
}

func (c *issued) tlsCert() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.der}, PrivateKey: c.key, Leaf: c.leaf}
}

func (c *issued) write(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	keyDER, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
