package cli_test

import (
	"bytes"
	"io"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/cli"
)

// walk visits every command under c, c included.
func walk(c *cobra.Command, visit func(*cobra.Command)) {
	visit(c)
	for _, sub := range c.Commands() {
		walk(sub, visit)
	}
}

// Every command shows an example in its help, and every example runs
// bridge.
func TestEveryCommandHasAnExample(t *testing.T) {
	t.Parallel()
	root := cli.NewRootForTest(io.Discard, io.Discard)
	n := 0
	walk(root, func(c *cobra.Command) {
		if c.Hidden || c.Name() == cobra.ShellCompRequestCmd || c.Name() == cobra.ShellCompNoDescRequestCmd {
			return
		}
		n++
		switch {
		case strings.TrimSpace(c.Example) == "":
			t.Errorf("%q has no Example", c.CommandPath())
		case !strings.Contains(c.Example, "bridge"):
			t.Errorf("%q: Example does not run bridge: %q", c.CommandPath(), c.Example)
		}
		if c.Runnable() && c.Short == "" {
			t.Errorf("%q has no Short description", c.CommandPath())
		}
	})
	if n < 30 {
		t.Fatalf("walked only %d commands", n)
	}
}

// Listings take -o json.
func TestListingsTakeOutputJSON(t *testing.T) {
	t.Parallel()
	root := cli.NewRootForTest(io.Discard, io.Discard)
	walk(root, func(c *cobra.Command) {
		switch c.Name() {
		case "list", "failed", "stats", "attempts", "show":
			f := c.Flags().Lookup("output")
			if f == nil || f.Shorthand != "o" {
				t.Errorf("%q lists things without -o/--output", c.CommandPath())
			}
		}
	})
}

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

// helpGroups parses `bridge --help` into its sections' command names.
func helpGroups(help string) map[string][]string {
	groups := map[string][]string{}
	section := ""
	for _, line := range strings.Split(help, "\n") {
		switch {
		case line == "":
			section = ""
		case !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":"):
			section = strings.TrimSuffix(line, ":")
		case section != "" && strings.HasPrefix(line, "  "):
			if f := strings.Fields(line); len(f) > 0 {
				groups[section] = append(groups[section], f[0])
			}
		}
	}
	return groups
}

func TestHelpGroupsCommands(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, "--help")
	if code != 0 || errOut != "" {
		t.Fatalf("bridge --help: exit %d, stderr %q", code, errOut)
	}
	groups := helpGroups(out)
	want := map[string][]string{
		"Run":     {"consume", "deliver", "demo", "relay", "run"},
		"Operate": {"audit", "deliveries", "outbox", "secrets", "subscriptions"},
	}
	for g, cmds := range want {
		got := slices.Clone(groups[g])
		sort.Strings(got)
		if !slices.Equal(got, cmds) {
			t.Errorf("%s: lists %v, want %v", g, got, cmds)
		}
	}
	for _, c := range []string{"migrate", "config", "version", "completion", "help"} {
		if !slices.Contains(groups["Setup"], c) {
			t.Errorf("Setup: %v lacks %s", groups["Setup"], c)
		}
	}
	if extra := groups["Additional Commands"]; len(extra) > 0 {
		t.Errorf("commands outside the groups: %v", extra)
	}
	for _, s := range []string{"Exit status: 0 ok, 1 runtime failure, 2 usage or configuration error.", "Examples:"} {
		if !strings.Contains(out, s) {
			t.Errorf("bridge --help does not say %q", s)
		}
	}
	// A subcommand's help shows its example.
	_, out, _ = run(t, "help", "outbox", "replay")
	if !strings.Contains(out, "Examples:") || !strings.Contains(out, "bridge outbox replay --all-failed") {
		t.Errorf("bridge help outbox replay shows no example:\n%s", out)
	}
}

func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	for shell, marker := range map[string]string{
		"bash":       "__start_bridge",
		"zsh":        "#compdef bridge",
		"fish":       "complete -c bridge",
		"powershell": "Register-ArgumentCompleter",
	} {
		code, out, errOut := run(t, "completion", shell)
		if code != 0 || errOut != "" {
			t.Errorf("bridge completion %s: exit %d, stderr %q", shell, code, errOut)
			continue
		}
		if !strings.Contains(out, marker) || len(out) < 1000 {
			t.Errorf("bridge completion %s printed %d bytes without %q", shell, len(out), marker)
		}
	}
	// The scripts complete subcommands through the hidden __complete.
	code, out, _ := run(t, "__complete", "sub")
	if code != 0 || !strings.Contains(out, "subscriptions") {
		t.Errorf("__complete sub: exit %d, %q", code, out)
	}
	if code, _, _ := run(t, "completion", "tcsh"); code != 2 {
		t.Errorf("bridge completion tcsh: exit %d, want 2 (usage)", code)
	}
}

// Below the root, a word that names no subcommand is a usage error (exit
// 2, with a suggestion), not the parent's help with exit 0.
func TestUnknownSubcommandExitsTwo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"outbox", "statz"}, {"subscriptions", "lst"}, {"deliveries", "nope"}, {"bench", "x"}, {"completion", "tcsh"},
	} {
		code, out, errOut := run(t, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, `unknown command "`+args[1]+`"`) {
			t.Errorf("bridge %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errOut)
		}
	}
	if _, _, errOut := run(t, "outbox", "statz"); !strings.Contains(errOut, `did you mean "stats"?`) {
		t.Errorf("no suggestion: %q", errOut)
	}
	// The parent alone still shows its help.
	if code, out, _ := run(t, "outbox"); code != 0 || !strings.Contains(out, "Available Commands:") {
		t.Errorf("bridge outbox: exit %d:\n%s", code, out)
	}
}
