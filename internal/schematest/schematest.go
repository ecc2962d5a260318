// Package schematest gives tests the real schema registry that
// scripts/services-up.sh runs (SERVICES=schema-registry: Apicurio Registry,
// Confluent-compatible API), starting it when it is not up, and Confluent's
// own Python client (confluent-kafka from PyPI) in a virtualenv, to read the
// bridge's records with a deserializer no one here wrote.
package schematest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// DefaultURL is where scripts/services-up.sh serves the registry's
// Confluent-compatible API.
const DefaultURL = "http://127.0.0.1:8081/apis/ccompat/v7"

var (
	startOnce sync.Once
	startErr  error
	startOut  string
)

// URL returns the registry's Confluent-compatible API (SCHEMA_REGISTRY_URL,
// default DefaultURL). When nothing answers at the default address it runs
// scripts/services-up.sh with SERVICES=schema-registry (the first run builds
// the registry with Maven, a few minutes). Under CI=true a registry that
// cannot be had fails the test; elsewhere it skips it.
func URL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("SCHEMA_REGISTRY_URL")
	if url != "" {
		if err := ping(url); err != nil {
			testkit.Unavailable(t, "the schema registry at SCHEMA_REGISTRY_URL="+url, "SERVICES=schema-registry scripts/services-up.sh", err)
		}
		return url
	}
	if ping(DefaultURL) == nil {
		return DefaultURL
	}
	startOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(RepoRoot(t), "scripts", "services-up.sh"))
		cmd.Env = append(os.Environ(), "SERVICES=schema-registry")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		startErr = cmd.Run()
		startOut = out.String()
	})
	if startErr == nil {
		startErr = ping(DefaultURL)
	}
	if startErr != nil {
		testkit.Unavailable(t, "the schema registry ("+DefaultURL+")", "SERVICES=schema-registry scripts/services-up.sh",
			fmt.Errorf("%v\n%s", startErr, tail(startOut, 3000)))
	}
	return DefaultURL
}

func ping(url string) error {
	// No keep-alive: a test's leak check must not find this connection.
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(strings.TrimRight(url, "/") + "/subjects")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /subjects: %s", resp.Status)
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// Topic is a topic name of the test's own (so its subject is too: the
// registry is shared and in memory, and a subject is never reused).
func Topic(t testing.TB) string {
	return "sr-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", ".") + "-" + uuid.NewString()[:8]
}

// RepoRoot is the repository's top directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the schematest source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ConfluentPythonVersion is the confluent-kafka release the proof runs with.
const ConfluentPythonVersion = "2.16.1"

var (
	pyOnce sync.Once
	pyBin  string
	pyErr  error
)

// ConfluentPython returns a python3 with confluent-kafka (its
// SchemaRegistryClient, JSONDeserializer and AvroDeserializer) installed, in a virtualenv under
// ${OUTBOX_BRIDGE_CACHE:-$HOME/.cache/outbox-bridge}, made on first use with
// pip from PyPI. Under CI=true a missing piece fails the test.
func ConfluentPython(t testing.TB) string {
	t.Helper()
	pyOnce.Do(func() { pyBin, pyErr = confluentPython() })
	if pyErr != nil {
		testkit.Unavailable(t, "python3 with confluent-kafka "+ConfluentPythonVersion, "python3 -m venv and pip (PyPI)", pyErr)
	}
	return pyBin
}

func confluentPython() (string, error) {
	cache := os.Getenv("OUTBOX_BRIDGE_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "outbox-bridge")
	}
	venv := filepath.Join(cache, "py-confluent-kafka-"+ConfluentPythonVersion)
	py := filepath.Join(venv, "bin", "python")
	check := exec.Command(py, "-c", "import confluent_kafka, jsonschema, httpx, fastavro; from confluent_kafka.schema_registry.json_schema import JSONDeserializer; from confluent_kafka.schema_registry.avro import AvroDeserializer; print(confluent_kafka.version()[0])")
	if out, err := check.CombinedOutput(); err == nil && strings.TrimSpace(string(out)) == ConfluentPythonVersion {
		return py, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "python3", "-m", "venv", venv).CombinedOutput(); err != nil {
		return "", fmt.Errorf("python3 -m venv %s: %v\n%s", venv, err, out)
	}
	pip := exec.CommandContext(ctx, filepath.Join(venv, "bin", "pip"), "install", "-q",
		"confluent-kafka[json,avro,schemaregistry]=="+ConfluentPythonVersion)
	if out, err := pip.CombinedOutput(); err != nil {
		return "", fmt.Errorf("pip install confluent-kafka[json,avro,schemaregistry]==%s: %v\n%s", ConfluentPythonVersion, err, tail(string(out), 3000))
	}
	if out, err := exec.Command(py, "-c", "from confluent_kafka.schema_registry.json_schema import JSONDeserializer; from confluent_kafka.schema_registry.avro import AvroDeserializer").CombinedOutput(); err != nil {
		return "", fmt.Errorf("confluent-kafka installed but its JSONDeserializer or AvroDeserializer does not import: %v\n%s", err, out)
	}
	return py, nil
}
