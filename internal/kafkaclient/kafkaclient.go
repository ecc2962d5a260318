// Package kafkaclient turns the shared Kafka configuration (brokers, client
// id, TLS, SASL) into franz-go options, so the relay, the consumer and the
// admin commands all reach a production cluster the same way.
package kafkaclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxbridge/bridge/internal/config"
)

// Options returns the connection options every bridge Kafka client uses.
func Options(cfg config.Kafka, logger *slog.Logger) ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		// Dial failures must surface quickly so an outage is recognised as
		// one instead of looking like a slow broker.
		kgo.DialTimeout(5 * time.Second),
	}
	if logger != nil {
		opts = append(opts, kgo.WithLogger(newClientLogger(logger, cfg.LogLevel)))
	}
	if cfg.TLS {
		tc, err := tlsConfig(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	switch cfg.SASLMechanism {
	case "":
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}.AsSha512Mechanism()))
	default:
		return nil, &config.Error{Var: "KAFKA_SASL_MECHANISM", Value: cfg.SASLMechanism, Problem: "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"}
	}
	return opts, nil
}

func tlsConfig(cfg config.Kafka) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.TLSInsecureSkipVerify} //nolint:gosec // opt-in, documented as tests only
	if cfg.TLSServerName != "" {
		tc.ServerName = cfg.TLSServerName
	} else if len(cfg.Brokers) > 0 {
		if host, _, err := net.SplitHostPort(cfg.Brokers[0]); err == nil {
			tc.ServerName = host
		}
	}
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, &config.Error{Var: "KAFKA_TLS_CA_FILE", Value: cfg.TLSCAFile, Problem: fmt.Sprintf("cannot be read: %v", err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &config.Error{Var: "KAFKA_TLS_CA_FILE", Value: cfg.TLSCAFile, Problem: "holds no PEM certificate"}
		}
		tc.RootCAs = pool
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, &config.Error{Var: "KAFKA_TLS_CERT_FILE", Value: cfg.TLSCertFile, Problem: fmt.Sprintf("cannot be loaded with KAFKA_TLS_KEY_FILE: %v", err)}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
