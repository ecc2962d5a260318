// Command configcheck lets a Go module other than this one check deployment
// manifests against internal/config without importing it: importing would
// tie that module's go.mod to this one's, so every dependency bump here
// would break its build until it is tidied too. tools/deploytest (the Helm
// chart's tests) runs it as
//
//	go run ./internal/config/configcheck < request.json
//
// with a request naming environments and the bridge command each is for:
//
//	{"environments": [{"name": "bridge-relay", "command": "relay", "env": {"DATABASE_URL": "…"}}]}
//
// and gets back the variables the bridge reads and, per environment, the
// error config.Load (with that command's needs) and the tracing setup give
// it, "" when it loads:
//
//	{"vars": ["LOG_LEVEL", …], "tracing_vars": ["OTEL_SERVICE_NAME", …], "results": [{"name": "bridge-relay", "error": ""}]}
//
// Exit status 2 for a request it cannot read (or an unknown command).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/tracing"
)

type request struct {
	Environments []struct {
		Name    string            `json:"name"`
		Command string            `json:"command"`
		Env     map[string]string `json:"env"`
	} `json:"environments"`
}

type result struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

type response struct {
	Vars        []string `json:"vars"`
	TracingVars []string `json:"tracing_vars"`
	Results     []result `json:"results"`
}

func check(in io.Reader) (response, error) {
	var req request
	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return response{}, fmt.Errorf("request: %w", err)
	}
	resp := response{Vars: config.Vars(), TracingVars: config.TracingVars, Results: []result{}}
	for _, e := range req.Environments {
		n, ok := config.CommandNeeds[e.Command]
		if !ok {
			return response{}, fmt.Errorf("environment %q: unknown command %q", e.Name, e.Command)
		}
		r := result{Name: e.Name}
		if _, err := config.Load(e.Env, n); err != nil {
			r.Error = err.Error()
		} else if _, err := tracing.ConfigFromEnv(func(k string) string { return e.Env[k] }, "outbox-bridge"); err != nil {
			r.Error = err.Error()
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func main() {
	resp, err := check(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "configcheck:", err)
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(resp); err != nil {
		fmt.Fprintln(os.Stderr, "configcheck:", err)
		os.Exit(1)
	}
}
