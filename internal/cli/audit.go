package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/config"
)

func init() { register(newAuditCmd) }

func newAuditCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "audit",
		GroupID: groupOperate,
		Short:   "The audit log: who replayed, revived, rotated, disabled or deleted what, from the console and the admin API",
		Long: `Every state-changing action taken in the console (/ui/) or through the admin
API (/api/v1/): who (the admin token's id, token:<first 8 hex of its SHA-256>),
when, from where, what, its scope, and how many rows it changed. Never payloads
or secrets.`,
		Example: `  bridge audit list
  bridge audit list -o json --limit 200`,
	}
	c.AddCommand(newAuditListCmd())
	return c
}

func newAuditListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [--limit N] [--cursor CURSOR]",
		Short: "List audited actions, newest first, a page at a time",
		Example: `  bridge audit list
  bridge audit list --cursor 1234      # next page (the command is printed by the previous one)
  bridge audit list -o json`,
		Args: cobra.NoArgs,
	}
	limit := c.Flags().Int("limit", 50, "entries per page (1-1000)")
	cursor := c.Flags().String("cursor", "", "next_cursor of the previous page")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *limit < 1 || *limit > 1000 {
			return UsageErrorf("--limit %d: must be between 1 and 1000", *limit)
		}
		if *cursor != "" {
			if n, err := strconv.ParseInt(*cursor, 10, 64); err != nil || n <= 0 {
				return UsageErrorf("--cursor %q is not a cursor printed by a previous page", *cursor)
			}
		}
		return withDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) error {
			es, next, err := audit.List(cmd.Context(), pool, *limit, *cursor)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out == "json" {
				if es == nil {
					es = []audit.Entry{}
				}
				return printList(w, es, next)
			}
			rows := make([][]string, len(es))
			for i, e := range es {
				rows[i] = []string{strconv.FormatInt(e.ID, 10), e.At.UTC().Format("2006-01-02 15:04:05Z"), e.Actor, e.Via, e.Remote,
					e.Action, e.Target, oneLineCut(e.Scope, 60), strconv.FormatInt(e.Rows, 10)}
			}
			if err := printTable(w, []string{"ID", "AT", "WHO", "VIA", "FROM", "ACTION", "TARGET", "SCOPE", "ROWS"}, rows); err != nil {
				return err
			}
			if next != "" {
				args := []string{"bridge", "audit", "list"}
				if cmd.Flags().Changed("limit") {
					args = append(args, "--limit", strconv.Itoa(*limit))
				}
				fmt.Fprintf(w, "\nmore: %s\n", strings.Join(append(args, "--cursor", next), " "))
			}
			return nil
		})
	})
	return c
}
