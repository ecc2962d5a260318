package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// polishTree finishes the command tree once every command is added:
// cobra's help and completion commands get examples, and a parent command
// given an unknown subcommand fails with exit 2 instead of printing its
// help and exiting 0.
func polishTree(root *cobra.Command) {
	addBuiltinExamples(root)
	for _, c := range root.Commands() {
		strictParents(c)
	}
}

// addBuiltinExamples creates cobra's help and completion commands now
// rather than at Execute (cobra adds them lazily and keeps ones that
// exist), so they carry examples like every other command and the command
// tree a test walks is the one users get.
func addBuiltinExamples(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	examples := map[string]string{
		"help": `  bridge help outbox replay`,
		"completion": `  source <(bridge completion bash)
  bridge completion zsh > "${fpath[1]}/_bridge"
  bridge completion fish > ~/.config/fish/completions/bridge.fish`,
		"completion bash": `  source <(bridge completion bash)                        # this shell
  bridge completion bash > /etc/bash_completion.d/bridge  # every new shell`,
		"completion zsh":        `  bridge completion zsh > "${fpath[1]}/_bridge"   # then start a new shell`,
		"completion fish":       `  bridge completion fish > ~/.config/fish/completions/bridge.fish`,
		"completion powershell": `  bridge completion powershell | Out-String | Invoke-Expression`,
	}
	for _, c := range root.Commands() {
		if ex, ok := examples[c.Name()]; ok && c.Example == "" {
			c.Example = ex
		}
		for _, sub := range c.Commands() {
			if ex, ok := examples[c.Name()+" "+sub.Name()]; ok && sub.Example == "" {
				sub.Example = ex
			}
		}
	}
}

// strictParents makes c (and the parents under it) refuse arguments that
// name no subcommand. Cobra checks unknown commands only at the root: below
// it, `bridge outbox statz` printed the outbox help and exited 0, which a
// script reads as success.
func strictParents(c *cobra.Command) {
	if !c.HasSubCommands() {
		return
	}
	if !c.Runnable() {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if cmd.SuggestionsMinimumDistance <= 0 {
				cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only on the root
			}
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				for i := range s {
					s[i] = strconv.Quote(s[i])
				}
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return UsageErrorf("%s", msg)
		}
	}
	for _, sub := range c.Commands() {
		strictParents(sub)
	}
}
