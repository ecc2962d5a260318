// Package cli implements the bridge command line: parse, wire, run. The
// behaviour lives in the packages it calls.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
)

// Exit codes, documented in docs/configuration.md.
const (
	ExitOK      = 0
	ExitRuntime = 1
	ExitUsage   = 2
)

// usageError marks errors that exit 2: bad flags, bad arguments, bad config.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// UsageErrorf returns an error that makes the command exit 2.
func UsageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// Command groups shown by `bridge --help`.
const (
	groupRun     = "run"
	groupOperate = "operate"
	groupSetup   = "setup"
)

// Execute runs the command line and returns the process exit status.
func Execute(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, stop := signalContext()
	defer stop()
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(stderr, "bridge: "+oneLine(err))
	var ue usageError
	var ce *config.Error
	switch {
	case errors.As(err, &ue), errors.As(err, &ce), isCobraUsageError(err):
		switch {
		case errors.As(err, &ce):
			// A configuration error is one line naming the variable.
		case isCobraUsageError(err) && cmd != nil:
			// Unknown command, flag or argument: show what the command
			// accepts (SilenceUsage keeps cobra from printing it itself).
			fmt.Fprint(stderr, "\n"+cmd.UsageString())
		default:
			fmt.Fprintln(stderr, "Run 'bridge --help' for usage.")
		}
		return ExitUsage
	default:
		return ExitRuntime
	}
}

func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", " ")
}

// Cobra reports unknown commands and argument-count errors as plain errors.
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires exactly", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// signalContext is cancelled on the first SIGINT/SIGTERM (graceful drain);
// a second signal exits at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
			return
		}
		<-ch
		os.Exit(130)
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "bridge",
		Short: "Outbox Bridge: PostgreSQL outbox → Kafka → webhooks, in order, traced end to end",
		Long: `Outbox Bridge carries domain events from an application's PostgreSQL
transaction to Kafka (keyed by asset, in commit order) and from Kafka to
subscribers' webhooks (Standard Webhooks signatures, per-(subscription, asset)
order, retries, dead letters), with one trace from the request to the handler.

Configuration comes from environment variables (see 'bridge config').
Exit status: 0 ok, 1 runtime failure, 2 usage or configuration error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Example: `  # apply migrations, then run everything in one process
  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge bridge migrate
  KAFKA_BROKERS=127.0.0.1:9092 CONSUMER_TOPICS=assets bridge run`,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddGroup(
		&cobra.Group{ID: groupRun, Title: "Run:"},
		&cobra.Group{ID: groupOperate, Title: "Operate:"},
		&cobra.Group{ID: groupSetup, Title: "Setup:"},
	)
	root.SetHelpCommandGroupID(groupSetup)
	root.SetCompletionCommandGroupID(groupSetup)
	for _, c := range commands() {
		root.AddCommand(c)
	}
	polishTree(root)
	return root
}

// registry of subcommand constructors; each file registers its own in init so
// the command list grows without editing this file.
var registry []func() *cobra.Command

func register(f func() *cobra.Command) { registry = append(registry, f) }

func commands() []*cobra.Command {
	out := make([]*cobra.Command, 0, len(registry))
	for _, f := range registry {
		out = append(out, f())
	}
	return out
}

// loadConfig reads the environment for a command.
func loadConfig(needs config.Needs) (*config.Config, error) {
	return config.Load(nil, needs)
}
